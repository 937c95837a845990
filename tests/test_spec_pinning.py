"""Pins every per-block and per-stage setting of the official code (its model definitions,
``_arch_settings`` and weight init; docs/differences.md lists where we differ), so that a
change to any of them fails a test.

What is pinned here, and how:
* per block: the LayerNorm eps (1e-6: ``norm1_before``, ``norm2_before``, ``cluster_norm``),
  the stochastic-depth rate (linear from 0 to ``drop_path_rate`` over all blocks, both
  branches of a block at the same rate, no DropPath where the rate is 0), layer scale, and
  which blocks own a clustering module for every ``cluster_sharing`` form;
* per stage: embedding dims, heads, FFN width, clustering kernel, cluster count, the stage
  norms and the stem / transition convs and norms;
* the training branch of every block kind (onsite clustering, shared assignment, plain
  attention, teacher assignment) with drop path and layer scale on, by an identity that
  holds only if each residual is kept: with every DropPath replaced by a spy that scales by
  ``s`` and ``layer_scale = 1 / s``, the train-mode output equals the plain model's;
* the cluster-count adaptation for every clustering kind and the teacher, through
  ``init_cfg`` (``init_weights``) and through ``tools/convert_official_checkpoint.py``.
"""

import pytest
import torch
import torch.nn as nn

from paca_mm.checkpoint import cluster_count_keys
from paca_mm.models.backbones import PaCaViT
from paca_mm.models.backbones.paca_vit import ARCH_SETTINGS, PRESETS
from paca_mm.models.layers import PaCaAttention

TINY_ARCH = dict(embed_dims=(8, 16, 24, 32), depths=(1, 4, 3, 1), num_heads=(1, 2, 4, 4))


def _blocks(model, i):
    return list(getattr(model, f'stage{i + 1}'))


def _drop_paths(module):
    """The stochastic-depth modules directly inside one block (by class name, so both
    mmcv's and timm's DropPath count)."""
    return [m for m in module.modules() if type(m).__name__ == 'DropPath']


def _onsite(model, i, j):
    prefix = f'stage{i + 1}.{j}.attn.clustering.'
    return any(k.startswith(prefix) for k in model.state_dict())


# ------------------------------------------------------------------ per-block settings
@pytest.mark.parametrize('name', sorted(PRESETS))
def test_every_layernorm_has_eps_1e6(name):
    model = PaCaViT(arch=name)
    norms = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    # norm1_before, norm2_before in every block, cluster_norm where M > 0, norm1..4, and the
    # LayerNorm2d (a LayerNorm over channels) of the stem and the three transitions
    expected = sum(2 * d for d in model.depths) + 4 + 4 + sum(
        d for d, m in zip(model.depths, model.num_clusters) if m > 0)
    assert len(norms) == expected, [n for n, _ in norms]
    assert {m.eps for _, m in norms} == {1e-6}
    # the LayerNorm2d of the stem and the transitions (timm style, over channels)
    for name2 in ['patch_embed.norm'] + [f'transition{i}.norm' for i in (1, 2, 3)]:
        norm2d = model.get_submodule(name2)
        assert norm2d.eps == 1e-6, name2


@pytest.mark.parametrize('name', ['pacavit_tiny_p2cconv_100_0', 'pacavit_base_p2cconv_100_0',
                                  'pacavit_convmixer_small_100'])
def test_drop_path_schedule_is_linear_over_all_blocks(name):
    model = PaCaViT(arch=name)
    rate = ARCH_SETTINGS[PRESETS[name]['arch']]['drop_path_rate']
    assert model.drop_path_rate == rate
    depths = model.depths
    expected = torch.linspace(0, rate, sum(depths)).tolist()
    seen, k = [], 0
    for i, d in enumerate(depths):
        for block in _blocks(model, i):
            probs = {m.drop_prob for m in _drop_paths(block)}
            if expected[k] == 0:
                assert probs == set(), f'block {k}: rate 0 must be Identity, got {probs}'
                seen.append(0.)
            else:
                # both residual branches of the block at the same rate
                assert len(probs) == 1, f'block {k}: {probs}'
                seen.append(probs.pop())
            k += 1
    assert seen == pytest.approx(expected, rel=1e-6, abs=0)


