# CPU demo: a very small PaCa-ViT classifier on the generated 4-class shapes dataset
# (demo/datasets/synthetic_cls.py; written to work_dirs/demo/data/cls on first use).
# 96 iterations; a few minutes on 2 CPU cores (100% val top-1 at the end in our runs):
#   python tools/train.py demo/configs/paca_tiny_synthetic_cls.py
#   python tools/test.py demo/configs/paca_tiny_synthetic_cls.py work_dirs/<...>/epoch_12.pth
# Same model/head structure as the ImageNet configs, smaller widths, 64x64 inputs, no
# mixup/cutmix/RandAugment (they need far more iterations than a demo has).
_base_ = [
    '../../configs/_base_/models/paca_vit_cls.py',
    '../../configs/_base_/default_runtime_cls.py',
]
custom_imports = dict(imports=['paca_mm', 'demo.datasets'], allow_failed_imports=False)

num_classes = 4
img_size = 64
data_root = 'work_dirs/demo/data/cls'
synthetic = dict(type='PaCaSyntheticCls', data_root=data_root, num_classes=num_classes,
                 train_per_class=32, val_per_class=8, img_size=img_size, seed=0)

data_preprocessor = dict(
    num_classes=num_classes,
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    to_rgb=True,
)

model = dict(
    backbone=dict(
        arch=dict(_delete_=True, embed_dims=(32, 64, 96, 128), depths=(1, 1, 2, 1),
                  num_heads=(1, 2, 4, 4), mlp_ratios=(4, 4, 4, 4)),
        num_clusters=(16, 16, 16, 0),
        clustering='conv',
        drop_path_rate=0.0),
    head=dict(num_classes=num_classes, in_channels=128),
    train_cfg=None,  # no mixup / cutmix
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=img_size, crop_ratio_range=(0.6, 1.0)),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='PackInputs'),
]
# tools/test.py --tta: the image and its mirror image, scores averaged (AverageClsScoreTTA,
# tta_model of default_runtime_cls.py)
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug',
         transforms=[[dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
                     [dict(type='PackInputs')]]),
]

train_dataloader = dict(
    batch_size=16,
    num_workers=0,
    persistent_workers=False,  # mmpretrain's tools/train.py defaults it to True
    dataset=dict(**synthetic, split='train', pipeline=train_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=True),
)
val_dataloader = dict(
    batch_size=16,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(**synthetic, split='val', pipeline=test_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=False),
)
val_evaluator = dict(type='Accuracy', topk=(1, 2))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

optim_wrapper = dict(
    type='OptimWrapper',  # fp32: AMP needs a GPU
    optimizer=dict(type='AdamW', lr=2e-3, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, flat_decay_mult=0.0),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min_ratio=1e-2, by_epoch=True, begin=1, end=12,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=12, val_interval=4)
val_cfg = dict()
test_cfg = dict()

default_hooks = dict(
    logger=dict(interval=4),
    checkpoint=dict(interval=4, max_keep_ckpts=1, save_best='auto'),
)
# cluster heatmaps (stage 1: 16x16 at 64x64 input) of the first val image every 32 iters,
# written to <work_dir>/cluster_vis and the visualizer backends
custom_hooks = [dict(type='PaCaClusterVisHook', interval=32, stage=1)]

env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
