# PaCa-ViT image classifier: backbone stage-4 map (already LayerNorm-ed by `norm4`)
# -> global average pooling (= the official token mean) -> Linear(C4 -> num_classes).
# Released ImageNet checkpoints load after the key remap
# `head.{weight,bias}` -> `head.fc.{weight,bias}`, backbone keys -> `backbone.*`
# (paca_mm.checkpoint.convert_official_to_classifier).
custom_imports = dict(imports=['paca_mm'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(type='PaCaViT', arch='tiny', out_indices=(3,), drop_path_rate=0.1),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=384,
        # smoothing 0.1; soft (mixup/cutmix) targets are smoothed as in timm
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        # official init of the head: trunc_normal(std=0.02), zero bias
        init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.),
        cal_acc=False),
    # timm mixup 0.8 / cutmix 1.0, prob 1.0, switch prob 0.5 (one of the two per batch)
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]),
)
