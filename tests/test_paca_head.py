"""PaCaHead (paper Sec. 3.4; the official head): structure, forward maths, losses, plumbing."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import ConfigDict
from mmengine.registry import init_default_scope
from mmengine.structures import PixelData
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample

import paca_mm  # noqa: F401  (registers PaCaHead & co.)
from paca_mm.models.decode_heads import PaCaEncoderDecoder, PaCaHead

TINY_DIMS = [96, 192, 320, 384]
BASE_DIMS = [96, 192, 384, 512]
BN = dict(type='BN', requires_grad=True)


def build_head(**kwargs):
    cfg = dict(type='PaCaHead', in_channels=TINY_DIMS, channels=256, num_classes=150,
               norm_cfg=BN)
    cfg.update(kwargs)
    return MODELS.build(cfg)


def pyramid(batch=2, size=64, dims=TINY_DIMS, seed=0):
    """Backbone-like maps at strides 4, 8, 16, 32 of a size x size image."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, c, size // s, size // s, generator=g)
            for c, s in zip(dims, (4, 8, 16, 32))]


def samples(batch=2, size=64, num_classes=150, ignore_frac=0.2, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batch):
        label = torch.randint(0, num_classes, (1, size, size), generator=g)
        label[torch.rand(1, size, size, generator=g) < ignore_frac] = 255
        s = SegDataSample(gt_sem_seg=PixelData(data=label))
        s.set_metainfo(dict(img_shape=(size, size), ori_shape=(size, size),
                            pad_shape=(size, size)))
        out.append(s)
    return out


def n_params(module):
    return sum(p.numel() for p in module.parameters())


# ----------------------------------------------------------------- structure
def test_registered_names():
    assert MODELS.get('PaCaHead') is PaCaHead
    assert MODELS.get('PaCaSegHead') is PaCaHead
    assert MODELS.get('PaCaEncoderDecoder') is PaCaEncoderDecoder
    from mmseg.models.segmentors import EncoderDecoder
    assert issubclass(PaCaEncoderDecoder, EncoderDecoder)
    assert 'forward' not in vars(PaCaEncoderDecoder)  # a pure alias


@pytest.mark.parametrize('dims', [TINY_DIMS, BASE_DIMS, (40, 80, 200, 330)])
def test_param_count(dims):
    """The official head's parameter count in closed form for D = 256, L = 150:
    256 * sum(in_channels) + 1,196,332 (tiny: 1,450,284; base: 1,499,436), also for channel
    counts no release uses."""
    head = build_head(in_channels=dims, norm_cfg=dict(type='SyncBN', requires_grad=True))
    assert n_params(head) == 256 * sum(dims) + 1_196_332


def expected_keys(num_levels=4):
    bn = ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
    keys = ['conv_seg.weight', 'conv_seg.bias']
    for i in range(num_levels):
        keys += [f'convs.{i}.conv.weight'] + [f'convs.{i}.bn.{b}' for b in bn]
    keys += ['q.0.conv.weight'] + [f'q.0.bn.{b}' for b in bn]
    keys += ['clustering.0.conv.weight'] + [f'clustering.0.bn.{b}' for b in bn]
    keys += ['clustering.1.weight', 'clustering.1.bias']
    for kv in 'kv':
        keys += [f'{kv}.0.weight', f'{kv}.0.bias'] + [f'{kv}.2.{b}' for b in bn]
    keys += ['proj.conv.weight'] + [f'proj.bn.{b}' for b in bn]
    return keys


def test_state_dict_keys_match_official_layout():
    sync = build_head(norm_cfg=dict(type='SyncBN', requires_grad=True))
    bn = build_head()
    assert list(sync.state_dict()) == expected_keys()
    assert list(bn.state_dict()) == expected_keys()
    # the norm of k/v follows norm_cfg (official: hard-coded SyncBN) under the same names
    assert isinstance(sync.k[2], nn.SyncBatchNorm)
    assert isinstance(bn.k[2], nn.BatchNorm1d) and isinstance(bn.v[2], nn.BatchNorm1d)
    # the official head's layer shapes
    assert tuple(bn.clustering[1].weight.shape) == (150, 256, 1, 1)
    assert bn.clustering[1].bias is not None
    assert tuple(bn.k[0].weight.shape) == (256, 1024)
    assert tuple(bn.q[0].conv.weight.shape) == (256, 1024, 1, 1)
    assert bn.convs[0].conv.bias is None  # conv followed by a norm
    assert isinstance(bn.dropout, nn.Dropout2d) and bn.dropout.p == 0.1
    # a SyncBN-trained state dict loads strictly into a BN head and vice versa
    bn.load_state_dict(sync.state_dict(), strict=True)
    sync.load_state_dict(bn.state_dict(), strict=True)


