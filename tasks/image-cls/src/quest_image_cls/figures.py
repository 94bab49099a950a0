"""The attention-map figure of a run: images and the CLS token's last-block attention over patches."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from quest_image_cls.model import cls_attention  # noqa: E402


def fixed_examples(y: torch.Tensor, count: int) -> list[int]:
    """The first test image of each of the first ``count`` classes (the same images in every run)."""
    picks = []
    for c in range(int(y.max()) + 1):
        hits = (y == c).nonzero()
        if len(hits):
            picks.append(int(hits[0]))
        if len(picks) == count:
            break
    return picks


def attention_figure(model, x: torch.Tensor, y: torch.Tensor, count: int, path: Path, title: str, device) -> None:
    idx = fixed_examples(y, count)
    images = x[idx]
    attn = cls_attention(model, images.to(device)).cpu()
    attn = F.interpolate(attn[:, None], size=images.shape[-2:], mode="bilinear", align_corners=False)[:, 0]
    fig, axes = plt.subplots(2, len(idx), figsize=(1.6 * len(idx), 3.4), squeeze=False)
    for j in range(len(idx)):
        img = images[j].permute(1, 2, 0).squeeze(-1).numpy()
        axes[0][j].imshow(img, cmap="gray" if img.ndim == 2 else None)
        axes[1][j].imshow(img, cmap="gray" if img.ndim == 2 else None)
        axes[1][j].imshow(attn[j].numpy(), cmap="inferno", alpha=0.6)
        for ax in (axes[0][j], axes[1][j]):
            ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
