# PaCa-Small ablation, clusters 49-64-81-100 Mask R-CNN + FPN,
# COCO, 1x, multi-scale 480-800; the recipe is the tiny config's.
# Published (paper Table 4): 42.0M params, 289 GFLOPs, APb 46.1, APm 41.5.
pretrained = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_pacavit_small_p2cconv_49_100.pth'  # noqa
_base_ = './mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py'
model = dict(
    backbone=dict(
        arch='pacavit_small_p2cconv_49_100',
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 320, 384]))
