"""The ImageNet protocol numbers the field compares against: ImageNet-ReaL accuracy from ``<data root>/real.json``
and mCE normalised by AlexNet's published ImageNet-C errors."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from quest_image_cls import data as D
from quest_image_cls.experiment import alexnet_mce, real_accuracy
from quest_image_cls.task import ImageClsTask
from quest_sdk.task import RunContext
from quest_sdk.testing import gloo_workers

WNIDS = ["n01440764", "n01443537", "n01484850"]


def write_image(path, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(path)


class Always(nn.Module):
    """Predicts class ``c`` for every image."""

    def __init__(self, c: int):
        super().__init__()
        self.c = c

    def forward(self, x):
        logits = torch.zeros(len(x), 1000)
        logits[:, self.c] = 1
        return logits


@pytest.fixture
def val_with_real(tmp_path):
    """Six validation images (two per class) named as ImageNet's, and their ReaL labels."""
    for n in range(1, 7):
        write_image(tmp_path / "val" / WNIDS[(n - 1) // 2] / f"ILSVRC2012_val_{n:08d}.JPEG", seed=n)
    real = [[1], [], [0, 1], [2], [1, 2], [0]]  # image 2 has no ReaL label: left out
    (tmp_path / "real.json").write_text(json.dumps(real))
    return tmp_path


def test_real_accuracy_counts_the_images_with_labels(val_with_real):
    real = D.imagenet_real(val_with_real)
    dataset = D.imagenet(val_with_real, "val", D.eval_transform("imagenet", 16))
    cfg = ImageClsTask().make_config("tiny", {})
    everything = list(range(6))
    assert real_accuracy(Always(1), dataset, everything, real, cfg, "cpu") == pytest.approx(3 / 5)
    assert real_accuracy(Always(0), dataset, everything, real, cfg, "cpu") == pytest.approx(2 / 5)
    assert real_accuracy(Always(1), dataset, [0, 1], real, cfg, "cpu") == 1.0  # image 2 does not count


def test_real_accuracy_on_two_workers_equals_one_process(val_with_real, tmp_path):
    def sharded(rank):
        ctx = RunContext(tmp_path / f"rank{rank}", "quest", progress=False, rank=rank, world_size=2)
        dataset = D.imagenet(val_with_real, "val", D.eval_transform("imagenet", 16))
        return real_accuracy(Always(1), dataset, list(range(6)), D.imagenet_real(val_with_real),
                             ImageClsTask().make_config("tiny", {}), "cpu", ctx=ctx)

    assert gloo_workers(sharded, 2) == {0: pytest.approx(3 / 5), 1: pytest.approx(3 / 5)}


def test_real_labels_must_cover_the_images_and_be_well_formed(val_with_real, tmp_path):
    assert D.imagenet_real(tmp_path / "nowhere") is None
    (val_with_real / "real.json").write_text(json.dumps([[0]]))  # only the first image
    dataset = D.imagenet(val_with_real, "val", D.eval_transform("imagenet", 16))
    with pytest.raises(ValueError, match="no entry for validation image ILSVRC2012_val_00000002.JPEG"):
        real_accuracy(Always(0), dataset, [0, 1], D.imagenet_real(val_with_real),
                      ImageClsTask().make_config("tiny", {}), "cpu")
    (val_with_real / "real.json").write_text(json.dumps({"a": 1}))
    with pytest.raises(ValueError, match="a list of label lists"):
        D.imagenet_real(val_with_real)


def test_alexnet_normalised_mce():
    assert alexnet_mce(dict(D.ALEXNET_IMAGENET_C_ERROR)) == pytest.approx(100)  # AlexNet itself: 100
    halves = {name: e / 2 for name, e in D.ALEXNET_IMAGENET_C_ERROR.items()}
    assert alexnet_mce(halves) == pytest.approx(50)
    assert alexnet_mce({"fog": 0.819324 * 0.6, "brightness": 0.564592 * 0.4}) == pytest.approx(50)
    assert len(D.ALEXNET_IMAGENET_C_ERROR) == 15
    with pytest.raises(ValueError, match="no AlexNet error for speckle_noise"):
        alexnet_mce({"speckle_noise": 0.5})


def test_an_imagenet_run_reports_real_accuracy_and_alexnet_mce(val_with_real):
    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec

    root = val_with_real
    for i, w in enumerate(WNIDS):
        for j in range(4):
            write_image(root / "train" / w / f"{j}.JPEG", seed=100 + 10 * i + j)
    for s in (1, 2, 3, 4, 5):
        write_image(root / "imagenet-c" / "fog" / str(s) / WNIDS[0] / "a.JPEG", seed=s)
    overrides = {"dataset": "imagenet", "img_size": 16, "patch_size": 8, "epochs": 1, "batch_size": 4,
                 "adv_samples": 2, "corruption_samples": 2, "figure_images": 1, "embed_dim": 16, "depth": 1}
    result = execute(resolve(RunSpec("image-cls", "quest", "tiny", 0, overrides)), root / "run",
                     data_root=str(root), progress=False)
    assert result.status == "ok", result.reason
    m = result.metrics
    assert 0 <= m["real_acc"] <= 1
    assert m["mce_alexnet"] == pytest.approx(100 * (1 - m["corruption_acc/fog"]) / 0.819324)