# ------------------------------------------------------------------- forward
def reference_forward(head, inputs):
    """Eqns. 9-14 written out with the head's own layers (eval mode, no dropout)."""
    size = inputs[0].shape[2:]
    feats = []
    for i, x in enumerate(inputs):
        f = head.convs[i].activate(head.convs[i].bn(head.convs[i].conv(x)))
        feats.append(f if i == 0 else F.interpolate(f, size=size, mode='bilinear',
                                                    align_corners=False))
    fmap = torch.cat(feats, 1)  # (B, 4D, H1, W1)
    B, C4, H, W = fmap.shape
    fseq = fmap.flatten(2).transpose(1, 2)  # (B, N1, 4D)
    s = head.clustering(fmap).flatten(2)  # (B, L, N1)
    assign = s.softmax(-1)  # Eqn. 9: softmax along N1
    q = head.q[0](fmap).flatten(2).transpose(1, 2)  # Eqn. 10 (B, N1, D)
    z = assign @ fseq  # Eqn. 11 (B, L, 4D)

    def linear_block(seq, t):  # Eqn. 12: Linear, BN1d over channels, ReLU
        t = seq[0](t)
        return F.relu(seq[2](t.transpose(1, 2)).transpose(1, 2))

    k, v = linear_block(head.k, z), linear_block(head.v, z)
    a = (q @ k.transpose(1, 2)).softmax(-1)  # Eqn. 13: unscaled, over L
    out = (a @ v).transpose(1, 2).reshape(B, -1, H, W)
    out = head.proj(out)
    return head.conv_seg(out)  # Eqn. 14


