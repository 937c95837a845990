"""The model modules on every device and mode, and the explicit CPU inference pass
(paca_mm.fuse_for_cpu_inference): its preconditions, and outputs equal to the unfused
model's for every clustering kind, stage/block sharing, the teacher, odd sizes, and the
detector / segmentor / classifier that contain the backbone."""
import copy

import pytest
import torch

from paca_mm import fuse_for_cpu_inference
from paca_mm.models.backbones import PaCaViT
from paca_mm.models.layers import PaCaAttention, cluster_softmax

ARCH = dict(embed_dims=(16, 24, 32, 40), depths=(2, 1, 2, 1), num_heads=(1, 2, 4, 8))


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16])
def test_cluster_softmax_on_transposed_view(dtype):
    """The clustering modules return a (B, M, N) view of (B, N, M) memory; the softmax is
    over N, in float32 for half-precision logits (float64 stays float64)."""
    logits_nm = (torch.randn(2, 50, 7) * 4).to(dtype)
    view = logits_nm.transpose(1, 2)
    z = cluster_softmax(view)
    assert z.shape == (2, 7, 50)
    assert z.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    ref = torch.softmax(view.contiguous().to(z.dtype), dim=-1)
    torch.testing.assert_close(z, ref)
    torch.testing.assert_close(z.sum(-1), torch.ones(2, 7, dtype=z.dtype))


def test_cluster_softmax_is_stable_and_differentiable():
    logits_nm = torch.randn(2, 300, 5) * 1e4
    z = cluster_softmax(logits_nm.transpose(1, 2))
    assert torch.isfinite(z).all()
    torch.testing.assert_close(z.sum(-1), torch.ones(2, 5))
    t = torch.randn(1, 9, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: cluster_softmax(a.transpose(1, 2)), (t,))


def test_backbone_under_inference_mode():
    """inference_mode (also a model built there) gives the no_grad outputs."""
    torch.manual_seed(0)
    model = PaCaViT('tiny').eval()
    x = torch.randn(2, 3, 96, 80)
    with torch.no_grad():
        ref = model(x)
    with torch.inference_mode():
        out = model(x)
        built_here = PaCaViT('tiny').eval()
        built_here.load_state_dict(model.state_dict())
        out2 = built_here(x)
    for r, a, b in zip(ref, out, out2):
        torch.testing.assert_close(a, r)
        torch.testing.assert_close(b, r)


def test_hooks_and_replaced_linears_are_called():
    """The attention calls its modules: a forward hook on q / proj fires, and a replaced k
    (e.g. an adapter) is called, in eval + no_grad as in training."""

    class Doubled(torch.nn.Linear):
        calls = 0

        def forward(self, x):
            Doubled.calls += 1
            return 2 * super().forward(x)

    torch.manual_seed(0)
    attn = PaCaAttention(16, 2, 5, 'conv').eval()
    x = torch.randn(1, 12, 16)
    expected = copy.deepcopy(attn)
    seen = []
    for name in ('q', 'proj'):
        getattr(attn, name).register_forward_hook(lambda m, i, o, n=name: seen.append(n))
    with torch.no_grad():
        expected.k.weight.mul_(2)
        expected.k.bias.mul_(2)
        ref = expected(x, (3, 4))[0]
    k = Doubled(16, 16)
    k.load_state_dict(attn.k.state_dict())
    attn.k = k
    with torch.no_grad():
        out = attn(x, (3, 4))[0]
    assert Doubled.calls == 1 and seen == ['q', 'proj']
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('kwargs', [
    dict(num_clusters=(8, 8, 8, 0)),
    dict(num_clusters=(4, 4, 4, 4), clustering='mlp', cluster_sharing='block'),
    dict(num_clusters=(4, 4, 4, 4), clustering='linear'),
    dict(num_clusters=(4, 4, 4, 4), teacher=dict(depths=(1,) * 4)),
], ids=['conv', 'mlp-block', 'linear', 'teacher'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16], ids=['fp32', 'fp16'])
def test_backbone_on_a_non_cpu_device(kwargs, dtype):
    """Off the CPU (CUDA; the meta device stands in here, CI has no GPU) the backbone runs in
    inference, training and backward, and the clustering softmax returns float32 for fp16
    weights."""
    arch = dict(embed_dims=(32, 64, 96, 128), depths=(1, 2, 2, 1), num_heads=(1, 2, 4, 8))
    model = PaCaViT(arch=arch, **kwargs).to('meta', dtype)
    x = torch.randn(1, 3, 96, 128, device='meta', dtype=dtype)
    model.eval()
    with torch.inference_mode():
        outs = model(x)
    assert [tuple(o.shape) for o in outs] == [
        (1, 32, 24, 32), (1, 64, 12, 16), (1, 96, 6, 8), (1, 128, 3, 4)]
    assert all(o.device.type == 'meta' and o.dtype == dtype for o in outs)
    layer = PaCaAttention(32, 2, 4, kwargs.get('clustering', 'conv')).to('meta', dtype).eval()
    with torch.inference_mode():
        _, z, _ = layer(torch.randn(1, 24 * 32, 32, device='meta', dtype=dtype), (24, 32))
    assert z.dtype == torch.float32
    model.train()
    outs = model(x)
    sum(o.float().mean() for o in outs).backward()
    assert all(p.grad is not None and p.grad.device.type == 'meta'
               for p in model.parameters() if p.requires_grad)


