"""PaCaViT: presets, parameter counts, shapes, options, and checkpoint loading."""
import copy
import logging

import pytest
import torch
from mmengine.model import BaseModule

from paca_mm.checkpoint import CheckpointError, load_backbone_checkpoint
from paca_mm.models.backbones import PRESETS, PaCaViT
from paca_mm.models.layers import PaCaAttention

TINY_ARCH = dict(embed_dims=(16, 32, 48, 64), depths=(1, 2, 1, 1), num_heads=(1, 2, 4, 8))


def n_params(m):
    return sum(p.numel() for p in m.parameters())


# Official parameter counts, measured from the official code (the paper's Table 1: 12.2M,
# 22.0M, 46.9M, 22.6M).
IMAGENET_PARAMS = {  # backbone + 1000-way linear classifier on the last stage
    'pacavit_tiny_p2cconv_100_0': 12_200_680,
    'pacavit_small_p2cconv_100_0': 22_037_704,
    'pacavit_base_p2cconv_100_0': 46_911_304,
    'pacavit_small_p2cmlp_100_0': 22_637_268,
    'pacavit_small_p2cconv_2_0': 21_978_120,
    'pacavit_small_p2cconv_49_0': 22_006_696,
    'pacavit_small_p2cconv_49_100': 22_227_560,
    'pacavit_small_p2cconv_100_49': 22_210_696,
    'pacavit_small_p2cconv_100': 22_245_448,
    'pacavit_small_p2cconv_100_blockwise': 24_191_944,
    'pacavit_convmixer_tiny_100': 12_483_672,
    'pacavit_convmixer_small_100': 21_075_064,
    'pacavit_convmixer_base_100': 47_659_192,
}
KEY_COUNTS = {'pacavit_tiny_p2cconv_100_0': 237, 'pacavit_small_p2cconv_100_0': 415,
              'pacavit_convmixer_small_100': 553}
ADE_PARAMS = {  # downstream backbone with the ADE20k override to 200 clusters
    'pacavit_tiny_p2cconv_100_0': ((200, 200, 200, 0), 11_876_480),
    'pacavit_small_p2cmlp_100_0': ((200, 200, 200, 0), 22_495_768),
    'pacavit_small_p2cconv_100_blockwise': ((200,) * 4, 24_328_544),
    'pacavit_convmixer_small_100': ((200,) * 4, 20_789_664),
}


@pytest.mark.parametrize('name', sorted(IMAGENET_PARAMS))
def test_imagenet_param_counts(name):
    model = PaCaViT(arch=name)
    c4 = model.embed_dims[-1]
    total = n_params(model) + c4 * 1000 + 1000
    assert total == IMAGENET_PARAMS[name]
    if name in KEY_COUNTS:  # official key count minus head.weight/bias
        assert len(model.state_dict()) == KEY_COUNTS[name]


def test_aliases_and_downstream_names():
    assert n_params(PaCaViT(arch='tiny')) == 11_815_680  # downstream PaCa-Tiny (official code)
    assert n_params(PaCaViT(arch='pacavit_tiny_p2cconv_100_0_downstream')) == 11_815_680
    assert n_params(PaCaViT(arch='ec_small')) == 21_075_064 - 385_000


@pytest.mark.parametrize('name', sorted(ADE_PARAMS))
def test_ade20k_cluster_override_param_counts(name):
    clusters, expected = ADE_PARAMS[name]
    assert n_params(PaCaViT(arch=name, num_clusters=clusters)) == expected


def test_presets_cover_the_release():
    assert set(PRESETS) == set(IMAGENET_PARAMS)


def test_imagenet_classifier_through_mmpretrain():
    from mmpretrain.registry import MODELS

    import paca_mm  # noqa: F401
    clf = MODELS.build(dict(
        type='ImageClassifier', backbone=dict(type='PaCaViT', arch='tiny', out_indices=(3,)),
        neck=dict(type='GlobalAveragePooling'),
        head=dict(type='LinearClsHead', num_classes=1000, in_channels=384)))
    assert n_params(clf) == 12_200_680