def test_forward_matches_equations():
    torch.manual_seed(0)
    head = build_head(num_classes=7, channels=32)
    # non-trivial BN statistics
    head.train()
    with torch.no_grad():
        head(pyramid(batch=3, size=64, seed=1))
    head.eval()
    inputs = pyramid(batch=2, size=64, seed=2)
    with torch.no_grad():
        out, clusters = head.forward_with_clusters(inputs)
        ref = reference_forward(head, inputs)
    assert out.shape == (2, 7, 16, 16) and clusters.shape == (2, 7, 16, 16)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    # a scaled attention (1/sqrt(D)) would give a different result
    head.k[0].weight.data *= 4
    with torch.no_grad():
        ref_scaled = reference_forward(head, inputs)
        out_scaled = head(inputs)
    torch.testing.assert_close(out_scaled, ref_scaled, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('size', [64, 72])
def test_output_shape_train_and_eval(size):
    head = build_head(num_classes=19)
    inputs = [torch.randn(2, c, math.ceil(size / s), math.ceil(size / s))
              for c, s in zip(TINY_DIMS, (4, 8, 16, 32))]
    head.train()
    out = head(inputs)
    assert isinstance(out, torch.Tensor)  # no (logits, clusters) tuple in training mode
    assert out.shape == (2, 19, math.ceil(size / 4), math.ceil(size / 4))
    head.eval()
    assert head(inputs).shape == out.shape


# --------------------------------------------------------------------- losses
def test_loss_keys_and_values():
    torch.manual_seed(0)
    head = build_head(num_classes=150)
    head.train()
    inputs, data = pyramid(), samples()
    losses = head.loss(inputs, data, train_cfg=dict())
    assert set(losses) == {'loss_ce', 'acc_seg', 'loss_paca', 'acc_paca'}
    # recompute the official auxiliary loss from the raw clustering logits; train-mode BN
    # uses batch statistics and dropout acts after the clustering, so this is repeatable
    with torch.no_grad():
        _, clusters = head.forward_with_clusters(inputs)
        label = torch.stack([d.gt_sem_seg.data for d in data]).squeeze(1)
        up = F.interpolate(clusters, size=label.shape[1:], mode='bilinear',
                           align_corners=False)
        expected = 0.4 * F.cross_entropy(up, label, ignore_index=255)
        losses = head.loss(inputs, data, train_cfg=dict())
    torch.testing.assert_close(losses['loss_paca'], expected, rtol=1e-5, atol=1e-6)
    # near-uniform clustering logits at init: about 0.4 * ln(150) ~ 2.0
    assert abs(losses['loss_paca'].item() - 0.4 * math.log(150)) < 0.3


def _clustering_grads(aux_weight):
    torch.manual_seed(0)
    head = build_head(num_classes=10, channels=64, dropout_ratio=0.,
                      aux_loss_decode=dict(type='CrossEntropyLoss', loss_weight=aux_weight,
                                           avg_non_ignore=True, loss_name='loss_paca'))
    head.train()
    losses = head.loss(pyramid(), samples(num_classes=10), train_cfg=dict())
    total = sum(v for k, v in losses.items() if 'loss' in k)
    total.backward()
    return {n: p.grad.clone() for n, p in head.named_parameters() if n.startswith('clustering')}


def test_aux_loss_changes_clustering_gradient():
    g0, g4, g1 = _clustering_grads(0.), _clustering_grads(0.4), _clustering_grads(1.0)
    w = 'clustering.1.weight'
    assert not torch.allclose(g0[w], g4[w])
    # the aux term is linear in its weight: g(0.4) - g(0) = 0.4 (g(1) - g(0))
    for name in g0:
        torch.testing.assert_close(g4[name] - g0[name], 0.4 * (g1[name] - g0[name]),
                                   rtol=1e-3, atol=1e-7)


def test_aux_loss_options():
    # official config: an unnamed CE aux loss collides with the main 'loss_ce' -> renamed
    head = build_head(aux_loss_decode=dict(type='CrossEntropyLoss', loss_weight=0.4))
    assert head.aux_loss_names == ['loss_paca_ce']
    losses = head.loss(pyramid(), samples(), dict())
    assert set(losses) == {'loss_ce', 'acc_seg', 'loss_paca_ce', 'acc_paca'}
    # a list of aux losses, and main loss lists
    head = build_head(
        loss_decode=[dict(type='CrossEntropyLoss', loss_weight=1.0),
                     dict(type='DiceLoss', loss_weight=0.5, loss_name='loss_dice')],
        aux_loss_decode=[dict(type='CrossEntropyLoss', loss_weight=0.4, loss_name='loss_paca'),
                         dict(type='DiceLoss', loss_weight=0.1, loss_name='loss_paca_dice')])
    losses = head.loss(pyramid(), samples(), dict())
    assert set(losses) == {'loss_ce', 'loss_dice', 'acc_seg', 'loss_paca', 'loss_paca_dice',
                           'acc_paca'}
    assert all(torch.isfinite(v).all() for v in losses.values())
    # two aux losses of one name are summed into it
    one, two = (build_head(dropout_ratio=0., aux_loss_decode=[
        dict(type='CrossEntropyLoss', loss_weight=w, loss_name='loss_paca') for w in ws])
        for ws in ([0.5], [0.4, 0.1]))
    two.load_state_dict(one.state_dict())
    l1, l2 = (h.loss(pyramid(), samples(), dict())['loss_paca'] for h in (one, two))
    torch.testing.assert_close(l2, l1)
    # disabled
    head = build_head(aux_loss_decode=None)
    assert set(head.loss(pyramid(), samples(), dict())) == {'loss_ce', 'acc_seg'}
    with pytest.raises(TypeError, match='aux_loss_decode'):
        build_head(aux_loss_decode='CrossEntropyLoss')


def test_sampler_and_align_corners():
    head = build_head(num_classes=5, align_corners=True,
                      sampler=dict(type='OHEMPixelSampler', thresh=0.7, min_kept=200))
    losses = head.loss(pyramid(), samples(num_classes=5), dict())
    assert set(losses) == {'loss_ce', 'acc_seg', 'loss_paca', 'acc_paca'}
    assert torch.isfinite(losses['loss_paca']) and losses['loss_paca'] > 0


def test_all_ignored_labels_give_zero_aux_loss():
    head = build_head(num_classes=5)
    data = samples(num_classes=5, ignore_frac=1.1)  # every pixel 255
    losses = head.loss(pyramid(), data, dict())
    assert losses['loss_paca'].item() == 0.0


# ------------------------------------------------------------------ validation
def test_bad_arguments():
    with pytest.raises(ValueError, match='num_classes'):
        build_head(num_classes=0)
    with pytest.raises(ValueError, match='in_channels'):
        build_head(in_channels=[96, 192], in_index=[0, 1, 2])
    with pytest.raises(ValueError, match='in_channels'):
        build_head(in_channels=96)
    for bad in ('256', []):  # a string is not a list of channel numbers ([2, 5, 6])
        with pytest.raises(ValueError, match='in_channels must be a non-empty list'):
            build_head(in_channels=bad)
    with pytest.raises(ValueError, match='input_transform'):
        build_head(input_transform='resize_concat')
    head = build_head()
    with pytest.raises(ValueError, match='in_channels'):  # wrong widths (base backbone)
        head(pyramid(dims=BASE_DIMS))
    with pytest.raises(ValueError, match='in_channels.*backbone returned 3'):  # too few
        head(pyramid()[:3])
    with pytest.raises(ValueError, match='norm_cfg'):
        build_head(norm_cfg=dict(type='LN'))


def test_subset_of_levels():
    head = build_head(in_channels=[192, 320, 384], in_index=[1, 2, 3], num_classes=3)
    out = head(pyramid())
    assert out.shape == (2, 3, 8, 8)  # the first *selected* level sets the grid
    # negative indices count from the last level, down to -len(inputs); one level is enough
    neg = build_head(in_channels=[192, 320, 384], in_index=[-3, -2, -1], num_classes=3)
    neg.load_state_dict(head.state_dict())
    assert torch.equal(neg.eval()(pyramid()), head.eval()(pyramid()))
    assert build_head(in_channels=[96], in_index=[-4])(pyramid()).shape == (2, 150, 16, 16)


def test_defaults_and_binary_head():
    """D = 256 as in the official head; num_classes=1 (mmseg's sigmoid binary head) is valid."""
    head = MODELS.build(dict(type='PaCaHead', in_channels=TINY_DIMS, num_classes=150,
                             norm_cfg=BN))
    assert head.channels == 256
    head = build_head(num_classes=1, loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=True))
    assert head(pyramid()).shape == (2, 1, 16, 16)


