# PaCa-Tiny (conv, clusters 100-100-100-0) Mask R-CNN + FPN, COCO, 1x, multi-scale 480-800.
# Recipe of the official configs (paper Appendix B.2): AdamW lr 1e-4 / wd 0.05 (no decay on norms),
# 12 epochs, batch 2 per GPU x 8 GPUs, drop path 0.1, the ImageNet cluster counts kept.
# Published (paper Table 2): 32.0M params, 252 GFLOPs at 1280x800, APb 43.3, APm 39.6.
# Pretrained backbone: the released ImageNet-1k checkpoint (`pretrained`), downloaded once
# into torch's hub cache and read weights-only, loaded in init_weights after the random
# init. A local copy instead: --cfg-options model.backbone.init_cfg.checkpoint=PATH (any
# layout tools/convert_official_checkpoint.py accepts). Remove init_cfg to train from
# scratch.
pretrained = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_pacavit_tiny_p2cconv_100_0.pth'  # noqa
_base_ = [
    '../_base_/models/mask_rcnn_paca_fpn.py', '../_base_/datasets/coco_instance_ms480_800.py',
    '../_base_/schedules/schedule_1x_adamw.py', '../_base_/default_runtime_det.py'
]
custom_imports = dict(imports=['paca_mm'], allow_failed_imports=False)
model = dict(
    backbone=dict(
        arch='pacavit_tiny_p2cconv_100_0',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 320, 384]))
