# PaCa^ec-Base (ConvMixer clustering teacher, M = 100 x 4); paper top-1 84.22.
# drop path 0.1 is the official base_teacher arch value; grad clip 1.0 as for PaCa-Base.
# Released weights: IMNET_224_pacavit_convmixer_base_100.pth (official layout; convert with
# paca_mm.checkpoint.convert_official_to_classifier, see README.md here).
_base_ = [
    '../_base_/models/paca_vit_cls.py',
    '../_base_/datasets/imagenet_bs128_paca.py',
    '../_base_/schedules/imagenet_paca_300e.py',
    '../_base_/default_runtime_cls.py',
]

model = dict(
    backbone=dict(arch='pacavit_convmixer_base_100', drop_path_rate=0.1),
    head=dict(in_channels=512),
)

# paper Table 5: gradient clipping (norm 1.0) for the Base models
optim_wrapper = dict(clip_grad=dict(max_norm=1.0, norm_type=2))
