"""quest-bench task ``segmentation``: mmsegmentation's Segmenter (ViT + mask transformer) with quest-core attention.

Importing this package makes mmseg importable on mmcv-lite and lets mmengine checkpoints load under torch's
``weights_only`` default (``quest_segmentation.mmcv_shim``); import it before ``mmseg``.
"""

from quest_segmentation.mmcv_shim import allow_mmengine_checkpoints, install_mmcv_ops_shim

install_mmcv_ops_shim()
allow_mmengine_checkpoints()
