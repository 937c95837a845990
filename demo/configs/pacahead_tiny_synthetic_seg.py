# CPU demo: PaCa-Tiny (the real tiny arch, random init) + PaCa head trained from scratch on the
# synthetic shapes dataset of demo/datasets/synthetic_seg.py (4 classes incl. background,
# 128x128 images). Generate the data first (demo.seg.run does it):
#   python -m demo.datasets.synthetic_seg --root work_dirs/demo/data/seg
# Train / evaluate:
#   python tools/train.py demo/configs/pacahead_tiny_synthetic_seg.py
#   python tools/test.py demo/configs/pacahead_tiny_synthetic_seg.py WORK_DIR/iter_300.pth
# Measured: mIoU 83.6 after 300 iterations (240 s, 1 thread; chance 19.0).
# Differences from the ADE20k recipe, for a few minutes on a CPU: no ImageNet weights,
# 100 clusters, BN instead of SyncBN, no drop path, lr 2e-3 with a short warm-up, batch 4.
_base_ = [
    '../../configs/_base_/models/paca_head.py',
    '../../configs/_base_/default_runtime_seg.py',
]
custom_imports = dict(imports=['paca_mm', 'demo.datasets'], allow_failed_imports=False)

classes = ('background', 'disc', 'square', 'triangle')  # = synthetic_seg.CLASSES
palette = [(120, 120, 120), (220, 20, 60), (0, 90, 255), (0, 190, 60)]
data_root = 'work_dirs/demo/data/seg'
crop_size = (128, 128)
max_iters = 300
norm_cfg = dict(type='BN', requires_grad=True)

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(
        arch='pacavit_tiny_p2cconv_100_0', num_clusters=(100, 100, 100, 0),
        drop_path_rate=0.0),
    decode_head=dict(num_classes=len(classes), norm_cfg=norm_cfg))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='RandomResize', scale=crop_size, ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.9),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=crop_size, keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs'),
]
# tools/test.py --tta: 3 scales x flip, class probabilities averaged by mmseg's SegTTAModel
# (tta_model of default_runtime_seg.py), as configs/_base_/datasets/ade20k.py
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug',
         transforms=[
             [dict(type='Resize', scale_factor=r, keep_ratio=True) for r in (0.75, 1.0, 1.25)],
             [dict(type='RandomFlip', prob=0., direction='horizontal'),
              dict(type='RandomFlip', prob=1., direction='horizontal')],
             [dict(type='LoadAnnotations', reduce_zero_label=False)],
             [dict(type='PackSegInputs')],
         ]),
]
_dataset = dict(
    type='PaCaSyntheticSeg',  # BaseSegDataset + errors naming a bad file and the dataset
    data_root=data_root,
    metainfo=dict(classes=classes, palette=palette),
    img_suffix='.png',
    seg_map_suffix='.png',
    reduce_zero_label=False)
train_dataloader = dict(
    batch_size=4,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        **_dataset,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline))
# no validation during training: the demo evaluates once with tools/test.py
val_dataloader = None
val_evaluator = None
val_cfg = None
test_dataloader = dict(
    batch_size=1,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        **_dataset,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(norm_decay_mult=0., custom_keys={'norm': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=20, end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters)
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=20, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
