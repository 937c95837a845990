# PaCa-ViT ImageNet-1k schedule (paper Appendix B.1, Table 5): AdamW, 300 epochs, cosine with
# 5 linear warm-up epochs. lr 5e-4 is the value for a total batch of 512 and is scaled
# linearly with the real total batch (auto_scale_lr, enabled as timm always does):
# 8 GPUs x 128 = 1024 images -> lr 1e-3, warm-up start 1e-6, final lr 1e-5.
optim_wrapper = dict(
    type='AmpOptimWrapper',  # the released models were trained with AMP
    optimizer=dict(type='AdamW', lr=5e-4, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    # timm's default filter: no weight decay on 1-D parameters (biases and norm weights)
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, flat_decay_mult=0.0),
)

param_scheduler = [
    # warm-up from warmup_lr 5e-7 (= 1e-3 x lr), updated every iteration
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    # cosine to min_lr 5e-6 (= 0.01 x lr; a ratio, so it scales with auto_scale_lr)
    dict(type='CosineAnnealingLR', eta_min_ratio=1e-2, by_epoch=True, begin=5, end=300,
         convert_to_iter_based=True),
]

train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
val_cfg = dict()
test_cfg = dict()

# lr above is for a total batch of 512; the Runner multiplies it by real_batch / 512.
auto_scale_lr = dict(base_batch_size=512, enable=True)