# ------------------------------------------------------------- the CPU inference pass
def _model(**kwargs):
    torch.manual_seed(0)
    return PaCaViT(arch=ARCH, **kwargs).eval()


@pytest.mark.parametrize('kwargs', [
    dict(num_clusters=(5, 4, 3, 0)),
    dict(num_clusters=(5, 4, 3, 2), clustering='mlp'),
    dict(num_clusters=(5, 4, 3, 2), clustering='linear'),
    dict(num_clusters=(5, 4, 3, 0), cluster_sharing='block'),
    dict(num_clusters=(5, 4, 3, 2), cluster_sharing=[2, 1, 'stage', 'block']),
    dict(num_clusters=(5, 4, 3, 2), teacher=dict(depths=(1,) * 4)),
], ids=['conv', 'mlp', 'linear', 'blockwise', 'mixed-sharing', 'teacher'])
@pytest.mark.parametrize('hw', [(45, 38), (64, 64)])
def test_fused_backbone_equals_unfused(kwargs, hw):
    model = _model(**kwargs)
    x = torch.randn(2, 3, *hw)
    with torch.no_grad():
        ref = model(x)
        fused = fuse_for_cpu_inference(copy.deepcopy(model))
        out = fused(x)
    assert len(out) == len(ref)
    for r, o in zip(ref, out):
        assert ((o - r).norm() / r.norm()).item() < 1e-5


def test_fuse_returns_the_model_and_checks_preconditions():
    model = _model(num_clusters=(5, 4, 3, 0))
    assert fuse_for_cpu_inference(model) is model
    with pytest.raises(ValueError, match=r'training mode; call model.eval\(\)'):
        fuse_for_cpu_inference(_model(num_clusters=(5, 4, 3, 0)).train())
    with pytest.raises(ValueError, match=r'torch.float64.*model.float\(\)'):
        fuse_for_cpu_inference(_model(num_clusters=(5, 4, 3, 0)).double())
    with pytest.raises(ValueError, match=r'on meta.*model.cpu\(\)'):
        fuse_for_cpu_inference(_model(num_clusters=(5, 4, 3, 0)).to('meta'))
    with pytest.raises(ValueError, match='contains no PaCaViT'):
        fuse_for_cpu_inference(torch.nn.Linear(2, 2).eval())

    class MyAttention(PaCaAttention):
        pass
    model = _model(num_clusters=(5, 4, 3, 0))
    model.stage1[0].attn.__class__ = MyAttention
    with pytest.raises(ValueError, match=r'stage1\.0\.attn is a MyAttention'):
        fuse_for_cpu_inference(model)


def test_fuse_in_a_segmentor_and_a_detector():
    """The pass finds the backbone inside whole models and leaves their outputs unchanged."""
    pytest.importorskip('mmseg')
    pytest.importorskip('mmdet')
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS as SEG
    import paca_mm  # noqa: F401
    init_default_scope('mmseg')
    backbone = dict(type='PaCaViT', arch=ARCH, num_clusters=(5, 4, 3, 0))
    seg = SEG.build(dict(
        type='EncoderDecoder', backbone=backbone,
        data_preprocessor=dict(type='SegDataPreProcessor'),
        decode_head=dict(type='FCNHead', in_channels=40, in_index=3, channels=8, num_convs=1,
                         num_classes=3, norm_cfg=dict(type='BN')))).eval()
    x = torch.randn(1, 3, 45, 38)
    with torch.no_grad():
        ref = seg(x, mode='tensor')
        out = fuse_for_cpu_inference(seg)(x, mode='tensor')
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    from mmdet.registry import MODELS as DET
    init_default_scope('mmdet')
    neck = DET.build(dict(type='FPN', in_channels=list(ARCH['embed_dims']), out_channels=8,
                          num_outs=4))
    det_like = torch.nn.Sequential(PaCaViT(arch=ARCH, num_clusters=(5, 4, 3, 0)), neck).eval()
    with torch.no_grad():
        ref = det_like(x)
        out = fuse_for_cpu_inference(det_like)(x)
    for r, o in zip(ref, out):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('B', [1, 2])
def test_token_maps_are_channels_last_views(B):
    """tokens_to_map is a view with channels_last strides, also for B = 1, so the model's
    convs (FFN depth-wise, clustering, transitions) run channels_last without copying their
    input; map_to_tokens of their output is a view again (no layout copies, issue 20)."""
    from paca_mm.models.layers.common import map_to_tokens, tokens_to_map
    x = torch.randn(B, 7 * 5, 16)
    m = tokens_to_map(x, (7, 5))
    assert m.shape == (B, 16, 7, 5) and m.data_ptr() == x.data_ptr()
    assert m.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(m, x.transpose(1, 2).reshape(B, 16, 7, 5))
    conv = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
    with torch.no_grad():
        y = conv(m)
    assert y.is_contiguous(memory_format=torch.channels_last)
    t = map_to_tokens(y)
    assert t.is_contiguous() and t.data_ptr() == y.data_ptr()
