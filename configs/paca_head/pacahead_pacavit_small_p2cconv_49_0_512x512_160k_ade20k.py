# Table 4 ablation, PaCa-Small pretrained with clusters (49,49,49,0)
# (like 2_0, the ADE20k network equals PaCa-Small; only the pretrained weights differ)
# PaCa-ViT backbone + PaCa head, ADE20k 512x512 crops, 160k iterations (paper Appendix B.3).
# Published (paper): 23.2M params, 48.1 mIoU (the README swaps this row with 49_100).
# Pretrained backbone: the released ImageNet-1k checkpoint (`pretrained`), downloaded once
# into torch's hub cache and read weights-only; a local copy instead:
# --cfg-options model.backbone.init_cfg.checkpoint=PATH. paca_mm re-initialises the
# cluster layers whose shape changes (100 -> 200 clusters).
pretrained = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_pacavit_small_p2cconv_49_0.pth'  # noqa
_base_ = [
    '../_base_/models/paca_head.py', '../_base_/datasets/ade20k.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_160k_pacahead.py'
]
custom_imports = dict(imports=['paca_mm'], allow_failed_imports=False)
model = dict(
    backbone=dict(
        arch='pacavit_small_p2cconv_49_0',
        num_clusters=(200, 200, 200, 0),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 320, 384]))
