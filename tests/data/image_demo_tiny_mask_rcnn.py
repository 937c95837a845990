# A very small Mask R-CNN with a PaCa-ViT backbone, for the image-demo test (random weights,
# 128x128 test scale). Not a training recipe: see the detection configs for those.
default_scope = 'mmdet'
custom_imports = dict(imports=['paca_mm'], allow_failed_imports=False)
classes = ('circle', 'square', 'triangle')
dims = (32, 64, 96, 128)
ch = 32

model = dict(
    type='MaskRCNN',
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_mask=True,
        pad_size_divisor=32),
    backbone=dict(
        type='PaCaViT',
        arch=dict(embed_dims=dims, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 4)),
        num_clusters=(8, 8, 8, 0),
        drop_path_rate=0.,
        out_indices=(0, 1, 2, 3)),
    neck=dict(type='FPN', in_channels=list(dims), out_channels=ch, num_outs=5),
    rpn_head=dict(
        type='RPNHead',
        in_channels=ch,
        feat_channels=ch,
        anchor_generator=dict(
            type='AnchorGenerator', scales=[8], ratios=[0.5, 1.0, 2.0],
            strides=[4, 8, 16, 32, 64]),
        bbox_coder=dict(
            type='DeltaXYWHBBoxCoder', target_means=[.0, .0, .0, .0],
            target_stds=[1.0, 1.0, 1.0, 1.0]),
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=True, loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=1.0)),
    roi_head=dict(
        type='StandardRoIHead',
        bbox_roi_extractor=dict(
            type='SingleRoIExtractor',
            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0),
            out_channels=ch,
            featmap_strides=[4, 8, 16, 32]),
        bbox_head=dict(
            type='Shared2FCBBoxHead',
            in_channels=ch,
            fc_out_channels=64,
            roi_feat_size=7,
            num_classes=len(classes),
            bbox_coder=dict(
                type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.],
                target_stds=[0.1, 0.1, 0.2, 0.2]),
            reg_class_agnostic=False,
            loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
            loss_bbox=dict(type='L1Loss', loss_weight=1.0)),
        mask_roi_extractor=dict(
            type='SingleRoIExtractor',
            roi_layer=dict(type='RoIAlign', output_size=14, sampling_ratio=0),
            out_channels=ch,
            featmap_strides=[4, 8, 16, 32]),
        mask_head=dict(
            type='FCNMaskHead',
            num_convs=1,
            in_channels=ch,
            conv_out_channels=ch,
            num_classes=len(classes),
            loss_mask=dict(type='CrossEntropyLoss', use_mask=True, loss_weight=1.0))),
    train_cfg=None,  # inference only
    test_cfg=dict(
        rpn=dict(nms_pre=300, max_per_img=100, nms=dict(type='nms', iou_threshold=0.7),
                 min_bbox_size=0),
        rcnn=dict(score_thr=0.05, nms=dict(type='nms', iou_threshold=0.5), max_per_img=20,
                  mask_thr_binary=0.5)))

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
test_dataloader = dict(
    batch_size=1,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='CocoDataset', data_root='', ann_file='', data_prefix=dict(img=''),
                 metainfo=dict(classes=classes), test_mode=True, pipeline=test_pipeline))
