# 160k iterations, AdamW (lr 6e-5, wd 0.01, no decay on norms), linear warm-up for 1500
# iterations, then poly decay (power 1) to 0 (paper Appendix B.3).
# The official runs use 8 GPUs x 2 images and fp16 AMP with a dynamic loss scale
# (train_mmseg.sh passes --amp), so AMP is the default here. On a machine without CUDA,
# tools/train.py and tools/test.py turn it into bf16 autocast (CPUAmpOptimWrapper);
# mmengine's AmpOptimWrapper itself requires a GPU.
optimizer = dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01)
optim_wrapper = dict(
    type='AmpOptimWrapper',
    loss_scale='dynamic',
    optimizer=optimizer,
    clip_grad=None,
    # 'norm' matches the backbone LayerNorms (norm1/norm2/cluster_norm/norm{i});
    # norm_decay_mult catches the other norm layers (e.g. the teacher's BNs).
    paramwise_cfg=dict(norm_decay_mult=0., custom_keys={'norm': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=1500, end=160000),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=160000, val_interval=16000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=16000),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
