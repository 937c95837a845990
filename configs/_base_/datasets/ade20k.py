# ADE20k (ADEChallengeData2016, 150 classes, reduce_zero_label), 512x512 crops.
# Layout: data/ade/ADEChallengeData2016/{images,annotations}/{training,validation}
# (download from http://sceneparsing.csail.mit.edu/, see mmseg's dataset_prepare.md).
dataset_type = 'ADE20KDataset'
data_root = 'data/ade/ADEChallengeData2016'
crop_size = (512, 512)
backend_args = None
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', reduce_zero_label=True, backend_args=backend_args),
    dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    # annotations are loaded after the resize: the metric uses the original-size labels
    dict(type='LoadAnnotations', reduce_zero_label=True, backend_args=backend_args),
    dict(type='PackSegInputs'),
]
img_ratios = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='TestTimeAug',
         transforms=[
             [dict(type='Resize', scale_factor=r, keep_ratio=True) for r in img_ratios],
             [dict(type='RandomFlip', prob=0., direction='horizontal'),
              dict(type='RandomFlip', prob=1., direction='horizontal')],
             [dict(type='LoadAnnotations', backend_args=backend_args)],
             [dict(type='PackSegInputs')],
         ]),
]
train_dataloader = dict(
    batch_size=2,  # per GPU; the paper uses 8 GPUs x 2 = 16
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator
