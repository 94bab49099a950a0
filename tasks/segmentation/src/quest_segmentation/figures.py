"""The prediction figure of a run: validation images, their labels and the model's segmentation."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


@torch.no_grad()
def prediction_figure(runner, count: int, path: Path, title: str) -> None:
    """The first ``count`` validation images (the same in every run): image, ground truth, prediction."""
    dataset = runner.test_dataloader.dataset
    palette = np.array(dataset.metainfo["palette"], dtype=np.uint8)
    model = runner.model.eval()
    fig, axes = plt.subplots(3, count, figsize=(1.6 * count, 5), squeeze=False)
    for i in range(min(count, len(dataset))):
        sample = dataset[i]
        pred = model.test_step({"inputs": [sample["inputs"]], "data_samples": [sample["data_samples"]]})[0]
        image = sample["inputs"].permute(1, 2, 0).numpy()[..., ::-1]  # BGR -> RGB
        truth = sample["data_samples"].gt_sem_seg.data[0].numpy()
        guess = pred.pred_sem_seg.data[0].cpu().numpy()
        for row, panel in enumerate((image, palette[np.clip(truth, 0, len(palette) - 1)] * (truth != 255)[..., None],
                                     palette[guess])):
            axes[row, i].imshow(panel)
            axes[row, i].axis("off")
    for row, name in enumerate(("image", "label", "prediction")):
        axes[row, 0].set_title(name, fontsize=8, loc="left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
