# PaCa-Tiny^ec (ConvMixer clustering teacher, 100 x 4) Mask R-CNN + FPN,
# COCO, 1x, multi-scale 480-800; the recipe is the tiny config's.
# In the official repository (mask_rcnn_pacavit_convmixer_tiny_100_mstrain_480_800_1x_coco.py)
# but not in the paper, and no COCO or ImageNet weights were released for it; the official
# config cannot be built (its backbone looks up the misspelt arch 'tiny_eacher').
# Train the ImageNet backbone first (configs/paca_vit_imagenet/
# pacavit_convmixer_tiny_100_8xb128_in1k.py) and save its backbone as the checkpoint below.
pretrained = 'checkpoints/IMNET_224_pacavit_convmixer_tiny_100.pth'  # no released file
_base_ = './mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py'
model = dict(
    backbone=dict(
        arch='pacavit_convmixer_tiny_100',
        init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 320, 384]))
