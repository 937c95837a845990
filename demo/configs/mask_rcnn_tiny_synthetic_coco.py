# CPU demo: PaCa-Tiny (the real tiny arch, random init) Mask R-CNN + FPN trained from scratch on
# the synthetic COCO-format shapes of demo/datasets/synthetic_coco.py (3 classes: circle,
# square, triangle; 1-3 shapes of 28-72 px on 112-144 px images, demo.det.DEMO_DATA).
# `python -m demo.det` generates the data into work_dirs/demo/data/det, trains and
# evaluates (400 iterations, measured: bbox AP 18-26 / AP50 37-48, segm AP 22-31 / AP50 38-48
# on the val split; the untrained detector: bbox AP50 2.3, segm AP50 0). Training is chaotic:
# a numerically equivalent backbone rewrite gave bbox / segm AP 12.2 / 16.2 at the same seed
# (tests/test_det_e2e.py has the spread measured on its shorter run).
# Train / evaluate (bbox + segm AP with pycocotools):
#   python tools/train.py demo/configs/mask_rcnn_tiny_synthetic_coco.py
#   python tools/test.py demo/configs/mask_rcnn_tiny_synthetic_coco.py WORK_DIR/iter_400.pth
# Differences from the COCO recipe, for a few minutes on a CPU: no ImageNet weights, no drop
# path, FPN/RoI heads narrowed to 64 channels with GroupNorm (mmdet's from-scratch recipe;
# 2-conv + 1-fc box head, 2-conv class-agnostic mask head), fewer proposals and RoI samples,
# small images, AdamW lr 1e-3 (2e-3 diverged) with a short warm-up, 10x lr on the mask logits
# layer (mmdet's Kaiming init makes its initial logits ~5x too large), iteration-based
# schedule, batch 2.
# RoIAlign runs through torchvision (use_torchvision=True): PaCaViT returns channels_last maps
# and mmcv's own RoIAlign op reads them as NCHW-contiguous, i.e. wrong RoI features.
_base_ = [
    '../../configs/_base_/models/mask_rcnn_paca_fpn.py',
    '../../configs/_base_/default_runtime_det.py',
]
custom_imports = dict(imports=['paca_mm', 'demo.datasets'], allow_failed_imports=False)

classes = ('circle', 'square', 'triangle')  # = demo.datasets.synthetic_coco.CLASSES
palette = [(220, 20, 60), (0, 128, 255), (0, 200, 0)]
data_root = 'work_dirs/demo/data/det/'
max_iters = 400
width = 64  # FPN / RoI feature channels

gn = dict(type='GN', num_groups=16, requires_grad=True)
model = dict(
    backbone=dict(arch='pacavit_tiny_p2cconv_100_0', drop_path_rate=0.0),
    neck=dict(in_channels=[96, 192, 320, 384], out_channels=width, norm_cfg=gn),
    rpn_head=dict(in_channels=width, feat_channels=width),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=width, roi_layer=dict(use_torchvision=True)),
        bbox_head=dict(type='ConvFCBBoxHead', num_shared_convs=2, num_shared_fcs=1,
                       in_channels=width, conv_out_channels=width, fc_out_channels=256,
                       norm_cfg=gn, num_classes=len(classes)),
        mask_roi_extractor=dict(out_channels=width, roi_layer=dict(use_torchvision=True)),
        mask_head=dict(num_convs=2, in_channels=width, conv_out_channels=width,
                       norm_cfg=gn, class_agnostic=True, num_classes=len(classes))),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=500, max_per_img=100),
        rcnn=dict(sampler=dict(num=64, pos_fraction=0.5))),
    test_cfg=dict(
        rpn=dict(nms_pre=500, max_per_img=100),
        rcnn=dict(max_per_img=50)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomChoiceResize',  # the recipe's multi-scale training, scaled down
         scales=[(96, 240), (112, 240), (128, 240), (144, 240)],
         keep_ratio=True),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(240, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
# tools/test.py --tta: the test scale and its neighbours (the training scales), each
# flipped and not; boxes and masks merged by paca_mm's MaskRCNNTTAModel (tta_model of
# default_runtime_det.py)
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug',
         transforms=[
             [dict(type='Resize', scale=s, keep_ratio=True)
              for s in [(240, 112), (240, 128), (240, 144)]],
             [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
             [dict(type='LoadAnnotations', with_bbox=True, with_mask=True)],
             [dict(type='PackDetInputs',
                   meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                              'scale_factor', 'flip', 'flip_direction'))],
         ]),
]
train_dataloader = dict(
    batch_size=2,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    batch_sampler=dict(type='AspectRatioBatchSampler'),
    dataset=dict(
        type='PaCaSyntheticCoco',  # CocoDataset + errors naming a bad file and the dataset
        data_root=data_root,
        metainfo=dict(classes=classes, palette=palette),
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=8),
        pipeline=train_pipeline))
# no validation during training: the demo evaluates once with tools/test.py
val_dataloader = None
val_evaluator = None
val_cfg = None
test_dataloader = dict(
    batch_size=1,
    num_workers=1,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='PaCaSyntheticCoco',  # CocoDataset + errors naming a bad file and the dataset
        data_root=data_root,
        metainfo=dict(classes=classes, palette=palette),
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        test_mode=True,
        pipeline=test_pipeline))
test_evaluator = dict(
    type='CocoMetric',
    ann_file=data_root + 'annotations/instances_val.json',
    metric=['bbox', 'segm'],
    format_only=False)

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05,
                   foreach=True),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.),
                                    'conv_logits': dict(lr_mult=10.)}),
    clip_grad=dict(max_norm=10.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=False, begin=20, end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters)
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20, log_metric_by_epoch=False),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters))
log_processor = dict(by_epoch=False)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
