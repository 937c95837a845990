# PaCa^ec-Tiny (ConvMixer teacher)
# PaCa-ViT backbone + PaCa head, ADE20k 512x512 crops, 160k iterations (paper Appendix B.3).
# In the official repository (pacahead_pacavit_convmixer_tiny_100_512x512_160k_ade20k.py)
# but not in the paper, and no ADE20k or ImageNet weights were released for it; the official
# config cannot be built (its backbone looks up the misspelt arch 'tiny_eacher').
# Train the ImageNet backbone first (configs/paca_vit_imagenet/
# pacavit_convmixer_tiny_100_8xb128_in1k.py) and save its backbone under the path below.
# paca_mm re-initialises the cluster layers whose shape changes (100 -> 200 clusters).
_base_ = [
    '../_base_/models/paca_head.py', '../_base_/datasets/ade20k.py',
    '../_base_/default_runtime_seg.py', '../_base_/schedules/schedule_160k_pacahead.py'
]
custom_imports = dict(imports=['paca_mm'], allow_failed_imports=False)
model = dict(
    backbone=dict(
        arch='pacavit_convmixer_tiny_100',
        num_clusters=(200, 200, 200, 200),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/IMNET_224_pacavit_convmixer_tiny_100.pth')),
    decode_head=dict(in_channels=[96, 192, 320, 384]))
