# PaCa-Base^ec (ConvMixer clustering teacher, 100 x 4) Mask R-CNN + FPN,
# COCO, 1x, multi-scale 480-800; the recipe is the tiny config's.
# Published (paper Table 2): 61.4M params (the code builds 67.35M, see docs/complexity.md),
# 372 GFLOPs, APb 48.3, APm 43.3.
pretrained = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_pacavit_convmixer_base_100.pth'  # noqa
_base_ = './mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py'
model = dict(
    backbone=dict(
        arch='pacavit_convmixer_base_100',
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 512]))
