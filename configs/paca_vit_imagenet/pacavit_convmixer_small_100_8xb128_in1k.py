# PaCa^ec-Small (ConvMixer clustering teacher, M = 100 x 4); paper top-1 83.17.
# Released weights: IMNET_224_pacavit_convmixer_small_100.pth (official layout; convert with
# paca_mm.checkpoint.convert_official_to_classifier, see README.md here).
_base_ = [
    '../_base_/models/paca_vit_cls.py',
    '../_base_/datasets/imagenet_bs128_paca.py',
    '../_base_/schedules/imagenet_paca_300e.py',
    '../_base_/default_runtime_cls.py',
]

model = dict(
    backbone=dict(arch='pacavit_convmixer_small_100', drop_path_rate=0.1),
    head=dict(in_channels=384),
)
