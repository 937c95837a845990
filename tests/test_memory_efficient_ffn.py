"""ConvFFN's memory-efficient tail, ``DWConvGELULinear``: the backward keeps one activation
of the FFN's hidden width instead of three, and its gradients are autograd's through the
plain ops: in float64 to rounding, in float32 as accurately as autograd's own, under bf16
autocast, with dropout, and through ``torch.compile``. It runs only in a training forward
that records gradients; everything else takes ``ConvFFN.forward_plain``."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from paca_mm.models.backbones import PaCaViT
from paca_mm.models.layers.common import (ConvFFN, DWConvGELULinear, map_to_tokens,
                                          tokens_to_map)


def _plain_tail(h, dw, fc, mask=None, p=0.):
    """fc(drop(GELU(DWConv(h)))) through autograd's own ops; h (B, rC, H, W)."""
    a = F.gelu(dw(h))
    if mask is not None:
        a = a * mask / (1 - p)
    return fc(map_to_tokens(a))


def _tail_inputs(dtype, channels_last=True, seed=0):
    torch.manual_seed(seed)
    B, C, r, H, W = 2, 6, 4, 5, 7
    dw = nn.Conv2d(C * r, C * r, 3, padding=1, groups=C * r).to(dtype)
    fc = nn.Linear(C * r, C).to(dtype)
    tokens = torch.randn(B, H * W, C * r, dtype=dtype)
    h = tokens_to_map(tokens, (H, W)) if channels_last else \
        tokens.transpose(1, 2).reshape(B, C * r, H, W)
    return h.detach().requires_grad_(), dw, fc


def _apply(h, dw, fc, mask=None, p=0.):
    return DWConvGELULinear.apply(h, dw.weight, dw.bias, fc.weight, fc.bias, mask, p)


def _grads(out, tensors, seed=1):
    torch.manual_seed(seed)
    return torch.autograd.grad(out, tensors, torch.randn_like(out))


@pytest.mark.parametrize('channels_last', [True, False], ids=['tokens-view', 'nchw'])
@pytest.mark.parametrize('p', [0., 0.3], ids=['no-dropout', 'dropout'])
def test_function_equals_plain_autograd(p, channels_last):
    h, dw, fc = _tail_inputs(torch.float64, channels_last)
    torch.manual_seed(2)
    mask = (torch.rand_like(h) >= p) if p else None
    tensors = (h, dw.weight, dw.bias, fc.weight, fc.bias)
    ours = _apply(h, dw, fc, mask, p)
    ref = _plain_tail(h, dw, fc, mask, p)
    torch.testing.assert_close(ours, ref, rtol=1e-13, atol=0)
    for name, g, g_ref in zip(('h', 'dw.weight', 'dw.bias', 'fc.weight', 'fc.bias'),
                              _grads(ours, tensors), _grads(ref, tensors)):
        rel = ((g - g_ref).norm() / g_ref.norm()).item()
        assert rel < 1e-13, f'{name}: {rel:.1e}'


