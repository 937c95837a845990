"""Inference-only fast paths compute the same function as the training path:
the banded CPU FFN (ConvFFN.forward_banded) and the strided cluster softmax."""
import pytest
import torch

from paca_mm.models.backbones import PaCaViT
from paca_mm.models.layers import ConvFFN, PaCaAttention, cluster_softmax


def _ffn(dim=8, seed=0):
    torch.manual_seed(seed)
    ffn = ConvFFN(dim, mlp_ratio=3)
    with torch.no_grad():  # non-trivial biases so that every bias path is exercised
        for p in ffn.parameters():
            p.normal_(0, 0.3)
    return ffn.eval()


@pytest.mark.parametrize('hw,rows', [((7, 5), 1), ((7, 5), 2), ((7, 5), 3), ((7, 5), 6),
                                     ((2, 9), 1), ((13, 1), 4)])
@pytest.mark.parametrize('with_residual', [False, True])
@pytest.mark.parametrize('fused_conv_gelu', [True, False])
def test_banded_ffn_equals_unbanded(hw, rows, with_residual, fused_conv_gelu, monkeypatch):
    from paca_mm.models.layers import common
    if fused_conv_gelu and not common._FUSED_CONV_GELU:
        pytest.skip('this torch build has no oneDNN fused conv + GELU')
    monkeypatch.setattr(common, '_FUSED_CONV_GELU', fused_conv_gelu)
    ffn = _ffn()
    x = torch.randn(2, hw[0] * hw[1], 8)
    res = torch.randn(2, hw[0] * hw[1], 8)
    with torch.no_grad():
        ref = ffn.dwconv(ffn.fc1(x), hw)
        ref = ffn.fc2(torch.nn.functional.gelu(ref))
        if with_residual:
            ref = ref + res
        r = res.clone() if with_residual else None
        out = ffn.forward_banded(x, hw, rows, residual=r)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    if with_residual:
        assert out.data_ptr() == r.data_ptr()  # written into the residual in place


@pytest.mark.parametrize('hw,rows', [((7, 5), 1), ((7, 5), 2), ((7, 5), 6), ((8, 3), 3),
                                     ((2, 9), 1)])
def test_banded_ffn_pre_norm_into_its_own_input(hw, rows):
    """residual=x, pre_norm=LN (as PaCaBlock calls it): every input row is read before the
    same row of the output overwrites it."""
    ffn = _ffn()
    norm = torch.nn.LayerNorm(8)
    with torch.no_grad():
        norm.weight.normal_(1, 0.2)
        norm.bias.normal_(0, 0.2)
        x = torch.randn(2, hw[0] * hw[1], 8)
        ref = ffn.fc2(torch.nn.functional.gelu(ffn.dwconv(ffn.fc1(norm(x)), hw))) + x
        y = x.clone()
        out = ffn.forward_banded(y, hw, rows, residual=y, pre_norm=norm)
    assert out.data_ptr() == y.data_ptr()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_band_selection(monkeypatch):
    ffn = _ffn()
    x = torch.randn(1, 6 * 4, 8)
    calls = []
    real = ConvFFN.forward_banded

    def spy(self, *args, **kwargs):
        calls.append(args[2])  # (x, hw, rows, residual)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(ConvFFN, 'forward_banded', spy)
    row_bytes = 4 * ffn.fc1.out_features * 4
    monkeypatch.setattr(ConvFFN, 'band_bytes', 2 * row_bytes)
    with torch.no_grad():
        ffn(x, (6, 4))
    assert calls == [2]  # 2 rows of hidden activations per band
    monkeypatch.setattr(ConvFFN, 'band_bytes', 6 * row_bytes)
    with torch.no_grad():
        ffn(x, (6, 4))  # one band would be the whole map: unbanded
        ffn.train()
        ffn(x, (6, 4))  # training mode (dropout)
        ffn.eval()
        with torch.autocast('cpu', dtype=torch.bfloat16):
            ffn(x, (6, 4))
    monkeypatch.setattr(ConvFFN, 'band_bytes', 1)
    ffn(x, (6, 4))  # autograd needed
    assert calls == [2]


