# PaCa-ViT backbone + UperNet (UPerHead, with an FCN auxiliary head on stage 3) for ADE20k.
# The variant configs in configs/upernet/ override the backbone arch and the in_channels.
custom_imports = dict(imports=['paca_mm'], allow_failed_imports=False)
norm_cfg = dict(type='SyncBN', requires_grad=True)  # tools/train.py reverts it to BN on CPU
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=(512, 512))  # = the crop size of the dataset config
model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(
        type='PaCaViT',
        arch='pacavit_tiny_p2cconv_100_0',
        num_clusters=(200, 200, 200, 0),
        drop_path_rate=0.1,
        layer_scale=None,
        out_indices=(0, 1, 2, 3)),
    decode_head=dict(
        type='UPerHead',
        in_channels=[96, 192, 320, 384],
        in_index=[0, 1, 2, 3],
        pool_scales=(1, 2, 3, 6),
        channels=512,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    auxiliary_head=dict(
        type='FCNHead',
        in_channels=320,  # C3 of the backbone (384 for base)
        in_index=2,
        channels=256,
        num_convs=1,
        concat_input=False,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4)),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))