def _saved_bytes(model, fn):
    """Bytes of the distinct activations autograd saves while running ``fn``: tensors
    other than ``model``'s parameters and their derivations (e.g. the conv kernel with the
    shortcut folded in, of its weight's shape)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {p.shape for p in model.parameters()}
    storages = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and t.shape not in shapes:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def test_keeps_one_hidden_activation(plain_conv_ffn):
    """A ConvFFN training forward keeps its input and one (B, rC, H, W) activation; autograd
    through the plain ops keeps two more of the hidden width."""
    torch.manual_seed(0)
    ffn = ConvFFN(16, mlp_ratio=4).train()
    x = torch.randn(2, 9 * 11, 16, requires_grad=True)
    hidden = 2 * 9 * 11 * 64 * 4  # bytes of one float32 activation of the hidden width
    ours = _saved_bytes(ffn, lambda: ffn(x, (9, 11)))
    with plain_conv_ffn():
        plain = _saved_bytes(ffn, lambda: ffn(x, (9, 11)))
    assert ours == x.numel() * 4 + hidden
    assert plain == ours + 2 * hidden


def test_backbone_saves_less(plain_conv_ffn):
    """The whole training forward of PaCa-Tiny keeps two hidden activations fewer per
    block."""
    torch.manual_seed(0)
    model = PaCaViT(arch='tiny').train()
    x = torch.randn(3, 3, 64, 96)
    hidden = []  # bytes of each ConvFFN's hidden activation (fc1's output)
    for m in model.modules():
        if isinstance(m, ConvFFN):
            m.fc1.register_forward_hook(lambda mod, i, out: hidden.append(out.numel() * 4))
    ours = _saved_bytes(model, lambda: model(x))
    with plain_conv_ffn():
        plain = _saved_bytes(model, lambda: model(x))
    hidden = sum(hidden[:len(hidden) // 2])
    assert hidden > 0
    assert plain - ours == 2 * hidden


@pytest.mark.parametrize('arch,size', [('tiny', (61, 93)), ('small', (45, 70))])
def test_backbone_gradients_equal_plain_autograd(arch, size, plain_conv_ffn, grad_errors):
    """PaCa-Tiny/Small in train mode (drop path and dropout on, same random draws) at sizes
    that are not multiples of 32: float64 parameter gradients equal the plain ops'."""
    torch.manual_seed(0)
    model = PaCaViT(arch=arch, drop_path_rate=0.2).double().train()
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    ours, ref = _backbone_grads(model, x), None
    with plain_conv_ffn():
        ref = _backbone_grads(model, x)
    errors = grad_errors(ours, ref)
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-8, (worst, errors[worst])


def _backbone_grads(model, x, seed=0):
    torch.manual_seed(seed)  # same drop-path draws in both runs
    model.zero_grad(set_to_none=True)
    outs = model(x)
    torch.manual_seed(seed + 1)
    sum((o * torch.randn_like(o)).sum() for o in outs).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_float32_gradients_as_accurate_as_autograd(plain_conv_ffn, grad_errors):
    """In float32 the gradients are as close to the float64 truth as autograd's through
    the plain ops are (both err by float32 rounding, amplified by the near-uniform attention
    of a random model; no parameter more than 1.5 times autograd's error)."""
    torch.manual_seed(0)
    model = PaCaViT(arch='tiny').double().train()
    x = torch.randn(2, 3, 61, 93, dtype=torch.float64)
    with plain_conv_ffn():
        truth = _backbone_grads(model, x)
        model.float()
        plain = _backbone_grads(model, x.float())
    ours = _backbone_grads(model, x.float())
    err_ours = grad_errors({n: g.double() for n, g in ours.items()}, truth)
    err_plain = grad_errors({n: g.double() for n, g in plain.items()}, truth)
    worse = {n: (err_ours[n], err_plain[n]) for n in truth
             if err_ours[n] > 1.5 * err_plain[n] + 1e-6}
    assert not worse, worse


def test_bf16_autocast(plain_conv_ffn):
    """Under CPU bf16 autocast the output and the float32 parameter gradients match the
    plain ops' under autocast to bf16 precision."""
    torch.manual_seed(0)
    ffn = ConvFFN(16).train()
    x = torch.randn(2, 9 * 11, 16)

    def run():
        ffn.zero_grad(set_to_none=True)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = ffn(x, (9, 11))
        out.float().square().sum().backward()
        return out, {n: p.grad for n, p in ffn.named_parameters()}

    out, grads = run()
    with plain_conv_ffn():
        out_ref, ref = run()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), out_ref.float(), rtol=2e-2, atol=2e-2)
    for n, g in grads.items():
        assert g.dtype == torch.float32, n
        rel = ((g - ref[n]).norm() / ref[n].norm()).item()
        assert rel < 2e-2, (n, rel)