def test_backbone_banded_equals_unbanded(monkeypatch):
    torch.manual_seed(0)
    model = PaCaViT(arch=dict(embed_dims=(16, 24, 32, 40), depths=(2, 1, 2, 1),
                              num_heads=(1, 2, 4, 8)), num_clusters=(5, 4, 3, 0)).eval()
    x = torch.randn(2, 3, 45, 38)
    with torch.no_grad():
        monkeypatch.setattr(ConvFFN, 'band_bytes', 1 << 62)
        ref = model(x)
        monkeypatch.setattr(ConvFFN, 'band_bytes', 1)
        out = model(x)
    for r, o in zip(ref, out):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
    # training (autograd) through the same blocks still works and matches in eval mode
    out_grad = model(x)
    for r, o in zip(ref, out_grad):
        torch.testing.assert_close(o.detach(), r, rtol=1e-5, atol=1e-5)
    sum(o.sum() for o in out_grad).backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
def test_cluster_softmax_on_transposed_view(dtype):
    logits_nm = torch.randn(2, 50, 7, dtype=dtype)  # (B, N, M) memory
    view = logits_nm.transpose(1, 2)  # (B, M, N), as the clustering modules return
    z = cluster_softmax(view)
    ref = torch.softmax(view.contiguous().float() if dtype == torch.bfloat16
                        else view.contiguous(), dim=-1)
    assert z.shape == (2, 7, 50)
    assert z.dtype == (torch.float32 if dtype == torch.bfloat16 else dtype)
    torch.testing.assert_close(z, ref)
    torch.testing.assert_close(z.sum(-1), torch.ones(2, 7, dtype=z.dtype))


def test_cluster_softmax_gradient_through_view():
    logits_nm = torch.randn(1, 9, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: cluster_softmax(t.transpose(1, 2)), (logits_nm,))


def test_flop_count_independent_of_banding(monkeypatch):
    """The FLOP counter traces the plain FFN even where inference would run banded."""
    from paca_mm.utils.flops import count
    model = PaCaViT(arch='tiny')
    monkeypatch.setattr(ConvFFN, 'band_bytes', 1 << 62)
    ref = count(model, (torch.randn(1, 3, 96, 128),))['flops']
    monkeypatch.setattr(ConvFFN, 'band_bytes', 1)
    assert count(model, (torch.randn(1, 3, 96, 128),))['flops'] == ref


@pytest.mark.parametrize('requires_grad', [False, True])
def test_tokens_to_nchw(requires_grad):
    from paca_mm.models.layers.common import tokens_to_map, tokens_to_nchw
    x = torch.randn(2, 7 * 5, 3, requires_grad=requires_grad)
    with torch.set_grad_enabled(requires_grad):  # inference: the chunked copy
        out = tokens_to_nchw(x, (7, 5), chunk=3)
    assert out.is_contiguous() and out.shape == (2, 3, 7, 5)
    assert torch.equal(out, tokens_to_map(x, (7, 5)))
    if requires_grad:
        out.sum().backward()
        assert torch.equal(x.grad, torch.ones_like(x))


def test_conv_clustering_fused_gelu_matches_modules(monkeypatch):
    from paca_mm.models.layers.paca import ConvClustering
    from paca_mm.models.layers import common
    if not common._FUSED_CONV_GELU:
        pytest.skip('this torch build has no oneDNN fused conv + GELU')
    torch.manual_seed(0)
    m = ConvClustering(8, 5).eval()
    x = torch.randn(2, 9 * 7, 8)
    with torch.no_grad():
        fused = m(x, (9, 7))
        monkeypatch.setattr(ConvClustering, 'fuse_gelu', False)
        ref = m(x, (9, 7))
    assert fused.shape == (2, 5, 63) and fused.stride() == ref.stride()
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('onednn', [True, False])
@pytest.mark.parametrize('with_residual', [False, True])
@pytest.mark.parametrize('grad', [False, True])
def test_linear_helper_equals_f_linear(onednn, with_residual, grad, monkeypatch):
    """common.linear: oneDNN matmul (bias and residual in the output pass) in CPU inference,
    F.linear (+ residual) elsewhere; the same values, autograd intact on the fallback."""
    from paca_mm.models.layers import common
    if onednn and not common._ONEDNN_LINEAR:
        pytest.skip('this torch build has no oneDNN linear')
    monkeypatch.setattr(common, '_ONEDNN_LINEAR', onednn)
    lin = torch.nn.Linear(12, 20)
    x = torch.randn(2, 33, 12)[:, ::3]  # a strided (B, N, C) input
    res = torch.randn(2, 11, 20)
    ref = torch.nn.functional.linear(x, lin.weight, lin.bias) + (res if with_residual else 0)
    with torch.set_grad_enabled(grad):
        out = common.linear(x, lin.weight, lin.bias, res if with_residual else None)
    torch.testing.assert_close(out, ref.detach() if not grad else ref, rtol=1e-5, atol=1e-5)
    assert out.requires_grad == grad
    if grad:
        out.sum().backward()
        assert lin.weight.grad is not None
    # a residual that does not match the output shape is broadcast as by `+`
    with torch.no_grad():
        out = common.linear(x, lin.weight, lin.bias, res[:1])
    torch.testing.assert_close(out, torch.nn.functional.linear(x, lin.weight, lin.bias) + res[:1])