@pytest.mark.parametrize('clustering', ['conv', 'mlp', 'linear'])
@pytest.mark.parametrize('out_indices', [(0, 1, 2, 3), (3,), (1, 2), 2, (-1,)])
def test_output_shapes(clustering, out_indices):
    model = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 0), clustering=clustering,
                    out_indices=out_indices).eval()
    outs = model(torch.randn(2, 3, 64, 96))
    idx = [out_indices] if isinstance(out_indices, int) else [i % 4 for i in out_indices]
    assert len(outs) == len(idx)
    for o, i in zip(outs, idx):
        # plain NCHW memory: mmcv ops such as RoIAlign ignore strides
        assert o.is_contiguous()
        s = 4 * 2 ** i
        assert o.shape == (2, TINY_ARCH['embed_dims'][i], 64 // s, 96 // s)


@pytest.mark.parametrize('hw', [(1, 1), (33, 47), (97, 65), (224, 200)])
def test_odd_input_sizes_and_batch_one(hw):
    import math
    model = PaCaViT(arch=TINY_ARCH, num_clusters=(3, 3, 3, 3)).eval()
    outs = model(torch.randn(1, 3, *hw))
    h, w = math.ceil(math.ceil(hw[0] / 2) / 2), math.ceil(math.ceil(hw[1] / 2) / 2)
    for i, o in enumerate(outs):
        assert o.shape == (1, TINY_ARCH['embed_dims'][i], h, w)
        assert torch.isfinite(o).all()
        h, w = math.ceil(h / 2), math.ceil(w / 2)


def test_real_tiny_at_512_shapes():
    model = PaCaViT(arch='tiny').eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 256, 256))
    assert [tuple(o.shape) for o in outs] == [(1, 96, 64, 64), (1, 192, 32, 32),
                                              (1, 320, 16, 16), (1, 384, 8, 8)]


def test_train_and_eval_agree_without_drop_path():
    model = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 0), drop_path_rate=0.)
    x = torch.randn(2, 3, 32, 32)
    model.train()
    a = model(x)
    model.eval()
    b = model(x)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v)


@pytest.mark.parametrize('clustering', ['conv', 'mlp', 'linear'])
def test_assignment_softmax_sums_to_one_over_n(clustering):
    attn = PaCaAttention(32, 4, num_clusters=5, clustering=clustering)
    x = torch.randn(2, 6 * 7, 32)
    out, z, logits = attn(x, (6, 7))
    assert out.shape == x.shape and z.shape == (2, 5, 42) and logits.shape == (2, 5, 42)
    torch.testing.assert_close(z.sum(-1), torch.ones(2, 5))
    assert z.dtype == torch.float32


def test_cluster_logits_recorded_from_one_pass():
    model = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 5, 6, 0)).eval()
    model.record_clusters = True
    outs = model(torch.randn(2, 3, 64, 64))
    logits = model.cluster_logits
    assert [None if c is None else tuple(c.shape) for c in logits] == [
        (2, 4, 16, 16), (2, 5, 8, 8), (2, 6, 4, 4), None]
    assert outs[0].shape[-2:] == logits[0].shape[-2:]
    teacher = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 4),
                      teacher=dict(depths=(1, 1, 1, 1))).eval()
    teacher.record_clusters = True
    teacher(torch.randn(1, 3, 32, 32))
    assert all(c is not None and c.shape[1] == 4 for c in teacher.cluster_logits)


def test_blockwise_and_teacher_structure():
    bw = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 4), cluster_sharing='block')
    assert all(blk.attn.owns_clustering for blk in bw.stage2)
    sw = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 4))
    assert [blk.attn.owns_clustering for blk in sw.stage2] == [True, False]
    t = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 4), teacher=dict(depths=(1, 1, 1, 1)))
    assert not any(blk.attn.owns_clustering for s in range(1, 5)
                   for blk in getattr(t, f'stage{s}'))
    assert list(t.state_dict())[0].startswith('paca_teacher.')


def _frozen_by_name(name, k):
    """Whether ``frozen_stages=k`` freezes parameter ``name``: the stem, and for each stage
    s <= k its blocks, its norm, the transition into it and the teacher's block{s},
    transition{s}, lateral{s}, fpn{s} and to_clusters{s}."""
    if name.startswith('patch_embed.'):
        return True
    for s in range(1, k + 1):
        prefixes = [f'stage{s}.', f'norm{s}.'] + [f'transition{s - 1}.'] * (s > 1) + [
            f'paca_teacher.{m}{s}.' for m in ('block', 'transition', 'lateral', 'fpn',
                                              'to_clusters')]
        if name.startswith(tuple(prefixes)):
            return True
    return False