def test_drop_path_rate_argument_overrides_the_arch():
    model = PaCaViT(arch=TINY_ARCH, drop_path_rate=0.3)
    probs = [max([m.drop_prob for m in _drop_paths(b)] or [0.])
             for i in range(4) for b in _blocks(model, i)]
    assert probs == pytest.approx(torch.linspace(0, 0.3, 9).tolist(), rel=1e-6, abs=0)


def test_layer_scale_off_by_default_and_initialised_when_on():
    plain = PaCaViT(arch='tiny')
    assert not [k for k in plain.state_dict() if 'gamma' in k]
    scaled = PaCaViT(arch=TINY_ARCH, layer_scale=1e-5)
    gammas = {k: v for k, v in scaled.state_dict().items() if 'gamma' in k}
    assert len(gammas) == 2 * sum(TINY_ARCH['depths'])
    for k, v in gammas.items():
        i = int(k.split('.')[0][len('stage'):]) - 1
        assert v.shape == (TINY_ARCH['embed_dims'][i],) and torch.all(v == 1e-5), k


def _expected_onsite(every, depth):
    if every == 0:
        return [j == 0 for j in range(depth)]
    return [j % every == 0 for j in range(depth)]


@pytest.mark.parametrize('sharing, every', [
    ('stage', [0] * 4), (0, [0] * 4), ('block', [1] * 4), (1, [1] * 4), (2, [2] * 4),
    (3, [3] * 4), (['stage', 'block', 2, 3], [0, 1, 2, 3]), ([1, 0, 3, 'stage'], [1, 0, 3, 0])])
def test_which_blocks_own_clustering(sharing, every):
    arch = dict(embed_dims=(8, 16, 24, 32), depths=(4, 5, 6, 3), num_heads=(1, 2, 4, 4))
    model = PaCaViT(arch=arch, num_clusters=(3, 3, 3, 3), cluster_sharing=sharing)
    for i, d in enumerate(arch['depths']):
        got = [_onsite(model, i, j) for j in range(d)]
        assert got == _expected_onsite(every[i], d), (i, got)
        # cluster_norm in every block of a clustered stage, onsite or not
        for j in range(d):
            assert f'stage{i + 1}.{j}.attn.cluster_norm.weight' in model.state_dict()


def test_shared_blocks_reuse_the_last_onsite_assignment():
    """With k = 2, block 1 reuses block 0's assignment and block 3 block 2's: the
    recorded logits of the onsite blocks are what the next block's z is made of."""
    arch = dict(embed_dims=(8, 16, 24, 32), depths=(4, 1, 1, 1), num_heads=(1, 2, 4, 4))
    model = PaCaViT(arch=arch, num_clusters=(3, 3, 3, 3), cluster_sharing=2).eval()
    seen = []
    blocks = _blocks(model, 0)
    hooks = [b.attn.register_forward_hook(lambda m, a, o, j=j: seen.append((j, o)))
             for j, b in enumerate(blocks)]
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    for h in hooks:
        h.remove()
    zs = {}
    for j, out in seen:
        z = [t for t in out if torch.is_tensor(t) and t.dim() == 3 and t.shape[1] == 3]
        assert z, f'block {j} returned no (B, M, N) assignment'
        zs[j] = z[0]
    assert torch.equal(zs[0], zs[1]) and torch.equal(zs[2], zs[3])
    assert not torch.allclose(zs[0], zs[2])


def test_teacher_blocks_own_no_clustering():
    model = PaCaViT(arch='pacavit_convmixer_tiny_100')
    for i, d in enumerate(model.depths):
        assert not any(_onsite(model, i, j) for j in range(d))
        assert f'paca_teacher.to_clusters{i + 1}.weight' in model.state_dict()


def test_plain_attention_stage_has_no_cluster_layers():
    model = PaCaViT(arch='small')  # 100, 100, 100, 0
    keys = [k for k in model.state_dict() if k.startswith('stage4.')]
    assert keys and not [k for k in keys if 'cluster' in k]