def test_cluster_softmax_without_autograd_is_stable_for_large_logits():
    """The no-autograd path (max / exp / sum / divide) subtracts the max: no overflow."""
    logits_nm = torch.randn(2, 300, 5) * 1e4
    with torch.no_grad():
        z = cluster_softmax(logits_nm.transpose(1, 2))
    ref = torch.softmax(logits_nm.transpose(1, 2).contiguous(), dim=-1)
    assert torch.isfinite(z).all()
    torch.testing.assert_close(z, ref)
    torch.testing.assert_close(z.sum(-1), torch.ones(2, 5))


@pytest.mark.parametrize('train', [False, True])
def test_attention_residual_argument(train):
    """PaCaAttention(..., residual=r) returns attention + r (what PaCaBlock relies on), with
    the projection's dropout applied before the add in training."""
    from paca_mm.models.layers import PaCaAttention
    torch.manual_seed(0)
    attn = PaCaAttention(16, 2, 5, 'conv', proj_drop=0.5 if train else 0.).train(train)
    x, r = torch.randn(2, 12, 16), torch.randn(2, 12, 16)
    torch.manual_seed(1)
    ref = attn(x, (3, 4))[0] + r
    torch.manual_seed(1)
    out = attn(x, (3, 4), residual=r)[0]
    torch.testing.assert_close(out, ref)
    with torch.no_grad():
        attn.eval()
        torch.testing.assert_close(attn(x, (3, 4), residual=r)[0], attn(x, (3, 4))[0] + r,
                                   rtol=1e-5, atol=1e-5)


def test_folded_stem_equals_two_convs():
    """Stem in CPU inference: the composed 7x7 stride-4 conv with recomputed border rows and
    columns equals the two 3x3 stride-2 convs, for odd and even sizes; the composed weights
    follow parameter updates (load_state_dict)."""
    from paca_mm.models.backbones.paca_vit import Stem
    torch.manual_seed(0)
    stem = Stem(3, 16).eval()
    with torch.no_grad():
        for p in stem.parameters():
            p.normal_(0, 0.3)
    for hw in [(17, 17), (18, 21), (19, 40), (33, 20), (64, 36)]:
        x = torch.randn(2, 3, *hw).contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            ref = stem.norm(stem.proj(x))
            out = stem(x)
        assert stem._folded_cache is not None  # the folded path ran
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    new = {k: torch.randn_like(v) for k, v in stem.state_dict().items()}
    stem.load_state_dict(new)
    with torch.no_grad():
        torch.testing.assert_close(stem(x), stem.norm(stem.proj(x)), rtol=1e-5, atol=1e-5)
    # with autograd the two convs run (the folded weights are not even built)
    stem._folded_cache = None
    stem(x).sum().backward()
    assert stem._folded_cache is None
    assert stem.proj[0].weight.grad is not None


def test_backbone_under_inference_mode():
    """The CPU-inference fast paths also run under torch.inference_mode, including a model
    built there (inference-tensor parameters have no version counter to key caches on)."""
    torch.manual_seed(0)
    model = PaCaViT('tiny').eval()
    x = torch.randn(2, 3, 96, 80)
    with torch.no_grad():
        ref = model(x)
    with torch.inference_mode():
        out = model(x)
        built_here = PaCaViT('tiny').eval()
        built_here.load_state_dict(model.state_dict())
        assert built_here.patch_embed.proj[0].weight.is_inference()
        out2 = built_here(x)
    for r, a, b in zip(ref, out, out2):
        torch.testing.assert_close(a, r)
        torch.testing.assert_close(b, r)