@pytest.mark.parametrize('teacher', [False, True], ids=['plain', 'teacher'])
@pytest.mark.parametrize('frozen', [0, 1, 2, 3, 4])
def test_frozen_stages_have_no_gradient(frozen, teacher):
    model = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 0), frozen_stages=frozen,
                    teacher=dict(depths=(1,) * 4) if teacher else False)
    model.train()
    if frozen == 4:  # everything frozen
        assert not any(p.requires_grad for p in model.parameters())
        assert not any(o.requires_grad for o in model(torch.randn(1, 3, 32, 32)))
        return
    sum(o.sum() for o in model(torch.randn(2, 3, 32, 32))).backward()
    names = [name for name, _ in model.named_parameters()]
    assert any(n.startswith('paca_teacher.lateral1.') for n in names) == teacher
    for name, p in model.named_parameters():
        if _frozen_by_name(name, frozen):
            assert not p.requires_grad and p.grad is None, name
        else:
            assert p.requires_grad and p.grad is not None, name
    if frozen >= 1:
        assert not model.stage1.training
        assert not teacher or not model.paca_teacher.block1.training


def test_norm_eval_keeps_teacher_bn_in_eval():
    default = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 4), teacher=dict(depths=(1,) * 4))
    default.train()  # norm_eval is off by default: the teacher's BNs train
    assert all(m.training for m in default.modules() if isinstance(m, torch.nn.BatchNorm2d))
    model = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 4), teacher=dict(depths=(1,) * 4),
                    norm_eval=True)
    model.train()
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns)
    before = bns[0].running_mean.clone()
    model(torch.randn(2, 3, 32, 32))
    torch.testing.assert_close(bns[0].running_mean, before)


def test_with_cp_same_output_and_grads(monkeypatch):
    from paca_mm.models.backbones import paca_vit
    calls = []

    def spy(fn, *args, **kwargs):
        calls.append(fn)
        return checkpoint(fn, *args, **kwargs)

    checkpoint = paca_vit.cp.checkpoint
    monkeypatch.setattr(paca_vit.cp, 'checkpoint', spy)
    torch.manual_seed(0)
    a = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 0))  # with_cp is off by default
    b = copy.deepcopy(a)
    b.with_cp = True
    x = torch.randn(2, 3, 32, 32)
    la = sum(o.sum() for o in a(x))
    assert calls == []
    lb = sum(o.sum() for o in b(x))
    assert len(calls) == sum(TINY_ARCH['depths'])  # one checkpointed call per block
    la.backward()
    lb.backward()
    torch.testing.assert_close(la, lb)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


# ------------------------------------------------------------------ registries


@pytest.mark.parametrize('scope', ['mmpretrain', 'mmdet', 'mmseg'])
def test_builds_in_every_registry(scope):
    import importlib

    import paca_mm  # noqa: F401
    registry = importlib.import_module(f'{scope}.registry').MODELS
    model = registry.build(dict(type='PaCaViT', arch=TINY_ARCH))
    assert isinstance(model, PaCaViT)
    other = {'mmpretrain': 'mmdet', 'mmdet': 'mmseg', 'mmseg': 'mmpretrain'}[scope]
    model = registry.build(dict(type=f'{other}.PaCaViT', arch=TINY_ARCH))
    assert isinstance(model, PaCaViT)


def test_import_survives_missing_toolbox(monkeypatch):
    import importlib

    from paca_mm import registry
    real = importlib.import_module

    def fake_import_module(name, *args):
        if name.startswith('mmpretrain'):
            raise ImportError(f'No module named {name!r} (simulated)')
        return real(name, *args)

    monkeypatch.setattr(registry.importlib, 'import_module', fake_import_module)
    monkeypatch.setattr(registry, 'REGISTERED', {})
    monkeypatch.setattr(registry, 'MISSING', {})
    registry.register_all()
    assert 'mmpretrain' in registry.MISSING
    assert 'mmdet' in registry.REGISTERED and 'mmseg' in registry.REGISTERED


# ------------------------------------------------------------------ checkpoints


def _official_style_file(tmp_path, model, with_head=True):
    sd = dict(model.state_dict())
    if with_head:
        sd['head.weight'] = torch.randn(10, model.embed_dims[-1])
        sd['head.bias'] = torch.randn(10)
    path = tmp_path / 'IMNET_224_model.pth'
    torch.save(sd, path)
    return str(path)