# ------------------------------------------------------------------ per-stage settings
# the official ``_arch_settings``: embed_dims, depths, teacher_depths, drop_path_rate
OFFICIAL_ARCHS = {
    'tiny': ((96, 192, 320, 384), (2, 2, 4, 2), None, 0.1),
    'small': ((96, 192, 320, 384), (3, 3, 10, 3), None, 0.1),
    'base': ((96, 192, 384, 512), (3, 3, 18, 3), None, 0.5),
    'tiny_teacher': ((96, 192, 320, 384), (2, 2, 2, 2), (2, 2, 2, 2), 0.1),
    'small_teacher': ((96, 192, 320, 384), (3, 3, 7, 3), (2, 2, 2, 2), 0.1),
    'base_teacher': ((96, 192, 384, 512), (3, 3, 16, 3), (2, 2, 4, 2), 0.1),
}


def test_custom_arch_defaults():
    """A custom arch dict gets the documented defaults: (100, 100, 100, 0) clusters, conv
    clustering shared per stage, mlp ratio 4, no drop path, 7x7 clustering kernels."""
    model = PaCaViT(arch=TINY_ARCH)
    assert model.num_clusters == [100, 100, 100, 0]
    assert model.clustering == 'conv' and model.cluster_every == [0, 0, 0, 0]
    assert model.drop_path_rate == 0 and model.teacher_cfg is None
    for i, c in enumerate(TINY_ARCH['embed_dims']):
        block = _blocks(model, i)[0]
        assert block.mlp.fc1.out_features == 4 * c
        if i < 3:
            assert block.attn.clustering.clustering[0].kernel_size == (7, 7)


def test_scalar_settings_apply_to_every_stage():
    """num_heads, mlp_ratios and num_clusters may be one value for all stages."""
    model = PaCaViT(arch=dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), num_heads=2,
                              mlp_ratios=2), num_clusters=3)
    assert model.num_clusters == [3, 3, 3, 3]
    for i, c in enumerate((8, 16, 24, 32)):
        block = _blocks(model, i)[0]
        assert block.attn.num_heads == 2 and block.mlp.fc1.out_features == 2 * c
        assert block.attn.clustering.clustering[-1].out_channels == 3


def test_layer_defaults():
    """The public layers' defaults are the paper's: a 7x7 clustering conv, an MLP ratio of
    4 (FFN and MLP clustering), no dropout."""
    from paca_mm.models.layers import ConvFFN
    ffn = ConvFFN(8)
    assert ffn.fc1.out_features == 32 and ffn.drop.p == 0
    conv = PaCaAttention(8, 2, 3)
    assert conv.clustering.clustering[0].kernel_size == (7, 7)
    assert conv.attn_drop == 0 and conv.proj_drop.p == 0
    mlp = PaCaAttention(8, 2, 3, clustering='mlp')
    assert mlp.clustering.clustering[0].out_features == 32


def test_arch_table_is_the_spec():
    """The arch table itself, value by value (the tests above read it to build their
    expectations, so they cannot notice a wrong entry in it)."""
    assert sorted(ARCH_SETTINGS) == sorted(OFFICIAL_ARCHS)
    for name, (dims, depths, teacher_depths, rate) in OFFICIAL_ARCHS.items():
        setting = ARCH_SETTINGS[name]
        assert tuple(setting['embed_dims']) == dims, name
        assert tuple(setting['depths']) == depths, name
        assert setting.get('teacher_depths') == teacher_depths, name
        assert setting['drop_path_rate'] == rate, name
        assert tuple(setting['num_heads']) == (2, 4, 8, 16), name
        assert tuple(setting['mlp_ratios']) == (4, 4, 4, 4), name
        model = PaCaViT(arch=name)
        assert model.drop_path_rate == rate
        if teacher_depths:
            assert tuple(model.teacher_cfg['depths']) == teacher_depths


