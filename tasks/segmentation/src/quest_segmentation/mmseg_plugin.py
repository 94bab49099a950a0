"""What quest-core adds to mmsegmentation, registered in mmseg's registries (``custom_imports`` in a config):

- ``QuestEncoderDecoder``: mmseg's ``EncoderDecoder`` plus ``attention='<variant>'``; after building, every
  attention module of backbone and head is converted with ``quest_core.swap_attention`` (mmseg's ViT and
  Segmenter head use mmcv's ``MultiheadAttention`` wrapper around ``torch.nn.MultiheadAttention``, which is what
  gets swapped). ``attention='softmax'`` computes exactly what the stock model computes.
- ``TextureMosaicsDataset``: mmseg's ``ADE20KDataset`` (same layout, suffixes, ``reduce_zero_label``) with the ten
  classes of the generated texture mosaics (``quest_segmentation.data``).
- ``ImageCorruption``: a data transform applying one of the shared corruptions (``quest_sdk.image_corruptions``)
  to the loaded image, seeded per sample, for robustness evaluation through the normal test pipeline.

    custom_imports = dict(imports=["quest_segmentation.mmseg_plugin"], allow_failed_imports=False)
    model = dict(type="QuestEncoderDecoder", attention="quest", backbone=dict(type="VisionTransformer", ...), ...)
"""

from __future__ import annotations

import quest_segmentation.mmcv_shim  # noqa: F401,I001  (first: the mmcv-lite shim, before mmcv and mmseg)

import numpy as np
import torch
from mmcv.cnn.bricks.transformer import MultiheadAttention as MmcvMultiheadAttention
from mmcv.transforms import BaseTransform
from mmseg.datasets import ADE20KDataset
from mmseg.models.segmentors import EncoderDecoder
from mmseg.registry import DATASETS, MODELS, TRANSFORMS

import quest_core
from quest_sdk.image_corruptions import CORRUPTIONS, SEVERITIES, corrupt
from quest_segmentation.data import SOURCES


def _skip_weights(module, args, kwargs):
    """mmcv's wrapper calls ``attn(...)[0]``: the attention weights are thrown away, so do not compute them
    (with them, torch's and quest-core's modules both leave the fused kernel)."""
    kwargs["need_weights"] = False
    return args, kwargs


@MODELS.register_module()
class QuestEncoderDecoder(EncoderDecoder):
    """``EncoderDecoder`` whose attention modules run the quest-core variant ``attention``."""

    def __init__(self, *args, attention: str = "softmax", **kwargs):
        super().__init__(*args, **kwargs)
        self.attention = attention
        self.swap_report = quest_core.swap_attention(self, attention)
        if not self.swap_report.swapped:
            raise ValueError(f"no attention module to swap in this model:\n{self.swap_report}")
        for module in self.modules():
            if isinstance(module, MmcvMultiheadAttention):
                module.attn.register_forward_pre_hook(_skip_weights, with_kwargs=True)


@DATASETS.register_module()
class TextureMosaicsDataset(ADE20KDataset):
    """The texture mosaics, read exactly as ADE20K is (only the class list differs)."""

    METAINFO = dict(classes=SOURCES,
                    palette=[[(37 * i) % 256, (91 * i) % 256, (157 * i) % 256] for i in range(1, 11)])


@TRANSFORMS.register_module()
class ImageCorruption(BaseTransform):
    """Corrupt ``results['img']`` (H, W, 3 uint8 BGR, as mmcv loads it) with a shared corruption at ``severity``;
    the noise is seeded by ``seed`` and the sample index, so every run sees the same corrupted images."""

    def __init__(self, name: str, severity: int, seed: int = 0):
        if name not in CORRUPTIONS:
            raise ValueError(f"unknown corruption {name!r}; valid: {', '.join(CORRUPTIONS)}")
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {severity}")
        self.name, self.severity, self.seed = name, severity, seed

    def transform(self, results: dict) -> dict:
        img_hwc = results["img"]
        x_bchw = torch.from_numpy(np.ascontiguousarray(img_hwc[..., ::-1])).permute(2, 0, 1)[None].float() / 255
        seed = self.seed * 1_000_003 + int(results.get("sample_idx", 0))
        out_bchw = corrupt(x_bchw, self.name, self.severity, seed=seed)
        out_hwc = out_bchw[0].permute(1, 2, 0).mul(255).round().byte().numpy()[..., ::-1]
        results["img"] = np.ascontiguousarray(out_hwc)
        return results

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, severity={self.severity}, seed={self.seed})"