def test_state_dict_transfers_between_presets():
    src = PaCaViT(arch='pacavit_small_p2cmlp_100_0')
    dst = PaCaViT(arch='small_mlp')
    dst.load_state_dict(src.state_dict(), strict=True)
    for (k, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert torch.equal(a, b), k


def test_init_weights_loads_pretrained_after_random_init(tmp_path):
    src = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 0))
    path = _official_style_file(tmp_path, src)

    class Wrapper(BaseModule):  # what mmengine's Runner does: init_weights() on the parent
        def __init__(self):
            super().__init__()
            self.backbone = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 0),
                                    init_cfg=dict(type='Pretrained', checkpoint=path))

    w = Wrapper()
    w.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(w.backbone.state_dict()[k], v), k
    # mmengine's contract: once initialised (is_init), a parent's init_weights() skips it
    w = Wrapper()
    w.backbone.init_weights()
    with torch.no_grad():
        for p in w.backbone.parameters():
            p.zero_()  # e.g. changed since
    w.init_weights()
    assert not any(p.any() for p in w.backbone.parameters())


def test_missing_checkpoint_is_an_error(tmp_path):
    model = PaCaViT(arch=TINY_ARCH, init_cfg=dict(type='Pretrained',
                                                  checkpoint=str(tmp_path / 'nope.pth')))
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        model.init_weights()


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _logged(fn):
    """Run fn() and return what it logged through mmengine's current logger."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    handler = _Collect()
    logger.addHandler(handler)
    try:
        fn()
    finally:
        logger.removeHandler(handler)
    return '\n'.join(handler.lines)


def test_cluster_count_change_100_to_200(tmp_path):
    src = PaCaViT(arch='tiny')  # (100, 100, 100, 0)
    path = _official_style_file(tmp_path, src)
    dst = PaCaViT(arch='tiny', num_clusters=(200, 200, 200, 0),
                  init_cfg=dict(type='Pretrained', checkpoint=path))
    text = _logged(dst.init_weights)
    assert 'cluster count changed' in text
    assert 'stage1.0.attn.clustering.clustering.4.weight' in text
    changed = {f'stage{s}.0.attn.clustering.clustering.4.weight' for s in (1, 2, 3)}
    sd = dst.state_dict()
    for k, v in src.state_dict().items():
        if k in changed:
            assert sd[k].shape == (200,) + v.shape[1:]
        else:
            assert torch.equal(sd[k], v), k


def test_cluster_count_change_adds_a_clustered_stage(tmp_path):
    src = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 0))
    dst = PaCaViT(arch=TINY_ARCH, num_clusters=(8, 8, 8, 8))
    report = load_backbone_checkpoint(dst, src.state_dict())
    assert not report['missing'] and not report['unexpected'] and not report['mismatched']
    assert any(k.startswith('stage4.0.attn.clustering') for k, _, _ in report['reinit'])


def test_wrong_variant_is_reported(tmp_path):
    src = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 0))
    other = dict(TINY_ARCH, embed_dims=(16, 32, 64, 64))
    dst = PaCaViT(arch=other, num_clusters=(4, 4, 4, 0))
    report = load_backbone_checkpoint(dst, src.state_dict())
    assert any(k.startswith('stage3.0.attn.q.weight') for k, _, _ in report['mismatched'])
    with pytest.raises(CheckpointError, match='size mismatch'):
        load_backbone_checkpoint(dst, src.state_dict(), strict=True)


def test_mmengine_layout_with_prefixes(tmp_path):
    src = PaCaViT(arch=TINY_ARCH)
    ckpt = {'meta': {'epoch': 3}, 'state_dict': {
        **{f'module.backbone.{k}': v for k, v in src.state_dict().items()},
        'module.neck.lateral.weight': torch.zeros(1)}}
    dst = PaCaViT(arch=TINY_ARCH)
    report = load_backbone_checkpoint(dst, ckpt, strict=True)
    assert not any(report[k] for k in ('missing', 'unexpected', 'mismatched', 'reinit'))
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v)


def test_smoke_demo_runs(capsys):
    import runpy
    import sys
    argv = sys.argv
    sys.argv = ['smoke.py', '--sizes', '64x96', '33x47']
    try:
        import os.path as osp
        root = osp.dirname(osp.dirname(osp.abspath(__file__)))
        runpy.run_path(osp.join(root, 'demo', 'smoke.py'), run_name='__main__')
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    assert '11.816 M parameters' in out
    assert 'input 64x96' in out and '(1, 384, 2, 3)' in out
