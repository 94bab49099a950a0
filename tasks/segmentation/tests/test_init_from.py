"""A segmentation backbone that starts from an image-cls run of the same variant: the weights map one to one onto
mmseg's ViT (the same features on the same input), the run folder is checked, and a run starts from them."""

import copy
import json

import pytest
import torch

import quest_segmentation.mmcv_shim  # noqa: F401  (the mmcv-lite shim, before mmengine/mmseg)
from quest_image_cls.model import build_vit
from quest_segmentation.experiment import CONFIGS
from quest_segmentation.init_from import image_cls_backbone, timm_to_mmseg
from quest_segmentation.task import SegmentationTask

TINY = str(CONFIGS / "segmenter_vit-tiny_mosaics-64x64.py")
# the tiny config's backbone: 64x64 crops, 8x8 patches, width 64, 4 layers, 4 heads, MLP ratio 2
VIT = dict(img_size=64, patch_size=8, in_chans=3, num_classes=10, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0)


def seg_backbone(variant: str):
    from mmengine.config import Config
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    import quest_segmentation.mmseg_plugin  # noqa: F401

    register_all_modules()
    model_cfg = copy.deepcopy(Config.fromfile(TINY).model)
    model_cfg.attention = variant
    model_cfg.backbone.patch_bias = True  # as a run with init_from sets it
    return MODELS.build(model_cfg).backbone


def image_cls_run(folder, variant: str, task: str = "image-cls", status: str = "ok"):
    """A finished image-cls run folder as `quest-bench run` leaves it (its ViT inside the task's Classifier)."""
    torch.manual_seed(1)
    vit = build_vit(variant, **VIT)
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(json.dumps({"task": task, "variant": variant}))
    (folder / "result.json").write_text(json.dumps({"status": status}))
    model = {f"vit.{k}": v for k, v in vit.state_dict().items()} | {"mean": torch.zeros(3), "std": torch.ones(3)}
    torch.save({"model": model, "step": 10}, folder / "checkpoint.pt")
    return vit


@pytest.mark.parametrize("variant", ["softmax", "quest", "qknorm-ds"])
def test_an_image_cls_vit_maps_onto_mmsegs_vit_with_the_same_features(variant):
    torch.manual_seed(0)
    vit = build_vit(variant, **VIT)
    backbone = seg_backbone(variant)
    backbone.load_state_dict(timm_to_mmseg(vit.state_dict()), strict=True)  # every weight, nothing left over
    vit.eval(), backbone.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        timm_patches = vit.forward_features(x)[:, 1:]  # after the final norm, without the CLS token
        mmseg_patches = backbone(x)[-1].flatten(2).transpose(1, 2)
    torch.testing.assert_close(mmseg_patches, timm_patches, atol=1e-5, rtol=1e-5)


def test_the_run_folder_must_be_a_finished_image_cls_run_of_the_same_variant(tmp_path):
    vit = image_cls_run(tmp_path / "run", "quest")
    out = image_cls_backbone(tmp_path / "run", "quest", tmp_path / "w.pth")
    saved = torch.load(out, weights_only=True)["state_dict"]
    assert saved.keys() == timm_to_mmseg(vit.state_dict()).keys()
    torch.testing.assert_close(saved["layers.0.attn.attn.in_proj_weight"], vit.blocks[0].attn.qkv.weight)
    with pytest.raises(ValueError, match="trained attention 'quest', this run uses 'softmax'"):
        image_cls_backbone(tmp_path / "run", "softmax", tmp_path / "w.pth")
    with pytest.raises(ValueError, match="not a finished run folder: no spec.json, result.json, checkpoint.pt"):
        image_cls_backbone(tmp_path / "nowhere", "quest", tmp_path / "w.pth")
    image_cls_run(tmp_path / "lm", "quest", task="lm")
    with pytest.raises(ValueError, match="this is task 'lm' with status 'ok'"):
        image_cls_backbone(tmp_path / "lm", "quest", tmp_path / "w.pth")
    with pytest.raises(ValueError, match="no mmseg counterpart for the ViT weights extra.weight"):
        timm_to_mmseg({"extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="not both"):
        SegmentationTask().make_config("tiny", {"pretrained": "a.pth", "init_from": str(tmp_path / "run")})


def test_a_run_starts_its_backbone_from_the_image_cls_run(tmp_path):
    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec

    vit = image_cls_run(tmp_path / "image-cls", "quest")
    overrides = {"init_from": str(tmp_path / "image-cls"), "iters": 1, "lr": 1e-12, "mosaic_train": 16,
                 "mosaic_val": 8, "corruption_samples": 0, "figure_images": 0}
    result = execute(resolve(RunSpec("segmentation", "quest", "tiny", 0, overrides)), tmp_path / "seg",
                     progress=False)
    assert result.status == "ok", result.reason
    trained = torch.load(next((tmp_path / "seg" / "mmseg").glob("iter_*.pth")), map_location="cpu",
                         weights_only=False)["state_dict"]
    # one step at a learning rate of 1e-12: the backbone is still the image-cls run's ViT
    torch.testing.assert_close(trained["backbone.layers.0.attn.attn.in_proj_weight"], vit.blocks[0].attn.qkv.weight)
    torch.testing.assert_close(trained["backbone.patch_embed.projection.bias"], vit.patch_embed.proj.bias)
