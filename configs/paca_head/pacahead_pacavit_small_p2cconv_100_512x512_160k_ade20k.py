# Table 4 ablation, PaCa-Small with clusters (100,100,100,100)
# PaCa-ViT backbone + PaCa head, ADE20k 512x512 crops, 160k iterations (paper Appendix B.3).
# Published: 23.4M params, 48.3 mIoU.
# Pretrained backbone: the released ImageNet-1k checkpoint (`pretrained`), downloaded once
# into torch's hub cache and read weights-only; a local copy instead:
# --cfg-options model.backbone.init_cfg.checkpoint=PATH. paca_mm re-initialises the
# cluster layers whose shape changes (100 -> 200 clusters).
# ImageNet weights: IMNET_224_pacavit_small_p2cconv_100.pth, chosen by its name (the
# official README links this row to the _100_49 file; see docs/differences.md).
pretrained = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_pacavit_small_p2cconv_100.pth'  # noqa
_base_ = [
    '../_base_/models/paca_head.py', '../_base_/datasets/ade20k.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_160k_pacahead.py'
]
custom_imports = dict(imports=['paca_mm'], allow_failed_imports=False)
model = dict(
    backbone=dict(
        arch='pacavit_small_p2cconv_100',
        num_clusters=(200, 200, 200, 200),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 320, 384]))
