"""quest-bench task ``segmentation``: mmsegmentation's Segmenter (ViT + mask transformer) with quest-core attention.

``quest_segmentation.mmcv_shim`` makes mmseg importable on mmcv-lite and lets mmengine checkpoints load under
torch's ``weights_only`` default: importing it installs both fixes, so import it before ``mmseg`` (the task's run and
``quest_segmentation.mmseg_plugin`` do). The package itself imports nothing heavy, so listing tasks stays fast.
"""
