# Segmenter (Strudel et al. 2021: ViT encoder + mask transformer decoder) at laptop scale, on the texture mosaics
# (quest_segmentation.data): 64x64 images, 10 classes, ViT with 8x8 patches. The `tiny` preset of the
# `segmentation` task; quest-bench fills in data_root, work_dir and the attention variant (model.attention).
# Train it without quest-bench:  mim train mmseg <this file>  (or mmseg's tools/train.py).
custom_imports = dict(imports=['quest_segmentation.mmseg_plugin'], allow_failed_imports=False)
default_scope = 'mmseg'

crop_size = (64, 64)
num_classes = 10
embed_dims = 64
norm_cfg = dict(type='LN', eps=1e-6, requires_grad=True)
model = dict(
    type='QuestEncoderDecoder',
    attention='quest',
    data_preprocessor=dict(type='SegDataPreProcessor', mean=[127.5] * 3, std=[127.5] * 3, bgr_to_rgb=True,
                           pad_val=0, seg_pad_val=255, size=crop_size),
    backbone=dict(type='VisionTransformer', img_size=crop_size, patch_size=8, in_channels=3, embed_dims=embed_dims,
                  num_layers=4, num_heads=4, mlp_ratio=2, drop_path_rate=0.0, final_norm=True, norm_cfg=norm_cfg,
                  with_cls_token=True, interpolate_mode='bicubic'),
    decode_head=dict(type='SegmenterMaskTransformerHead', in_channels=embed_dims, channels=embed_dims,
                     num_classes=num_classes, num_layers=1, num_heads=4, embed_dims=embed_dims, mlp_ratio=2,
                     dropout_ratio=0.0,
                     loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'),
)

dataset_type = 'TextureMosaicsDataset'  # ADE20KDataset with the mosaics' 10 classes
data_root = None  # set by quest-bench: the generated mosaics folder (ADE20K layout)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=32, num_workers=0, sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, reduce_zero_label=True,
                 data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=32, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, reduce_zero_label=True,
                 data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

# AdamW with the weight-decay policy of quest_sdk.engine.decay_groups, in mmengine's vocabulary:
# no decay on norms, biases, position embedding, CLS token and the qknorm family's learnable gains.
optim_wrapper = dict(
    type='OptimWrapper', optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0,
                       custom_keys={'pos_embed': dict(decay_mult=0.0), 'cls_token': dict(decay_mult=0.0),
                                    'q_gain': dict(decay_mult=0.0), 'k_gain': dict(decay_mult=0.0)}))
max_iters = 600
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', eta_min=2e-5, by_epoch=False, begin=50, end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters + 1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters, max_keep_ckpts=1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook', draw=False))
env_cfg = dict(cudnn_benchmark=False, mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
               dist_cfg=dict(backend='nccl'))
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='SegLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(by_epoch=False)
log_level = 'WARNING'
load_from = None
resume = False
randomness = dict(seed=0, deterministic=False)
