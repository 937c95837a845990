"""Small building blocks shared by the backbone and the teacher.

Tokens are (B, N, C) with ``N = H*W`` in row-major order; maps are (B, C, H, W). The two
conversions below are views: a (B, N, C) tensor seen as a map has channels_last strides,
which ``nn.Conv2d`` and :class:`LayerNorm2d` accept as they are.
"""
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


def tokens_to_map(x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
    """(B, N, C) tokens -> (B, C, H, W) map: a view with channels_last strides (also for
    B = 1, where a transpose + reshape would give the batch dim a stride that makes
    ``nn.Conv2d`` fall back to an NCHW copy of its input)."""
    B, N, C = x.shape
    return x.reshape(B, hw[0], hw[1], C).permute(0, 3, 1, 2)


def map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) map -> (B, H*W, C) tokens (a view for channels_last maps)."""
    return x.flatten(2).transpose(1, 2)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, H, W) map, at every pixel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight,
                         self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class DWConvShortcut(nn.Module):
    """``h + DWConv3x3(h)`` of :class:`ConvFFN`, on a (B, rC, H, W) map (the official
    ``DWConv`` with shortcut; key ``mlp.dwconv.dwconv``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.dwconv(h)


def _plus_identity(dw_weight: torch.Tensor) -> torch.Tensor:
    """The (C, 1, 3, 3) kernel of ``h + DWConv(h)``: the DWConv's with 1 added at its centre."""
    return dw_weight + F.pad(torch.ones_like(dw_weight[:, :, 1:2, 1:2]), [1, 1, 1, 1])


class DWConvGELULinear(torch.autograd.Function):
    """``fc(drop(GELU(DWConv3x3(h))))``: a (B, rC, H, W) map ``h`` -> (B, N, C) tokens; the
    tail of :class:`ConvFFN` in training, whose kernel includes the shortcut
    (:func:`_plus_identity`).

    Autograd through these ops would keep three activations of the block's widest shape:
    ``h`` (for the conv's weight gradient), the conv's output (GELU's) and the GELU's output
    (fc's). This backward keeps only ``h`` and recomputes the other two, a depth-wise conv
    and a GELU: a training step's saved activations shrink by a third for a few % more time
    (docs/benchmarks.md). The output and gradients are autograd's through the plain ops
    (tests/test_memory_efficient_ffn.py).

    The backward calls the two derivative ops that autograd itself runs for these ops: the
    public ATen ops ``convolution_backward`` (a Core ATen IR op) and ``gelu_backward``.
    ``torch.func.vjp`` of the conv + GELU would run the same kernels (A/B 0.99x), but
    torch 2.1's dynamo cannot trace it inside a backward (a graph break under
    ``torch.compile``).

    ``mask``: None, or the bool keep-mask (shaped as ``h``) of a dropout with probability
    ``p``. Under autocast the forward's ops run as autocast casts them, and the backward
    recomputes in the dtype of ``h``.
    """

    @staticmethod
    def forward(ctx, h, dw_weight, dw_bias, fc_weight, fc_bias, mask, p):
        a = F.gelu(F.conv2d(h, dw_weight, dw_bias, padding=1, groups=h.shape[1]))
        if mask is not None:
            a = a * mask / (1 - p)
        ctx.save_for_backward(h, dw_weight, dw_bias, fc_weight, mask)
        ctx.p = p
        return F.linear(map_to_tokens(a), fc_weight, fc_bias)

    @staticmethod
    def backward(ctx, grad):
        h, dw_weight, dw_bias, fc_weight, mask = ctx.saved_tensors
        dtype, groups = h.dtype, h.shape[1]
        weight = dw_weight.to(dtype)
        u = F.conv2d(h, weight, dw_bias.to(dtype), padding=1, groups=groups)
        a = F.gelu(u)
        grad = grad.to(dtype)
        grad_a = tokens_to_map(grad.matmul(fc_weight.to(dtype)), h.shape[2:])
        if mask is not None:
            a = a * mask / (1 - ctx.p)
            grad_a = grad_a * mask / (1 - ctx.p)
        grad_rows = grad.flatten(0, -2)
        grad_fc_weight = grad_rows.t().mm(map_to_tokens(a).flatten(0, -2))
        grad_h, grad_dw_weight, grad_dw_bias = torch.ops.aten.convolution_backward(
            torch.ops.aten.gelu_backward(grad_a, u), h, weight, [groups], [1, 1], [1, 1],
            [1, 1], False, [0, 0], groups, [True, True, True])
        return (grad_h, grad_dw_weight, grad_dw_bias, grad_fc_weight, grad_rows.sum(0), None,
                None)


class ConvFFN(nn.Module):
    """The FFN of every PaCa block: the inverted-residual block of MobileNetV2 with a
    shortcut over its depth-wise conv (the paper's "MBlock", Sec. 3 and the supplementary's
    Fig. 7; the official ``Mlp`` with ``dwconv`` and ``shortcut``):

        fc1 (C -> rC) -> h + DWConv3x3(h) -> GELU -> dropout -> fc2 (rC -> C) -> dropout

    (B, N, C) tokens on an H x W grid -> (B, N, C). :meth:`forward_plain` is this in
    standard ops; it runs in eval mode, without autograd (``no_grad``, nothing requiring a
    gradient) and under jit tracing (ONNX export, FLOP counters). A training forward that
    records gradients computes everything after fc1 with :class:`DWConvGELULinear` instead:
    the same output and gradients, two activations of the hidden width fewer saved for the
    backward.
    """

    def __init__(self, dim: int, mlp_ratio: float = 4, drop: float = 0.):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = DWConvShortcut(hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward_plain(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        h = tokens_to_map(self.fc1(x), hw)
        a = self.drop(F.gelu(self.dwconv(h)))
        return self.drop(self.fc2(map_to_tokens(a)))

    def _records_training_grad(self, x: torch.Tensor) -> bool:
        return (self.training and torch.is_grad_enabled() and not torch.jit.is_tracing()
                and (x.requires_grad or any(p.requires_grad for p in self.parameters())))

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        if not self._records_training_grad(x):
            return self.forward_plain(x, hw)
        h = tokens_to_map(self.fc1(x), hw)
        p = self.drop.p
        mask = torch.empty_like(h, dtype=torch.bool).bernoulli_(1 - p) if p > 0 else None
        dw = self.dwconv.dwconv
        return self.drop(DWConvGELULinear.apply(h, _plus_identity(dw.weight), dw.bias,
                                                self.fc2.weight, self.fc2.bias, mask, p))