@pytest.mark.parametrize('name', sorted(PRESETS))
def test_per_stage_shapes(name):
    model = PaCaViT(arch=name)
    setting = ARCH_SETTINGS[PRESETS[name]['arch']]
    sd = model.state_dict()
    assert model.embed_dims == list(setting['embed_dims'])
    assert model.depths == list(setting['depths'])
    assert model.num_clusters == list(PRESETS[name]['num_clusters'])
    stem = sd['patch_embed.proj.0.weight'], sd['patch_embed.proj.1.weight']
    c1 = setting['embed_dims'][0]
    assert stem[0].shape == (c1 // 2, 3, 3, 3) and stem[1].shape == (c1, c1 // 2, 3, 3)
    for conv in (model.patch_embed.proj[0], model.patch_embed.proj[1]):
        assert conv.stride == (2, 2) and conv.padding == (1, 1) and conv.bias is not None
    for i, (c, heads, m) in enumerate(zip(setting['embed_dims'], setting['num_heads'],
                                          model.num_clusters)):
        assert heads == (2, 4, 8, 16)[i]
        for j, block in enumerate(_blocks(model, i)):
            p = f'stage{i + 1}.{j}.'
            assert block.attn.num_heads == heads
            for name2 in ('q', 'k', 'v', 'proj'):
                assert sd[p + f'attn.{name2}.weight'].shape == (c, c)
                assert sd[p + f'attn.{name2}.bias'].shape == (c,)
            assert sd[p + 'mlp.fc1.weight'].shape == (4 * c, c)
            assert sd[p + 'mlp.dwconv.dwconv.weight'].shape == (4 * c, 1, 3, 3)
            assert sd[p + 'mlp.fc2.weight'].shape == (c, 4 * c)
            if _onsite(model, i, j):
                kind = PRESETS[name]['clustering']
                if kind == 'conv':
                    assert sd[p + 'attn.clustering.clustering.0.weight'].shape == (c, 1, 7, 7)
                    assert sd[p + 'attn.clustering.clustering.2.weight'].shape == (c, c, 1, 1)
                    assert sd[p + 'attn.clustering.clustering.4.weight'].shape == (m, c, 1, 1)
                    assert p + 'attn.clustering.clustering.4.bias' not in sd
                else:
                    assert sd[p + 'attn.clustering.clustering.0.weight'].shape == (4 * c, c)
                    assert sd[p + 'attn.clustering.clustering.2.weight'].shape == (m, 4 * c)
                    assert sd[p + 'attn.clustering.clustering.2.bias'].shape == (m,)
        norm = getattr(model, f'norm{i + 1}')
        assert norm.normalized_shape == (c,) and norm.eps == 1e-6
        if i < 3:
            t = getattr(model, f'transition{i + 1}')
            assert t.proj.weight.shape == (setting['embed_dims'][i + 1], c, 3, 3)
            assert t.proj.stride == (2, 2) and t.proj.padding == (1, 1)
            assert t.proj.bias is not None


def test_teacher_settings():
    """The official ConvMixer teacher: units with a 7x7 depth-wise conv, transitions that
    blur with the fixed binomial [[1,2,1],[2,4,2],[1,2,1]]/16 (a buffer in the state_dict,
    so a checkpoint overwrites it, but a model trained from scratch starts from it) before
    a k3 s2 p1 conv, and the arch's units per stage."""
    model = PaCaViT(arch='pacavit_convmixer_tiny_100')
    teacher, sd = model.paca_teacher, model.state_dict()
    binomial = torch.tensor([[1., 2., 1.], [2., 4., 2.], [1., 2., 1.]]) / 16
    for i, c in enumerate(model.embed_dims):
        units = getattr(teacher, f'block{i + 1}')
        assert len(units) == ARCH_SETTINGS['tiny_teacher']['teacher_depths'][i]
        for unit in units:
            dw = unit[0].fn[0]
            assert dw.kernel_size == (7, 7) and dw.padding == (3, 3) and dw.groups == c
        if i < 3:
            blur = sd[f'paca_teacher.transition{i + 1}.0.blur_filter']
            assert torch.equal(blur, binomial.expand(c, 1, 3, 3))
            conv = getattr(teacher, f'transition{i + 1}')[0].conv
            assert conv.kernel_size == (3, 3) and conv.stride == (2, 2)
            assert conv.padding == (1, 1)


def test_teacher_config_defaults():
    """teacher=dict(...) without depths gets 2 units per stage; without kernel_size, 7."""
    model = PaCaViT(arch=TINY_ARCH, num_clusters=(2, 2, 2, 2), teacher=dict(kernel_size=5))
    assert [len(getattr(model.paca_teacher, f'block{s}')) for s in range(1, 5)] == [2] * 4
    assert model.paca_teacher.block1[0][0].fn[0].kernel_size == (5, 5)
    model = PaCaViT(arch=TINY_ARCH, num_clusters=(2, 2, 2, 2), teacher=dict(depths=(1, 2, 1, 1)))
    assert [len(getattr(model.paca_teacher, f'block{s}')) for s in range(1, 5)] == [1, 2, 1, 1]
    assert model.paca_teacher.block2[1][0].fn[0].kernel_size == (7, 7)


def test_teacher_forward_is_the_spec():
    """The official teacher: ``out_i`` = stage i's ConvMixer units (after the transitions),
    ``f_4 = out_4``, ``f_i = fpn_i(out_i + lateral_i(upsample(f_{i+1})))`` with bilinear,
    align_corners=False upsampling to out_i's size, the logits ``to_clusters_i(f_i)`` and
    their softmax over the patches;
    a stage with M = 0 has no to_clusters and no assignment. Checked at an odd size, with
    random BN statistics, so that every term matters."""
    import torch.nn.functional as F

    from paca_mm.models.backbones.paca_teacher import ConvMixerTeacher
    torch.manual_seed(0)
    teacher = ConvMixerTeacher((8, 16, 24, 32), (3, 0, 1, 2), depths=(1, 2, 1, 1),
                               kernel_size=7).eval()
    for m in teacher.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.normal_()
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.)
    x = torch.randn(2, 8, 13, 18)
    with torch.no_grad():
        zs, logits, tokens = teacher(x)
        outs, h = [], x
        for s in range(1, 5):
            h = getattr(teacher, f'block{s}')(h)
            outs.append(h)
            if s < 4:
                h = getattr(teacher, f'transition{s}')(h)
        f = [None, None, None, outs[3]]
        for i in (2, 1, 0):
            up = F.interpolate(f[i + 1], size=outs[i].shape[-2:], mode='bilinear',
                               align_corners=False)
            f[i] = getattr(teacher, f'fpn{i + 1}')(outs[i] + getattr(teacher,
                                                                     f'lateral{i + 1}')(up))
    assert teacher.to_clusters2 is None and zs[1] is None and logits[1] is None
    for i in (0, 2, 3):
        head = getattr(teacher, f'to_clusters{i + 1}')
        assert head.kernel_size == (1, 1) and head.out_channels == (3, 0, 1, 2)[i]
        expected = head(f[i]).flatten(2)
        torch.testing.assert_close(logits[i], expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(zs[i], expected.softmax(-1), rtol=1e-6, atol=1e-6)
    for t, o in zip(tokens, outs):
        torch.testing.assert_close(t, o.flatten(2).transpose(1, 2), rtol=0, atol=0)


def test_random_init_is_the_spec():
    """The official init: Linear weights trunc_normal(std=0.02), Conv2d weights normal(0,
    sqrt(2 / fan_out)) with fan_out = k_h * k_w * out_channels / groups, zero biases, and
    LayerNorm / BatchNorm weights 1 and biases 0."""
    torch.manual_seed(0)
    model = PaCaViT(arch='pacavit_convmixer_tiny_100')
    model.init_weights()
    checked = {nn.Linear: 0, nn.Conv2d: 0}
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            if m.bias is not None:
                assert torch.all(m.bias == 0), name
            if m.weight.numel() < 20000:
                continue  # too few samples for a 5 % std estimate
            if isinstance(m, nn.Linear):
                std = 0.02
            else:
                std = (2 / (m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                            // m.groups)) ** 0.5
            assert abs(m.weight.std().item() / std - 1) < 0.05, name
            assert abs(m.weight.mean().item()) < 0.05 * std, name
            checked[type(m)] += 1
        elif isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0), name
    assert checked[nn.Linear] > 10 and checked[nn.Conv2d] > 10, checked


# ------------------------------------------------------------------ training branches
class _ScaleSpy(nn.Module):
    """Stands in for DropPath: multiplies by ``scale`` and counts its calls."""

    def __init__(self, scale, calls):
        super().__init__()
        self.scale, self.calls = scale, calls

    def forward(self, x):
        self.calls.append(x.shape)
        return x * self.scale


def _replace_drop_paths(model, scale, calls):
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child).__name__ == 'DropPath':
                setattr(module, child_name, _ScaleSpy(scale, calls))


@pytest.mark.parametrize('kwargs', [
    dict(num_clusters=(3, 3, 3, 0), cluster_sharing='stage'),           # onsite, shared, M=0
    dict(num_clusters=(3, 0, 3, 3), cluster_sharing='block', clustering='mlp'),
    dict(num_clusters=(3, 3, 3, 3), cluster_sharing=2, clustering='linear'),
    dict(num_clusters=(3, 3, 3, 3), teacher=dict(depths=(1, 1, 1, 1))),  # teacher's z
])
def test_training_branches_keep_every_residual(kwargs):
    """x + dp(g * a) and x + dp(g * f) with dp = ·s and g = 1/s is the plain block. A block
    whose residual is dropped (or whose scale lands on the residual) breaks the equality."""
    torch.manual_seed(0)
    scale = 4.0
    plain = PaCaViT(arch=TINY_ARCH, **kwargs)
    scaled = PaCaViT(arch=TINY_ARCH, drop_path_rate=0.5, layer_scale=1 / scale, **kwargs)
    sd = {k: v for k, v in scaled.state_dict().items() if 'gamma' in k}
    sd.update(plain.state_dict())
    scaled.load_state_dict(sd)
    first = scaled.get_submodule('stage1.0')  # rate 0: no DropPath, so no 1/s to undo
    assert not _drop_paths(first)
    first.gamma1.data.fill_(1.)
    first.gamma2.data.fill_(1.)
    calls = []
    _replace_drop_paths(scaled, scale, calls)
    plain.train()
    scaled.train()
    x = torch.randn(2, 3, 40, 56)
    ref = plain(x)
    out = scaled(x)
    # the first block has rate 0 (Identity): every other block's two branches went through
    assert len(calls) == 2 * (sum(TINY_ARCH['depths']) - 1)
    for r, o in zip(ref, out):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-6)
    # and the branches really are scaled: with another scale the outputs differ
    scaled.get_submodule('stage2.0').gamma1.data.mul_(2)
    assert not torch.allclose(scaled(x)[1], ref[1], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ cluster-count adaptation
ADAPT_CASES = {
    'conv': dict(clustering='conv'),
    'mlp': dict(clustering='mlp'),
    'linear': dict(clustering='linear'),
    'blockwise': dict(clustering='conv', cluster_sharing='block'),
    'teacher': dict(teacher=dict(depths=(1, 1, 1, 1))),
}


def _cluster_keys_expected(model, kind):
    """The tensors that depend on M, written out from the official code."""
    keys = set()
    last = {'conv': ['4.weight'], 'mlp': ['2.weight', '2.bias'], 'linear': ['0.weight'],
            'blockwise': ['4.weight']}
    for i, d in enumerate(model.depths):
        if kind == 'teacher':
            keys |= {f'paca_teacher.to_clusters{i + 1}.weight',
                     f'paca_teacher.to_clusters{i + 1}.bias'}
            continue
        for j in range(d):
            if _onsite(model, i, j):
                keys |= {f'stage{i + 1}.{j}.attn.clustering.clustering.{s}' for s in last[kind]}
    return keys


def _save(path, sd):
    torch.save({'state_dict': sd, 'meta': {'epoch': 1}}, str(path))


@pytest.mark.parametrize('kind', sorted(ADAPT_CASES))
def test_cluster_count_change_through_init_cfg(tmp_path, kind):
    torch.manual_seed(0)
    src = PaCaViT(arch=TINY_ARCH, num_clusters=(4, 4, 4, 4), **ADAPT_CASES[kind])
    ckpt = tmp_path / 'src.pth'
    _save(ckpt, src.state_dict())
    dst = PaCaViT(arch=TINY_ARCH, num_clusters=(8, 8, 8, 8), **ADAPT_CASES[kind],
                  init_cfg=dict(type='Pretrained', checkpoint=str(ckpt)))
    expected = _cluster_keys_expected(dst, kind)
    assert cluster_count_keys(dst.state_dict()) == expected
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    dst.init_weights()
    after = dst.state_dict()
    src_sd = src.state_dict()
    for k, v in after.items():
        if k in expected:
            assert v.shape[0] == 8 and src_sd[k].shape[0] == 4, k
        else:
            assert torch.equal(v, src_sd[k]), f'{k} was not loaded from the checkpoint'
    # the re-initialised weights got a fresh random init, not the checkpoint's or zeros
    for k in expected:
        if k.endswith('weight'):
            assert after[k].abs().sum() > 0 and not torch.equal(after[k][:4], src_sd[k]), k
    assert before.keys() == after.keys()


@pytest.mark.parametrize('teacher', [False, True], ids=['onsite', 'teacher'])
@pytest.mark.parametrize('src_m, dst_m', [((4, 4, 4, 0), (4, 4, 4, 4)),
                                          ((4, 4, 4, 4), (4, 4, 4, 0))], ids=['gain', 'lose'])
def test_plain_stage_gains_or_loses_clustering(src_m, dst_m, teacher):
    """A stage that goes from plain attention (M = 0) to clusters, or back, is a cluster-count
    change: its clustering tensors (and the teacher's to_clusters) are re-initialised or
    dropped, nothing is reported missing or unexpected, everything else loads."""
    from paca_mm.checkpoint import match_state_dict
    kwargs = dict(teacher=dict(depths=(1, 1, 1, 1))) if teacher else {}
    src = PaCaViT(arch=TINY_ARCH, num_clusters=src_m, **kwargs).state_dict()
    dst = PaCaViT(arch=TINY_ARCH, num_clusters=dst_m, **kwargs).state_dict()
    report = match_state_dict(dst, src)
    assert report['missing'] == report['unexpected'] == report['mismatched'] == []
    changed = set(src) ^ set(dst)
    assert changed and {k for k, _, _ in report['reinit']} == changed
    assert all(k.startswith(('stage4.', 'paca_teacher.to_clusters4.')) for k in changed)
    assert any(k.startswith('paca_teacher.') for k in changed) == teacher
    assert set(report['load']) == set(src) & set(dst)


CONVERTER_PRESETS = {'conv': 'pacavit_tiny_p2cconv_100_0', 'mlp': 'pacavit_small_p2cmlp_100_0',
                     'blockwise': 'pacavit_small_p2cconv_100_blockwise',
                     'teacher': 'pacavit_convmixer_tiny_100'}


@pytest.mark.parametrize('kind', sorted(CONVERTER_PRESETS))
def test_cluster_count_change_through_the_converter(tmp_path, kind, load_tool):
    """An official-layout file (a plain state_dict) with 4 clusters per stage converted for
    the released preset with 8: only the M-dependent tensors change. (No release uses
    linear clustering, so the converter's presets have none; init_cfg covers it above.)"""
    torch.manual_seed(0)
    preset = CONVERTER_PRESETS[kind]
    stages = [m > 0 for m in PRESETS[preset]['num_clusters']]
    src = PaCaViT(arch=preset, num_clusters=[4 if s else 0 for s in stages])
    official = tmp_path / 'official.pth'
    torch.save(src.state_dict(), str(official))
    target = [8 if s else 0 for s in stages]
    out = tmp_path / 'converted.pth'
    # in-process (tests/test_errors.py runs the command line)
    load_tool('convert_official_checkpoint').main(
        [str(official), str(out), '--arch', preset, '--num-clusters', *map(str, target)])
    converted = torch.load(str(out), map_location='cpu', weights_only=True)['state_dict']
    dst = PaCaViT(arch=preset, num_clusters=target)
    dst.load_state_dict(converted, strict=True)
    expected = _cluster_keys_expected(dst, kind)
    assert expected and cluster_count_keys(converted) == expected
    src_sd = src.state_dict()
    for k, v in converted.items():
        if k in expected:
            assert v.shape[0] == 8 and src_sd[k].shape[0] == 4, k
        else:
            assert torch.equal(v, src_sd[k]), k
