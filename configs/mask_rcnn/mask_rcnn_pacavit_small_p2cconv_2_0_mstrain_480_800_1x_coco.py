# PaCa-Small ablation, clusters 2-2-2-0 Mask R-CNN + FPN,
# COCO, 1x, multi-scale 480-800; the recipe is the tiny config's.
# Published (paper Table 4): 41.6M params (code: 41.75M), 283 GFLOPs, APb 45.5, APm 41.1.
pretrained = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_pacavit_small_p2cconv_2_0.pth'  # noqa
_base_ = './mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py'
model = dict(
    backbone=dict(
        arch='pacavit_small_p2cconv_2_0',
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 320, 384]))
