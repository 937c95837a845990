# ImageNet-1k, 224x224, the PaCa-ViT / DeiT-style timm recipe (paper Table 5) ported to mmpretrain.
# Batch 128 per GPU (8 GPUs -> 1024). Expected layout (mmpretrain's `ImageNet` dataset):
#   data/imagenet/train/<wnid>/*.JPEG, data/imagenet/val/<wnid>/*.JPEG
#   (or meta/train.txt, meta/val.txt annotation lists).
dataset_type = 'ImageNet'
data_root = 'data/imagenet'
data_preprocessor = dict(
    num_classes=1000,
    # RGB ImageNet mean/std (timm IMAGENET_DEFAULT_MEAN/STD x 255)
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    to_rgb=True,  # images are loaded as BGR
)
bgr_mean = data_preprocessor['mean'][::-1]
bgr_std = data_preprocessor['std'][::-1]

train_pipeline = [
    dict(type='LoadImageFromFile'),
    # timm RandomResizedCropAndInterpolation: scale (0.08, 1), ratio (3/4, 4/3), bicubic
    dict(type='RandomResizedCrop', scale=224, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    # timm 'rand-m9-mstd0.5-inc1' (colour jitter 0.4 is disabled by timm when RandAugment is on)
    dict(
        type='RandAugment',
        policies='timm_increasing',
        num_policies=2,
        total_level=10,
        magnitude_level=9,
        magnitude_std=0.5,
        hparams=dict(pad_val=[round(x) for x in bgr_mean], interpolation='bicubic')),
    # timm RandomErasing(0.25, mode='pixel', max_count=1)
    dict(
        type='RandomErasing',
        erase_prob=0.25,
        mode='rand',
        min_area_ratio=0.02,
        max_area_ratio=1 / 3,
        fill_color=bgr_mean,
        fill_std=bgr_std),
    dict(type='PackInputs'),
]

# timm eval: resize the short edge to floor(224 / 0.9) = 248 (bicubic), centre crop 224
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=248, edge='short', backend='pillow',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
# tools/test.py --tta (not used for the paper's numbers): the test view and its mirror image,
# scores averaged (tta_model: default_runtime_cls.py), as mmpretrain's tools/test.py default
tta_pipeline = test_pipeline[:-1] + [
    dict(type='TestTimeAug',
         transforms=[[dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
                     [dict(type='PackInputs')]]),
]

train_dataloader = dict(
    batch_size=128,
    num_workers=8,
    persistent_workers=True,
    pin_memory=True,
    dataset=dict(type=dataset_type, data_root=data_root, split='train',
                 pipeline=train_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=True),
)
val_dataloader = dict(
    batch_size=128,
    num_workers=8,
    persistent_workers=True,
    pin_memory=True,
    dataset=dict(type=dataset_type, data_root=data_root, split='val',
                 pipeline=test_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=False),
)
val_evaluator = dict(type='Accuracy', topk=(1, 5))

test_dataloader = val_dataloader
test_evaluator = val_evaluator
