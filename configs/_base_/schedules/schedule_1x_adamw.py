# Detection 1x schedule of the PaCa-ViT Mask R-CNN configs (paper Appendix B.2): 12 epochs, AdamW
# lr 1e-4, betas (0.9, 0.999), weight decay 0.05 except on parameters whose name contains
# "norm" (every LayerNorm of PaCaViT; the FPN and R-CNN heads have no norm layers), linear
# warm-up over 500 iterations, lr x0.1 after epochs 8 and 11. Batch 16 = 8 GPUs x 2.
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=12, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
# fp16 AMP with a dynamic loss scale, as the official runs were launched (train_mmdet.sh
# passes --amp). On a machine without CUDA, tools/train.py and tools/test.py turn it into
# bf16 autocast (CPUAmpOptimWrapper); mmengine's AmpOptimWrapper itself requires a GPU.
optim_wrapper = dict(
    type='AmpOptimWrapper',
    loss_scale='dynamic',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))
# tools/train.py --auto-scale-lr rescales lr by (total batch size / 16)
auto_scale_lr = dict(enable=False, base_batch_size=16)
