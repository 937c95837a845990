"""The compiled CPU ops (paca_mm/ops/csrc) for float32 CPU inference: the whole ConvFFN
(conv_ffn.cpp) and the patch-to-cluster attention (p2c_attention.cpp). They must compute the
same function as the module-by-module paths, for every band size, thread count, batch,
residual and pre-norm form (FFN) or head / cluster count and mode (attention), and be used
where they may."""
import os
import platform

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from paca_mm import ops
from paca_mm.models.layers import ConvFFN, PaCaAttention

needs_op = pytest.mark.skipif(
    os.environ.get('PACA_MM_NO_OPS') == '1' and not ops.status()[0],
    reason='PACA_MM_NO_OPS=1: paca_mm was installed without its compiled op')


def test_op_is_built():
    """The environment (tools/setup_env.sh) builds the op; a failed or stale build must not
    pass unnoticed as a silently slower install. Opt out with PACA_MM_NO_OPS=1."""
    if os.environ.get('PACA_MM_NO_OPS') == '1':
        pytest.skip('PACA_MM_NO_OPS=1')
    ok, reason = ops.status()
    assert ok, reason


def _ffn(dim, ratio=4, seed=0):
    torch.manual_seed(seed)
    ffn = ConvFFN(dim, mlp_ratio=ratio)
    with torch.no_grad():  # non-trivial biases so that every bias path is exercised
        for p in ffn.parameters():
            p.normal_(0, 0.3)
    return ffn.eval()


def _norm(dim):
    norm = nn.LayerNorm(dim, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_(1, 0.2)
        norm.bias.normal_(0, 0.2)
    return norm


def _reference(ffn, x, hw, norm=None):
    """The training path's function, module by module (exact GELU)."""
    h = ffn.fc1(norm(x) if norm is not None else x)
    return ffn.fc2(F.gelu(ffn.dwconv(h, hw)))


@needs_op
@pytest.mark.parametrize('hw', [(7, 5), (1, 9), (9, 1), (2, 2), (13, 6)])
@pytest.mark.parametrize('band_rows', [1, 2, 3, 10 ** 6])  # the ring of hidden rows wraps
@pytest.mark.parametrize('threads', [1, 2, 3])
@pytest.mark.parametrize('mode', ['fresh', 'residual', 'into_x'])
@pytest.mark.parametrize('dim', [8, 16])  # the op's own LayerNorm needs C % 16 == 0
def test_op_equals_reference(hw, band_rows, threads, mode, dim, monkeypatch):
    ffn = _ffn(dim)  # hidden 4 * dim
    norm = _norm(dim)
    monkeypatch.setattr(ConvFFN, 'op_band_bytes', band_rows * hw[1] * 4 * dim * 4)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            x = torch.randn(2, hw[0] * hw[1], dim)
            res = torch.randn_like(x)
            ref = _reference(ffn, x, hw, norm)
            if mode == 'fresh':
                out = ffn.forward_op(x.clone(), hw, None, norm)
            elif mode == 'residual':
                r = res.clone()
                out = ffn.forward_op(x.clone(), hw, r, norm)
                assert out.data_ptr() == r.data_ptr()
                ref = ref + res
            else:  # as PaCaBlock calls it: the input is its own residual
                y = x.clone()
                out = ffn.forward_op(y, hw, y, norm)
                assert out.data_ptr() == y.data_ptr()
                ref = ref + x
    finally:
        torch.set_num_threads(old)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-5)


@needs_op
def test_op_without_or_with_unusual_pre_norm():
    ffn = _ffn(16)
    hw = (6, 7)
    x = torch.randn(1, 42, 16)
    with torch.no_grad():
        torch.testing.assert_close(ffn.forward_op(x, hw), _reference(ffn, x, hw),
                                   rtol=1e-5, atol=2e-5)
        # a norm that is not a plain affine LayerNorm is applied before the op
        norm = nn.LayerNorm(16, elementwise_affine=False)
        torch.testing.assert_close(ffn.forward_op(x, hw, None, norm),
                                   _reference(ffn, x, hw, norm), rtol=1e-5, atol=2e-5)
        hooked = _norm(16)
        seen = []
        hooked.register_forward_hook(lambda *a: seen.append(1))
        torch.testing.assert_close(ffn.forward_op(x, hw, None, hooked),
                                   _reference(ffn, x, hw, hooked), rtol=1e-5, atol=2e-5)
        assert seen  # the hook ran: the op did not read the norm's parameters directly


