# PaCa-Small ablation, clusters 100 x 4 computed in every block Mask R-CNN + FPN,
# COCO, 1x, multi-scale 480-800; the recipe is the tiny config's.
# Published (paper Table 4): 44.0M params, 304 GFLOPs, APb 46.5, APm 41.8.
pretrained = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_pacavit_small_p2cconv_100_blockwise.pth'  # noqa
_base_ = './mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py'
model = dict(
    backbone=dict(
        arch='pacavit_small_p2cconv_100_blockwise',
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 320, 384]))
