# PaCa-ViT backbone + PaCa segmentation head (paper Sec. 3.4, Fig. 5) for ADE20k (150 classes).
# The variant configs in configs/paca_head/ override the backbone arch / clusters / drop path,
# the head's in_channels, and add init_cfg=dict(type='Pretrained', checkpoint=...).
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
    type='EncoderDecoder',  # 'PaCaEncoderDecoder' (official name) is an identical alias
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(
        type='PaCaViT',
        arch='pacavit_tiny_p2cconv_100_0',
        # ADE20k: every non-zero stage gets 200 clusters (paper Sec. 4.3)
        num_clusters=(200, 200, 200, 0),
        drop_path_rate=0.1,
        layer_scale=None,
        out_indices=(0, 1, 2, 3)),
    decode_head=dict(
        type='PaCaHead',  # alias: 'PaCaSegHead'
        in_channels=[96, 192, 320, 384],
        in_index=[0, 1, 2, 3],
        channels=256,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(
            type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0,
            avg_non_ignore=True),
        # CE on the raw clustering logits (the direct supervision of C), logged as
        # decode.loss_paca / decode.acc_paca
        aux_loss_decode=dict(
            type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4,
            avg_non_ignore=True, loss_name='loss_paca')),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))