def test_dropout(monkeypatch):
    """ConvFFN in train mode drops hidden units with probability p (the mask reaches the
    Function) and its output; in eval mode neither."""
    torch.manual_seed(0)
    p = 0.4
    ffn = ConvFFN(16, drop=p).double()
    x = torch.randn(2, 20 * 30, 16, dtype=torch.float64)
    seen = []
    apply = DWConvGELULinear.apply

    def spy(h, *args):
        out = apply(h, *args)
        seen.append((h, args[4], out))
        return out

    monkeypatch.setattr(DWConvGELULinear, 'apply', spy)
    out = ffn.train()(x, (20, 30))
    h, mask, tail = seen[-1]
    assert mask.dtype == torch.bool and mask.shape == h.shape
    assert abs(mask.double().mean().item() - (1 - p)) < 0.02
    torch.testing.assert_close(tail, _plain_tail(h, lambda h: h + ffn.dwconv.dwconv(h),
                                                 ffn.fc2, mask, p))
    kept = out != 0  # the output dropout: each element 0 or tail / (1 - p)
    assert abs(kept.double().mean().item() - (1 - p)) < 0.02
    torch.testing.assert_close(out[kept], tail[kept] / (1 - p))
    calls = len(seen)
    ffn.eval()
    torch.testing.assert_close(ffn(x, (20, 30)), _plain_tail(
        tokens_to_map(ffn.fc1(x), (20, 30)), ffn.dwconv, ffn.fc2))
    assert len(seen) == calls  # eval: the standard ops, no dropout


def test_function_runs_only_for_training_with_grad(monkeypatch):
    """The Function runs exactly in a training forward that records gradients (of the
    input or of any parameter); eval mode (with or without autograd), ``no_grad``, nothing
    requiring a gradient and jit tracing (ONNX export, FLOP counters) take the standard ops
    of ``forward_plain``, with the same output."""
    calls = []
    apply = DWConvGELULinear.apply

    def spy(*args):
        calls.append(args)
        return apply(*args)

    monkeypatch.setattr(DWConvGELULinear, 'apply', spy)
    torch.manual_seed(0)
    ffn = ConvFFN(8)
    x = torch.randn(2, 12, 8)

    def used_function(train=True, grad=True, params=True, x=x):
        ffn.train(train).requires_grad_(params)
        del calls[:]
        with torch.set_grad_enabled(grad):
            out = ffn(x, (3, 4))
        return len(calls), out

    n, out = used_function()
    assert n == 1
    assert used_function(params=False, x=x.clone().requires_grad_())[0] == 1
    for case in (dict(grad=False), dict(params=False), dict(train=False),
                 dict(train=False, grad=False)):
        n, plain = used_function(**case)
        assert n == 0, case
        torch.testing.assert_close(plain, out)

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.ffn = ffn

        def forward(self, x):
            return self.ffn(x, (3, 4))

    ffn.train().requires_grad_(True)
    del calls[:]
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', FutureWarning)  # torch >= 2.9: jit.trace deprecated
        graph = str(torch.jit.trace(Wrap(), (x, ), check_trace=False).inlined_graph)
    assert not calls and 'PythonOp' not in graph and 'aten::gelu' in graph


def test_compiled_gradients_equal_eager():
    """Through ``torch.compile`` (dynamo + AOT autograd, the graphs inductor gets) the
    Function's forward and backward give eager's output and gradients."""
    import torch._dynamo
    h, dw, fc = _tail_inputs(torch.float32)
    tensors = (h, dw.weight, dw.bias, fc.weight, fc.bias)
    eager = _apply(h, dw, fc)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(_apply, backend='aot_eager', fullgraph=True)(h, dw, fc)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager)
    for g, g_ref in zip(_grads(compiled, tensors), _grads(eager, tensors)):
        torch.testing.assert_close(g, g_ref)