# ------------------------------------------------------------- full segmentor
@pytest.fixture(scope='module')
def segmentor():
    init_default_scope('mmseg')
    cfg = dict(
        type='PaCaEncoderDecoder',
        data_preprocessor=dict(type='SegDataPreProcessor', mean=[123.675, 116.28, 103.53],
                               std=[58.395, 57.12, 57.375], bgr_to_rgb=True, pad_val=0,
                               seg_pad_val=255, size=(64, 64)),
        backbone=dict(type='PaCaViT', arch='tiny', num_clusters=(200, 200, 200, 0),
                      drop_path_rate=0.1),
        decode_head=dict(type='PaCaSegHead', in_channels=TINY_DIMS, in_index=[0, 1, 2, 3],
                         channels=256, dropout_ratio=0.1, num_classes=150, norm_cfg=BN,
                         align_corners=False),
        train_cfg=ConfigDict(), test_cfg=ConfigDict(mode='whole'))
    return MODELS.build(cfg)


def test_tiny_plus_head_param_count(segmentor):
    assert n_params(segmentor) == 13_326_764  # the official code's count (ADE20k, 200 clusters)
    assert n_params(segmentor.decode_head) == 1_450_284


def _batch(size=64, n=2, num_classes=150):
    g = torch.Generator().manual_seed(0)
    data = samples(batch=n, size=size, num_classes=num_classes)
    inputs = [torch.randint(0, 256, (3, size, size), generator=g, dtype=torch.uint8)
              for _ in range(n)]
    return dict(inputs=inputs, data_samples=data)


def test_segmentor_loss_and_predict(segmentor):
    segmentor.train()
    data = segmentor.data_preprocessor(_batch(), True)
    losses = segmentor.loss(**data)
    assert set(losses) == {'decode.loss_ce', 'decode.acc_seg', 'decode.loss_paca',
                           'decode.acc_paca'}
    segmentor.eval()
    with torch.no_grad():
        preds = segmentor.test_step(_batch())
    assert len(preds) == 2 and all(isinstance(p, SegDataSample) for p in preds)
    assert preds[0].pred_sem_seg.data.shape == (1, 64, 64)
    assert preds[0].seg_logits.data.shape == (150, 64, 64)
    with torch.no_grad():
        logits = segmentor(torch.randn(1, 3, 64, 64), mode='tensor')
    assert logits.shape == (1, 150, 16, 16)


