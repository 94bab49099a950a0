# The `paper` preset of the `segmentation` task: mmseg's own Segmenter ViT-T/16 mask-transformer recipe on ADE20K
# 512x512 (160k iterations, 8 GPUs x batch 1 in mmseg's naming), unchanged except that the attention of backbone and
# head comes from quest-core (model.type / model.attention). The QUEST paper reports ADE20K with a ViT-Ti backbone
# (softmax 37.34 -> QUEST 38.87 mIoU). mmseg's recipe starts from an ImageNet-pretrained ViT-T: put that checkpoint
# (mmseg layout) on the data root and pass its path with --set pretrained=...; without one the backbone trains from
# scratch (and lands far below the paper's numbers).
_base_ = ['mmseg::segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py']
custom_imports = dict(imports=['quest_segmentation.mmseg_plugin'], allow_failed_imports=False)
model = dict(type='QuestEncoderDecoder', attention='quest', pretrained=None)
