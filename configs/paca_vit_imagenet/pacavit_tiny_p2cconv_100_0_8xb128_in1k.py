# PaCa-Tiny (conv clustering, M = 100,100,100,0); paper top-1 80.9.
# Released weights: IMNET_224_pacavit_tiny_p2cconv_100_0.pth (official layout; convert with
# paca_mm.checkpoint.convert_official_to_classifier, see README.md here).
_base_ = [
    '../_base_/models/paca_vit_cls.py',
    '../_base_/datasets/imagenet_bs128_paca.py',
    '../_base_/schedules/imagenet_paca_300e.py',
    '../_base_/default_runtime_cls.py',
]

model = dict(
    backbone=dict(arch='pacavit_tiny_p2cconv_100_0', drop_path_rate=0.1),
    head=dict(in_channels=384),
)