def test_stock_encoder_decoder_trains_with_changed_num_classes():
    init_default_scope('mmseg')
    cfg = dict(
        type='EncoderDecoder',
        data_preprocessor=dict(type='SegDataPreProcessor', size=(64, 64), pad_val=0,
                               seg_pad_val=255),
        backbone=dict(type='PaCaViT', arch=dict(embed_dims=(16, 32, 48, 64),
                                                depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4)),
                      num_clusters=(8, 8, 8, 0)),
        decode_head=dict(type='PaCaHead', in_channels=[16, 32, 48, 64], channels=32,
                         num_classes=5, norm_cfg=BN),
        train_cfg=ConfigDict(), test_cfg=ConfigDict(mode='whole'))
    model = MODELS.build(cfg)
    model.init_weights()
    from mmengine.optim import build_optim_wrapper
    optim = build_optim_wrapper(model, dict(optimizer=dict(type='AdamW', lr=1e-3)))
    before = copy.deepcopy(model.decode_head.clustering[1].weight.detach())
    model.train()
    log = model.train_step(_batch(num_classes=5), optim)
    assert {'loss', 'decode.loss_ce', 'decode.loss_paca'} <= set(log)
    assert not torch.equal(before, model.decode_head.clustering[1].weight)


def _label_samples(label):
    out = []
    for lab in label:
        s = SegDataSample(gt_sem_seg=PixelData(data=lab[None]))
        size = tuple(lab.shape)
        s.set_metainfo(dict(img_shape=size, ori_shape=size, pad_shape=size))
        out.append(s)
    return out


def test_configured_ignore_index_reaches_both_losses():
    # class 7 is a real class of the head; ignore_index=7 must drop it from both losses
    head = build_head(num_classes=10, ignore_index=7)
    assert head.ignore_index == 7
    g = torch.Generator().manual_seed(0)
    label = torch.full((2, 64, 64), 7, dtype=torch.long)
    label[:, 8:24, 16:40] = torch.randint(0, 7, (2, 16, 24), generator=g)
    inputs = pyramid()

    def run(ignore_index, lab):
        head.ignore_index = ignore_index
        torch.manual_seed(0)  # same dropout masks in every run
        return head.loss(inputs, _label_samples(lab), dict())

    got = run(7, label)
    relabelled = label.clone()
    relabelled[label == 7] = 255
    expected = run(255, relabelled)  # the same pixels ignored through the default 255
    counted = run(255, label)  # class 7 counted
    for key in ('loss_ce', 'loss_paca', 'acc_seg', 'acc_paca'):
        torch.testing.assert_close(got[key], expected[key], msg=key)
    for key in ('loss_ce', 'loss_paca'):
        assert not torch.allclose(got[key], counted[key]), key
    # and by hand: the aux loss is the CE of the upsampled clustering logits on the patch only
    head.ignore_index = 7
    with torch.no_grad():
        torch.manual_seed(0)
        _, clusters = head.forward_with_clusters(inputs)
        up = F.interpolate(clusters, size=label.shape[1:], mode='bilinear', align_corners=False)
        per_pixel = F.cross_entropy(up, label, ignore_index=7, reduction='none')
        assert per_pixel[label == 7].abs().max() == 0
        patch = per_pixel[:, 8:24, 16:40]
    # the default aux loss: weight 0.4, averaged over the non-ignored pixels
    torch.testing.assert_close(got['loss_paca'], 0.4 * patch.mean())


def test_sampler_weights_reach_both_losses(monkeypatch):
    head = build_head(num_classes=5,
                      sampler=dict(type='OHEMPixelSampler', thresh=0.7, min_kept=200))
    sampled, received = [], {}
    sample = head.sampler.sample

    def spy_sample(seg_logit, seg_label):
        w = sample(seg_logit, seg_label)
        sampled.append((seg_logit.shape[1], w))
        return w

    monkeypatch.setattr(head.sampler, 'sample', spy_sample)
    for name, loss_fn in (('main', head.loss_decode), ('aux', head.aux_loss_decode[0])):
        def spy(*args, _name=name, _fwd=loss_fn.forward, **kwargs):
            received[_name] = kwargs.get('weight')
            return _fwd(*args, **kwargs)
        monkeypatch.setattr(loss_fn, 'forward', spy)
    losses = head.loss(pyramid(), samples(num_classes=5), dict())
    assert torch.isfinite(losses['loss_paca'])
    assert len(sampled) == 2, 'the OHEM sampler must weight the main and the aux loss'
    assert received['main'] is sampled[0][1] and received['aux'] is sampled[1][1]
    for _, w in sampled:  # OHEM keeps some pixels and drops others
        assert w is not None and 0 < w.sum() < w.numel()
