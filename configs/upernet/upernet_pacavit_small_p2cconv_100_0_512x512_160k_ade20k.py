# PaCa-Small
# PaCa-ViT backbone + UperNet, ADE20k 512x512 crops, 160k iterations (paper Appendix B.3).
# Published: 51.4M params (aux head included), 242.7 GFLOPs, 47.6 mIoU.
# As in the released configs: drop path 0.1 for every size, and no lr multipliers (the
# paper's head/cluster lr x10 is only used with the PaCa head).
# Pretrained backbone: the released ImageNet-1k checkpoint (`pretrained`), downloaded once
# into torch's hub cache and read weights-only; a local copy instead:
# --cfg-options model.backbone.init_cfg.checkpoint=PATH. paca_mm re-initialises the
# cluster layers whose shape changes (100 -> 200 clusters).
pretrained = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_pacavit_small_p2cconv_100_0.pth'  # noqa
_base_ = [
    '../_base_/models/upernet_paca.py', '../_base_/datasets/ade20k.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_160k.py'
]
custom_imports = dict(imports=['paca_mm'], allow_failed_imports=False)
model = dict(
    backbone=dict(
        arch='pacavit_small_p2cconv_100_0',
        num_clusters=(200, 200, 200, 0),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 320, 384]),
    auxiliary_head=dict(in_channels=320))
