# Tiny mmseg config for the tools tests (tests/test_tools.py, tests/test_resume.py): a
# PaCaViT with a 4-stage custom arch (16/32/48/64 channels, one block per stage) and an
# FCN head, trained on 32x32 images of demo.datasets.synthetic_seg. The tests point
# the dataloaders' data_root at a generated folder with --cfg-options.
# On purpose it asks for SyncBN and an nccl backend, as the paper's GPU configs do: the
# tools must revert them to BN / gloo on a machine without CUDA.
# No randomness besides the seeded sampler and flip (no dropout / drop path), so a resumed
# run reproduces an uninterrupted one exactly.
default_scope = 'mmseg'
custom_imports = dict(imports=['paca_mm'], allow_failed_imports=False)

classes = ('background', 'disc', 'square', 'triangle')
palette = [(120, 120, 120), (220, 20, 60), (0, 90, 255), (0, 190, 60)]
data_root = 'data/tools_tiny_seg'  # overridden by the tests
crop_size = (32, 32)
norm_cfg = dict(type='SyncBN', requires_grad=True)

model = dict(
    type='EncoderDecoder',
    data_preprocessor=dict(
        type='SegDataPreProcessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_val=0,
        seg_pad_val=255,
        size=crop_size),
    backbone=dict(
        type='PaCaViT',
        arch=dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8)),
        num_clusters=(4, 4, 4, 0),
        drop_path_rate=0.0),
    decode_head=dict(
        type='FCNHead',
        in_channels=[16, 32, 48, 64],
        in_index=[0, 1, 2, 3],
        input_transform='resize_concat',
        channels=16,
        num_convs=1,
        concat_input=False,
        dropout_ratio=0.0,
        num_classes=len(classes),
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs'),
]
_dataset = dict(
    type='BaseSegDataset',
    data_root=data_root,
    metainfo=dict(classes=classes, palette=palette),
    img_suffix='.png',
    seg_map_suffix='.png',
    reduce_zero_label=False)
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        **_dataset,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        **_dataset,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

max_iters = 6
optim_wrapper = dict(
    type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.01))
param_scheduler = [
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=0, end=max_iters)
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=1, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=3),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'))
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='SegLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(by_epoch=False)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0, deterministic=True)
