# PaCa-Base (conv, clusters 100-100-100-0) Mask R-CNN + FPN,
# COCO, 1x, multi-scale 480-800; the recipe is the tiny config's.
# Published (paper Table 2): 66.6M params, 373 GFLOPs, APb 48.0, APm 42.9.
pretrained = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_pacavit_base_p2cconv_100_0.pth'  # noqa
_base_ = './mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py'
model = dict(
    backbone=dict(
        arch='pacavit_base_p2cconv_100_0',
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 512]))