@needs_op
def test_op_gelu_over_a_wide_range():
    """The op's own exp / erf approximations: pre-activations from -60 to 60, where the
    GELU's exp underflows and its erf saturates."""
    ffn = _ffn(4)  # hidden 16
    with torch.no_grad():
        ffn.fc1.weight.zero_()
        ffn.fc1.bias.copy_(torch.linspace(-6, 6, 16))
        ffn.dwconv.dwconv.weight.fill_(1.)  # 9 taps (+1 shortcut) of a constant map
        ffn.dwconv.dwconv.bias.zero_()
        x = torch.randn(1, 5 * 5, 4)
        ref = _reference(ffn, x, (5, 5))
        out = ffn.forward_op(x, (5, 5))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-5)


def _record_calls(monkeypatch, cls):
    """Records each ``cls.forward_op`` call (the op path) in the returned list."""
    calls = []
    real = cls.forward_op

    def spy(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(cls, 'forward_op', spy)
    return calls


@pytest.fixture
def op_calls(monkeypatch):
    return _record_calls(monkeypatch, ConvFFN)


@needs_op
def test_convffn_uses_the_op_where_it_may(op_calls, monkeypatch):
    ffn = _ffn(8)
    x = torch.randn(1, 12, 8)
    with torch.no_grad():
        ffn(x, (3, 4))
        assert op_calls == [1]
        _ffn(8).double()(x.double(), (3, 4))  # float64: not the op
        limit = ConvFFN.op_max_weight_bytes
        monkeypatch.setattr(ConvFFN, 'op_max_weight_bytes', 0)  # too wide a layer ...
        ffn(x, (3, 4))  # ... for 12 tokens (6 per thread with 2 threads)
        monkeypatch.setattr(ConvFFN, 'op_max_weight_bytes', limit)
        _ffn(8, ratio=3)(x, (3, 4))  # hidden 24: not a multiple of 16
        ffn.train()
        ffn(x, (3, 4))
    assert op_calls == [1]
    ffn.eval()
    ffn(x, (3, 4))  # autograd on: not the op
    ffn.fc1.register_forward_hook(lambda *a: None)
    with torch.no_grad():
        ffn(x, (3, 4))  # a hooked fc1 is called as a module
    assert op_calls == [1]


@needs_op
@pytest.mark.parametrize('threads', [1, 2, 3])
def test_wide_convffn_uses_the_op_with_enough_tokens_per_thread(threads, op_calls,
                                                               monkeypatch):
    """Weights over op_max_weight_bytes: the op only with op_min_tokens_per_thread tokens
    for each of the min(threads, H) threads that share the image rows."""
    monkeypatch.setattr(ConvFFN, 'op_max_weight_bytes', 0)
    monkeypatch.setattr(ConvFFN, 'op_min_tokens_per_thread', 10)
    ffn = _ffn(8)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            for hw, batch in (((2, 5), 1), ((3, 4), 1), ((4, 5), 1), ((6, 5), 1), ((2, 5), 3)):
                x = torch.randn(batch, hw[0] * hw[1], 8)
                n = len(op_calls)
                out = ffn(x, hw)
                used = len(op_calls) > n
                assert used == (batch * hw[0] * hw[1] >= 10 * min(threads, hw[0])), (hw, batch)
                torch.testing.assert_close(out, _reference(ffn, x, hw), rtol=1e-5, atol=2e-5)
    finally:
        torch.set_num_threads(old)


@needs_op
def test_op_rejects_bad_input():
    ffn = _ffn(8)
    x = torch.randn(1, 12, 8)
    w9 = torch.zeros(9, 32)
    args = (ffn.fc1.weight.detach(), ffn.fc1.bias.detach(), w9, ffn.dwconv.dwconv.bias.detach(),
            ffn.fc2.weight.detach(), ffn.fc2.bias.detach())
    with pytest.raises(RuntimeError, match='tokens, not H\\*W'):
        torch.ops.paca_mm.conv_ffn_inference(x, 5, 4, None, None, 0., *args, x.clone(), False, 1)
    with pytest.raises(RuntimeError, match='x must be a contiguous float32 CPU tensor'):
        torch.ops.paca_mm.conv_ffn_inference(x.double(), 3, 4, None, None, 0., *args,
                                             x.clone(), False, 1)
    with pytest.raises(RuntimeError, match='w9 has shape'):
        torch.ops.paca_mm.conv_ffn_inference(x, 3, 4, None, None, 0., *args[:2], w9[:8],
                                             *args[3:], x.clone(), False, 1)


@needs_op
def test_backbone_with_and_without_op(op_calls, monkeypatch):
    """PaCa-Tiny at a size where stage 1 and 2 use the op: same output as without it."""
    from paca_mm.models.backbones import PaCaViT
    from paca_mm.models.layers import common
    torch.manual_seed(0)
    m = PaCaViT('tiny').eval()
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        out = m(x)
        assert op_calls
        monkeypatch.setattr(common.ops, 'available', lambda: False)
        ref = m(x)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_no_ops_switch():
    """PACA_MM_NO_OPS=1 turns the op off at run time (with the reason), and the backbone
    still runs (on the ATen path), without the 'unavailable' warning."""
    import subprocess
    import sys
    code = ('import warnings, torch, paca_mm.ops as o\n'
            'from paca_mm.models.backbones import PaCaViT\n'
            'print(o.status())\n'
            'with warnings.catch_warnings():\n'
            '    warnings.simplefilter("error")\n'
            '    with torch.no_grad():\n'
            '        PaCaViT("tiny").eval()(torch.randn(1, 3, 64, 64))\n')
    env = dict(os.environ, PACA_MM_NO_OPS='1')
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "(False, 'turned off by PACA_MM_NO_OPS=1')" in out.stdout


# ---------------------------------------------------------------- p2c_attention_inference
def _attn(dim, heads, clusters, seed=0):
    torch.manual_seed(seed)
    attn = PaCaAttention(dim, heads, clusters, clustering=None)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    return attn.eval()


def _attn_reference(attn, x, z, residual=None):
    """Module by module, with ATen's scaled_dot_product_attention (float64)."""
    attn = _attn_copy64(attn)
    x, z = x.double(), z.double()
    c = attn.cluster_norm(z @ x)
    B, N, C = x.shape
    h = attn.num_heads
    q = attn.q(x).view(B, N, h, -1).transpose(1, 2)
    k = attn.k(c).view(B, -1, h, C // h).transpose(1, 2)
    v = attn.v(c).view(B, -1, h, C // h).transpose(1, 2)
    out = attn.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C))
    return (out if residual is None else out + residual.double()).float()


def _attn_copy64(attn):
    import copy
    return copy.deepcopy(attn).double()


def _assignment(B, M, N, sharp=1.):
    return torch.softmax(sharp * torch.randn(B, M, N), dim=-1)


@needs_op
@pytest.mark.parametrize('C,heads,M', [(16, 1, 1), (16, 2, 7), (32, 2, 16), (32, 4, 20),
                                       (48, 2, 100), (64, 8, 33)])
@pytest.mark.parametrize('fold', [False, True])
@pytest.mark.parametrize('band', [1, 5, 10 ** 6])
@pytest.mark.parametrize('threads', [1, 2, 3])
def test_attention_op_equals_reference(C, heads, M, fold, band, threads, monkeypatch):
    """Both modes (per-head GEMMs, or projections folded into the keys and values), the
    scalar (M < 16), tail (M % 16) and whole-vector softmax, bands of 1 token to all."""
    attn = _attn(C, heads, M)
    monkeypatch.setattr(PaCaAttention, 'op_band_tokens', band)
    monkeypatch.setattr(PaCaAttention, 'op_fold_ratio', 1e9 if fold else 0.)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            x = torch.randn(2, 23, C)
            z = _assignment(2, M, 23)
            res = torch.randn_like(x)
            out, z_out, logits = attn(x, (23, 1), z, residual=res)
            fresh, _, _ = attn(x, (23, 1), z)
    finally:
        torch.set_num_threads(old)
    assert z_out is z and logits is None
    torch.testing.assert_close(out, _attn_reference(attn, x, z, res), rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(fresh, _attn_reference(attn, x, z), rtol=1e-5, atol=2e-5)


@pytest.fixture
def attn_op_calls(monkeypatch):
    return _record_calls(monkeypatch, PaCaAttention)


@needs_op
@pytest.mark.parametrize('fold', [False, True])
def test_attention_op_softmax_over_a_wide_range(fold, monkeypatch, attn_op_calls):
    """Scores from about -1e3 to 1e3 (near one-hot rows, exp far below the float range) and
    equal scores (uniform rows): the op's own max-shifted exp must match."""
    monkeypatch.setattr(PaCaAttention, 'op_fold_ratio', 1e9 if fold else 0.)
    attn = _attn(32, 2, 20)
    with torch.no_grad():
        x = torch.randn(1, 40, 32)
        z = _assignment(1, 20, 40)
        for scale in (300., 0.):
            attn.k.weight.mul_(scale)
            attn.k.bias.mul_(scale)
            out, _, _ = attn(x, (8, 5), z)
            torch.testing.assert_close(out, _attn_reference(attn, x, z), rtol=1e-4, atol=1e-4)
    assert len(attn_op_calls) == 2


@needs_op
def test_attention_uses_the_op_where_it_may(attn_op_calls):
    attn = _attn(16, 2, 5)
    x = torch.randn(1, 12, 16)
    z = _assignment(1, 5, 12)
    with torch.no_grad():
        attn(x, (3, 4), z)
        assert attn_op_calls == [1]
        _attn(16, 2, 5).double()(x.double(), (3, 4), z)  # float64: not the op
        _attn(16, 2, 0)(x, (3, 4))  # plain MHSA (M = 0): not the op
        assert attn_op_calls == [1]
        attn.train()
        attn(x, (3, 4), z)
        attn.eval()
        attn(x.transpose(1, 2).contiguous().transpose(1, 2), (3, 4), z)  # strided tokens
    assert attn_op_calls == [1]
    attn(x, (3, 4), z)  # autograd on: not the op
    attn.q.register_forward_hook(lambda *a: None)
    with torch.no_grad():
        attn(x, (3, 4), z)  # a hooked q is called as a module
    assert attn_op_calls == [1]


@needs_op
def test_attention_op_rejects_bad_input():
    C, h, M = 16, 2, 5
    x = torch.randn(1, 12, C)
    w, b = torch.randn(1, C, C), torch.randn(1, C)
    kt, v, sb = torch.randn(1, h, C // h, M), torch.randn(1, M, C), torch.randn(1, h * M)
    op = torch.ops.paca_mm.p2c_attention_inference
    out = torch.empty_like(x)
    with pytest.raises(RuntimeError, match='heads = 3 does not divide C = 16'):
        op(x, w, sb, kt, v, w, b[0], None, out, 3, 8)
    with pytest.raises(RuntimeError, match='kt has shape'):
        op(x, w, sb, kt[:, :, 1:].contiguous(), v, w, b[0], None, out, h, 8)
    with pytest.raises(RuntimeError, match='xn must be a contiguous float32 CPU tensor'):
        op(x.double(), w, sb, kt, v, w, b[0], None, out, h, 8)
    with pytest.raises(RuntimeError, match='residual has shape'):
        op(x, w, sb, kt, v, w, b[0], x[:, :5], out, h, 8)
    with pytest.raises(RuntimeError, match='v missing'):
        op(x, w, sb, kt, None, w, b[0], None, out, h, 8)
    with pytest.raises(RuntimeError, match='band must be >= 1'):
        op(x, w, sb, kt, v, w, b[0], None, out, h, 0)
    # out may be the residual itself
    ref = x.clone()
    op(x, w, sb, kt, v, w, b[0], ref, out, h, 8)
    res = x.clone()
    op(x, w, sb, kt, v, w, b[0], res, res, h, 8)
    torch.testing.assert_close(res, out)
    with pytest.raises(RuntimeError, match='b_in has shape'):
        op(x, w, b, kt, v, w, b[0], None, out, h, 8)  # q's bias, not the (B, h*M) score bias
    # no output bias = a zero one
    no_bias, zero = torch.empty_like(x), torch.empty_like(x)
    op(x, w, sb, kt, v, w, None, None, no_bias, h, 8)
    op(x, w, sb, kt, v, w, torch.zeros(C), None, zero, h, 8)
    torch.testing.assert_close(no_bias, zero)


def test_forward_op_without_the_ops_says_why(monkeypatch):
    """Calling forward_op directly when the library is unavailable is a clear error, not an
    AttributeError from torch.ops."""
    monkeypatch.setattr(ops, '_STATUS', (False, 'paca_mm/_ops*.so is not built (test)'))
    ffn = _ffn(16)
    x = torch.randn(1, 12, 16)
    with torch.no_grad(), pytest.raises(RuntimeError, match='is not built'):
        ffn.forward_op(x, (3, 4))
    attn = PaCaAttention(16, 2, 4, 'conv').eval()
    with torch.no_grad(), pytest.raises(RuntimeError, match='is not built'):
        attn.forward_op(x, torch.randn(1, 4, 16))


@needs_op
@pytest.mark.parametrize('fold', [False, True])
@pytest.mark.parametrize('into', ['residual', 'x'])
def test_attention_op_writes_into_its_inputs(fold, into, monkeypatch):
    """``out`` may be the residual (the projection accumulates into it) or the normalised
    tokens themselves (each band is read before it is written)."""
    monkeypatch.setattr(PaCaAttention, 'op_fold_ratio', 1e9 if fold else 0.)
    monkeypatch.setattr(PaCaAttention, 'op_band_tokens', 4)
    attn = _attn(32, 2, 20)
    with torch.no_grad():
        x = torch.randn(2, 23, 32)
        z = _assignment(2, 20, 23)
        res = torch.randn_like(x)
        ref = _attn_reference(attn, x, z, res)
        c = attn.cluster_norm(z @ x)
        xs, rs = x.clone(), res.clone()
        out = attn.forward_op(xs, c, rs, out=rs if into == 'residual' else xs)
    assert out.data_ptr() == (rs if into == 'residual' else xs).data_ptr()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize('packed', ['1', '0'])
def test_ops_with_and_without_packed_weights(packed, monkeypatch):
    """Both GEMM paths of the ops (gemm.h): weights packed once per thread where libtorch
    exports MKL's packed GEMM (x86 builds) and a thread has >= 2048 tokens, else (or with
    PACA_MM_PACKED_GEMM=0) ATen's mm. The op's pack counter shows which path ran."""
    if not ops.status()[0]:
        pytest.skip('the ops are not built')
    monkeypatch.setenv('PACA_MM_PACKED_GEMM', packed)
    if packed == '0':
        assert not ops.packed_gemm()
    elif platform.machine() in ('x86_64', 'AMD64') and torch.backends.mkl.is_available():
        assert ops.packed_gemm()  # this build's libtorch exports them: they must be used
    count = torch.ops.paca_mm.packed_gemm_count
    ffn, norm = _ffn(16), _norm(16)
    attn = _attn(48, 2, 100)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.no_grad():
            for hw in ((7, 6), (64, 72)):  # 21 / 2304 tokens per thread
                x = torch.randn(1, hw[0] * hw[1], 16)
                n = count()
                out = ffn.forward_op(x.clone(), hw, None, norm)
                assert count() - n == (4 if ops.packed_gemm() and hw[0] == 64 else 0)
                torch.testing.assert_close(out, _reference(ffn, x, hw, norm), rtol=1e-5,
                                           atol=2e-5)
            for fold in (False, True):
                monkeypatch.setattr(PaCaAttention, 'op_fold_ratio', 1e9 if fold else 0.)
                for N in (30, 4200):
                    xa = torch.randn(1, N, 48)
                    z = _assignment(1, 100, N)
                    res = torch.randn_like(xa)
                    n = count()
                    out, _, _ = attn(xa, (N, 1), z, residual=res)
                    assert count() - n == (4 if ops.packed_gemm() and N > 30 else 0)
                    torch.testing.assert_close(out, _attn_reference(attn, xa, z, res),
                                               rtol=1e-5, atol=2e-5)
    finally:
        torch.set_num_threads(old)


@needs_op
def test_op_gelu_is_exact_gelu_over_a_wide_range():
    """The op's GELU (a fitted rational erf, conv_ffn.cpp) against float64 erf GELU on
    hidden values from -12 to 12, through the op: fc1 spreads the inputs, the depth-wise conv
    is zero (only the shortcut), fc2 picks the first C hidden channels."""
    C, hw = 16, (25, 40)
    ffn = ConvFFN(C).eval()  # hidden 64
    with torch.no_grad():
        ffn.fc1.weight.zero_()
        ffn.fc1.weight[:C].copy_(torch.eye(C))
        ffn.fc1.bias.zero_()
        ffn.dwconv.dwconv.weight.zero_()
        ffn.dwconv.dwconv.bias.zero_()
        ffn.fc2.weight.zero_()
        ffn.fc2.weight[:, :C].copy_(torch.eye(C))
        ffn.fc2.bias.zero_()
        a = torch.linspace(-12, 12, hw[0] * hw[1] * C).view(1, -1, C)
        out = ffn.forward_op(a, hw)
    ref = F.gelu(a.double())
    err = (out.double() - ref).abs()
    # within 3 float32 ulps of the result, or 1e-6 near zero
    assert (err <= torch.maximum(3 * 2 ** -23 * ref.abs(), torch.full_like(ref, 1e-6))).all(), \
        f'max error {err.max().item():.3g} at {a.flatten()[err.argmax()].item():.4f}'
