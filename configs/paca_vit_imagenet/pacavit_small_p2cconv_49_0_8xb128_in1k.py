# Ablation: PaCa-Small, M = 49,49,49,0; paper top-1 82.95.
# Released weights: IMNET_224_pacavit_small_p2cconv_49_0.pth (official layout; convert with
# paca_mm.checkpoint.convert_official_to_classifier, see README.md here).
_base_ = [
    '../_base_/models/paca_vit_cls.py',
    '../_base_/datasets/imagenet_bs128_paca.py',
    '../_base_/schedules/imagenet_paca_300e.py',
    '../_base_/default_runtime_cls.py',
]

model = dict(
    backbone=dict(arch='pacavit_small_p2cconv_49_0', drop_path_rate=0.1),
    head=dict(in_channels=384),
)