def test_replaced_or_hooked_linears_are_called_as_modules():
    """The direct weight/bias fast paths (oneDNN matmul, fused K/V) only apply to plain
    nn.Linear modules: a hook on attn.q / attn.proj fires, and a replaced attn.k (e.g. an
    adapter) is called, in eval + no_grad as in training."""
    from paca_mm.models.layers import PaCaAttention

    class Scaled(torch.nn.Linear):
        calls = 0

        def forward(self, x):
            Scaled.calls += 1
            return 2 * super().forward(x)

    torch.manual_seed(0)
    attn = PaCaAttention(16, 2, 5, 'conv').eval()
    x = torch.randn(1, 12, 16)
    with torch.no_grad():
        ref = attn(x, (3, 4))[0]
    seen = []
    hooks = [attn.q.register_forward_hook(lambda m, i, o: seen.append('q')),
             attn.proj.register_forward_hook(lambda m, i, o: seen.append('proj'))]
    with torch.no_grad():
        torch.testing.assert_close(attn(x, (3, 4))[0], ref, rtol=1e-5, atol=1e-5)
    assert seen == ['q', 'proj']
    for h in hooks:
        h.remove()
    import copy
    doubled = copy.deepcopy(attn)  # the same function with plain Linear keys
    with torch.no_grad():
        doubled.k.weight.mul_(2)
        doubled.k.bias.mul_(2)
        expected = doubled(x, (3, 4))[0]
    k = Scaled(16, 16)
    k.load_state_dict(attn.k.state_dict())
    attn.k = k
    with torch.no_grad():
        out = attn(x, (3, 4))[0]
    assert Scaled.calls == 1
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_hooked_modules_switch_off_the_banded_ffn_and_fused_clustering():
    """The banded FFN and the fused clustering convs read their modules' parameters; with a
    hook on one of those modules they run the module path, so the hook fires (same values)."""
    from paca_mm.models.layers.paca import ConvClustering
    ffn = _ffn()
    ffn.band_bytes = 3 * 5 * 24 * 4  # 3 rows of the 5-wide, 24-channel hidden map
    x = torch.randn(1, 40 * 5, 8)
    with torch.no_grad():
        ref = ffn(x, (40, 5))
        assert ffn._fast_inference(x, None) and ffn._band_rows(x, (40, 5)) == 3
    seen = []
    h = ffn.fc1.register_forward_hook(lambda m, i, o: seen.append('fc1'))
    with torch.no_grad():
        assert not ffn._fast_inference(x, None)
        torch.testing.assert_close(ffn(x, (40, 5)), ref, rtol=1e-5, atol=1e-5)
    assert seen == ['fc1']
    h.remove()
    torch.manual_seed(0)
    clu = ConvClustering(8, 3).eval()
    xc = torch.randn(1, 30, 8)
    with torch.no_grad():
        ref = clu(xc, (6, 5))
    h = clu.clustering[0].register_forward_hook(lambda m, i, o: seen.append('dw'))
    with torch.no_grad():
        torch.testing.assert_close(clu(xc, (6, 5)), ref, rtol=1e-5, atol=1e-5)
    assert seen == ['fc1', 'dw']
    h.remove()


@pytest.mark.parametrize('kwargs', [
    dict(num_clusters=(8, 8, 8, 0)),
    dict(num_clusters=(4, 4, 4, 4), clustering='mlp', cluster_sharing='block'),
    dict(num_clusters=(4, 4, 4, 4), clustering='linear'),
    dict(num_clusters=(4, 4, 4, 4), teacher=dict(depths=(1,) * 4)),
], ids=['conv', 'mlp-block', 'linear', 'teacher'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16], ids=['fp32', 'fp16'])
def test_backbone_on_a_non_cpu_device(kwargs, dtype):
    """Off the CPU (CUDA; the meta device stands in here, CI has no GPU) the backbone runs
    device-generic torch code only: the CPU fast paths and compiled ops (CPU kernels only,
    so a call with meta tensors raises) are not reached in inference, training or backward,
    and the clustering softmax still returns float32 for fp16 weights."""
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
