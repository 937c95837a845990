# PaCa-Small^ec (ConvMixer clustering teacher, 100 x 4) Mask R-CNN + FPN,
# COCO, 1x, multi-scale 480-800; the recipe is the tiny config's.
# Published (paper Table 2): 40.9M params (code: 40.85M), 292 GFLOPs, APb 45.8, APm 41.4.
pretrained = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_pacavit_convmixer_small_100.pth'  # noqa
_base_ = './mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py'
model = dict(
    backbone=dict(
        arch='pacavit_convmixer_small_100',
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 320, 384]))
