"""The compiled CPU op (paca_mm/ops/csrc/conv_ffn.cpp): the whole ConvFFN for float32 CPU
inference. It must compute the same function as the module-by-module path, for every band
size, thread count, batch, residual and pre-norm form, and be used by ConvFFN where it may."""
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from paca_mm import ops
from paca_mm.models.layers import ConvFFN

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
@pytest.mark.parametrize('band_bytes', [1, 10 ** 9])  # one row per band / one band
@pytest.mark.parametrize('threads', [1, 2, 3])
@pytest.mark.parametrize('mode', ['fresh', 'residual', 'into_x'])
@pytest.mark.parametrize('dim', [8, 16])  # the op's own LayerNorm needs C % 16 == 0
def test_op_equals_reference(hw, band_bytes, threads, mode, dim, monkeypatch):
    ffn = _ffn(dim)  # hidden 4 * dim
    norm = _norm(dim)
    monkeypatch.setattr(ConvFFN, 'op_band_bytes', band_bytes)
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


@pytest.fixture
def op_calls(monkeypatch):
    """Records each ConvFFN.forward_op call (the op path) in the returned list."""
    calls = []
    real = ConvFFN.forward_op

    def spy(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(ConvFFN, 'forward_op', spy)
    return calls


@needs_op
def test_convffn_uses_the_op_where_it_may(op_calls, monkeypatch):
    ffn = _ffn(8)
    x = torch.randn(1, 12, 8)
    with torch.no_grad():
        ffn(x, (3, 4))
        assert op_calls == [1]
        _ffn(8).double()(x.double(), (3, 4))  # float64: not the op
        limit = ConvFFN.op_max_weight_bytes
        monkeypatch.setattr(ConvFFN, 'op_max_weight_bytes', 0)  # too wide a layer
        ffn(x, (3, 4))
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
