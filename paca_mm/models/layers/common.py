"""Small building blocks shared by the backbone and the teacher."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import ops


def tokens_to_map(x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
    """(B, N, C) tokens -> (B, C, H, W) map, as a channels_last *view* (no copy)."""
    B, N, C = x.shape
    return x.reshape(B, hw[0], hw[1], C).permute(0, 3, 1, 2)


def map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) map -> (B, H*W, C) tokens; free for channels_last maps."""
    B, C, H, W = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, H * W, C)


def cpu_inference(x: torch.Tensor) -> bool:
    """Whether ``x`` is in eager CPU inference: on the CPU, no autograd, no autocast, and not
    being compiled or traced (the precondition of every CPU-inference fast path here)."""
    return (x.device.type == 'cpu' and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled('cpu') and not torch.compiler.is_compiling()
            and not torch.jit.is_tracing())


def tokens_to_nchw(x: torch.Tensor, hw: Tuple[int, int], chunk: int = 1024) -> torch.Tensor:
    """(B, N, C) tokens -> a contiguous (B, C, H, W) map (a copy).

    In CPU inference the transpose is copied ``chunk`` tokens at a time, so that source and
    destination stay in cache (2x faster than one strided copy at N = 64000, C = 96).
    """
    if not cpu_inference(x) or x.shape[1] <= 4 * chunk:
        return tokens_to_map(x, hw).contiguous()
    B, N, C = x.shape
    out = x.new_empty(B, C, N)
    for b in range(B):
        for t0 in range(0, N, chunk):
            out[b, :, t0:t0 + chunk].copy_(x[b, t0:t0 + chunk].t())
    return out.view(B, C, hw[0], hw[1])


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, H, W) map, at every pixel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # For a channels_last map both permutes are free.
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class DWConvShortcut(nn.Module):
    """3x3 depth-wise conv on (B, N, C) tokens of an H x W grid, plus its input."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        y = map_to_tokens(self.dwconv(tokens_to_map(x, hw)))
        # y is a fresh conv output that no backward needs: add the shortcut in place.
        return y.add_(x)


def _fused_conv_gelu_available() -> bool:
    op = getattr(torch.ops.mkldnn, '_convolution_pointwise', None)
    return op is not None and torch.backends.mkldnn.is_available()


_FUSED_CONV_GELU = _fused_conv_gelu_available()


def _onednn_linear_available() -> bool:
    op = getattr(torch.ops.mkldnn, '_linear_pointwise', None)
    return op is not None and torch.backends.mkldnn.is_available()


_ONEDNN_LINEAR = _onednn_linear_available()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` (+ ``residual``): (..., C_in) -> (..., C_out), fresh.

    In float32 CPU inference this is one oneDNN matmul with the bias (and the residual add)
    in the kernel's output pass; ``F.linear`` (addmm) instead first writes the broadcast
    bias into the output, and the residual add is one more pass (at N = 64000, C = 96:
    13.9 ms -> 10.6 ms with the residual). Elsewhere it is ``F.linear`` (+ ``residual``).
    """
    if _ONEDNN_LINEAR and x.dtype == torch.float32 and cpu_inference(x):
        if residual is None:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, 'none', [], '')
        if (residual.shape == (*x.shape[:-1], weight.shape[0])
                and residual.dtype == torch.float32):
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, bias, 'add')
    y = F.linear(x, weight, bias)
    return y if residual is None else y + residual


def plain_module(m: nn.Module, cls: type) -> bool:
    """Whether ``m`` is exactly a ``cls`` (e.g. ``nn.Linear``, ``nn.Conv2d``) without hooks,
    i.e. ``m(x)`` may be computed from its weight and bias directly. Every fast path that
    reads a module's parameters instead of calling it checks this: a replaced or wrapped
    module (LoRA, quantised, ...) or one with hooks is called as a module instead."""
    return (type(m) is cls and not m._forward_hooks and not m._forward_pre_hooks
            and not nn.modules.module._global_forward_hooks
            and not nn.modules.module._global_forward_pre_hooks)


def apply_linear(m: nn.Module, x: torch.Tensor,
                 residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``m(x)`` (+ ``residual``), through :func:`linear` where :func:`plain_module`."""
    if plain_module(m, nn.Linear):
        return linear(x, m.weight, m.bias, residual)
    y = m(x)
    return y if residual is None else y + residual


def op_inputs(x: torch.Tensor, residual: Optional[torch.Tensor], linears) -> bool:
    """Whether a compiled CPU op (:mod:`paca_mm.ops`) may take this call's tensors and read
    the ``linears``' parameters directly: contiguous float32 (B, N, C) tokens in CPU
    inference, a ``residual`` (if any) of the same shape, dtype and layout, plain float32
    ``nn.Linear`` modules with biases, and the ops built."""
    return (x.dtype == torch.float32 and x.dim() == 3 and x.is_contiguous() and cpu_inference(x)
            and (residual is None or (residual.dtype == torch.float32
                                      and residual.shape == x.shape
                                      and residual.is_contiguous()))
            and all(plain_module(m, nn.Linear) and m.weight.dtype == torch.float32
                    and m.bias is not None for m in linears)
            and ops.available())


def conv_gelu_fusable(x: torch.Tensor) -> bool:
    """Whether :func:`conv_gelu` may use oneDNN's fused kernel on ``x``: CPU inference
    (no autograd, autocast, compile or tracing) in a torch build that has it."""
    return _FUSED_CONV_GELU and x.dtype == torch.float32 and cpu_inference(x)


def conv_gelu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
              padding, groups: int) -> torch.Tensor:
    """GELU(conv2d(x, weight, bias, stride 1, ``padding``, ``groups``)), exact GELU.

    One oneDNN kernel with the GELU as a post-op (one pass less over the output) where
    :func:`conv_gelu_fusable`, else conv then in-place GELU (the same values up to rounding).
    """
    if conv_gelu_fusable(x):
        return torch.ops.mkldnn._convolution_pointwise(
            x, weight, bias, list(padding), [1, 1], [1, 1], groups, 'gelu', [], 'none')
    y = F.conv2d(x, weight, bias, padding=padding, groups=groups)
    return F.gelu(y) if torch.is_grad_enabled() and y.requires_grad else torch.ops.aten.gelu_(y)


class ConvFFN(nn.Module):
    """Inverted-residual FFN: fc1 (C -> rC), DWConv3x3 + shortcut, GELU, fc2 (rC -> C).

    (B, N, C) -> (B, N, C). Optional ``pre_norm`` (a LayerNorm over C) is applied to ``x``
    first; optional ``residual`` is added to the output. Without autograd the GELU runs in
    place (one (B, N, rC) buffer less at the peak).

    CPU inference (eval mode, no autograd) runs the FFN over bands of image rows, so that
    the rC-wide hidden map of a band stays in cache instead of making six passes through
    memory, and writes the sum into ``residual`` in place (pass a tensor nobody else needs;
    it may be ``x`` itself): by the compiled op, one L2-sized band per thread
    (:meth:`forward_op`), where it is built and the layer is narrow enough, else by ATen ops
    on ``band_bytes`` bands (:meth:`forward_banded`).
    """

    band_bytes = 6 << 20  # hidden-map bytes per band on the ATen CPU inference path
    # The compiled op (paca_mm.ops): hidden-map bytes per thread and band (at least one
    # image row). Its bands are small enough for a core's L2 cache. Each thread packs fc1's
    # and fc2's weights once per call and streams them once per band: with weights of up to
    # op_max_weight_bytes that costs little whatever the size; wider layers (3.3 MB in
    # PaCa-Small's stage 3, 4.7 MB in its stage 4) need op_min_tokens_per_thread tokens per
    # thread to repay it (stage 3 at 800x1280: 2000 tokens, 0.91x the ATen path's time; stage
    # 4: 250, 1.04x), else the ATen path with its larger, multi-threaded GEMMs is faster.
    op_band_bytes = 512 << 10
    op_max_weight_bytes = 1536 << 10
    op_min_tokens_per_thread = 1024

    def __init__(self, dim: int, mlp_ratio: float = 4, drop: float = 0.):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = DWConvShortcut(hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def _fast_inference(self, x: torch.Tensor, residual: Optional[torch.Tensor]) -> bool:
        """Whether a CPU inference path (the compiled op or the banded one) may compute this
        call: eval mode, CPU inference (not while torch.compile or a tracer such as the FLOP
        counter records the graph), contiguous tensors, exact GELU, and plain fc1 / dwconv /
        fc2 modules (hooks or replaced modules make the FFN run module by module)."""
        return not (self.training or not cpu_inference(x) or not x.is_contiguous()
                    or (residual is not None and not residual.is_contiguous())
                    or not isinstance(self.act, nn.GELU) or self.act.approximate != 'none'
                    or not (plain_module(self.fc1, nn.Linear)
                            and plain_module(self.fc2, nn.Linear)
                            and plain_module(self.dwconv.dwconv, nn.Conv2d)))

    def _band_rows(self, x: torch.Tensor, hw: Tuple[int, int]) -> int:
        """Rows per band for the banded ATen CPU inference path; 0 = run unbanded."""
        row_bytes = hw[1] * self.fc1.out_features * x.element_size()
        rows = max(1, self.band_bytes // row_bytes)
        return rows if rows < hw[0] else 0

    def _op_fits(self, x: torch.Tensor, residual: Optional[torch.Tensor],
                 hw: Tuple[int, int]) -> bool:
        """Whether the compiled op computes a call that :meth:`_fast_inference` admits:
        :func:`op_inputs`, a hidden width that is a multiple of 16, a dwconv bias, and fc1 +
        fc2 weights of at most ``op_max_weight_bytes`` or at least
        ``op_min_tokens_per_thread`` tokens per thread (the op gives each thread a share of
        the ``hw[0]`` rows of every image)."""
        fc1, fc2 = self.fc1, self.fc2
        if not (op_inputs(x, residual, (fc1, fc2)) and fc1.out_features % 16 == 0
                and self.dwconv.dwconv.bias is not None):
            return False
        if 4 * (fc1.weight.numel() + fc2.weight.numel()) <= self.op_max_weight_bytes:
            return True
        threads = max(1, min(torch.get_num_threads(), hw[0]))
        return x.shape[0] * x.shape[1] >= self.op_min_tokens_per_thread * threads

    def forward(self, x: torch.Tensor, hw: Tuple[int, int],
                residual: Optional[torch.Tensor] = None,
                pre_norm: Optional[nn.Module] = None) -> torch.Tensor:
        fast = self._fast_inference(x, residual)
        if fast and self._op_fits(x, residual, hw):
            return self.forward_op(x, hw, residual, pre_norm)
        rows = self._band_rows(x, hw) if fast else 0
        if rows:
            return self.forward_banded(x, hw, rows, residual, pre_norm)
        if pre_norm is not None:
            x = pre_norm(x)
        x = self.dwconv(apply_linear(self.fc1, x), hw)
        if torch.is_grad_enabled() and x.requires_grad:
            x = self.act(x)
        else:
            x = torch.ops.aten.gelu_(x)
        x = self.drop(x)
        if residual is not None and not (self.training and self.drop.p > 0):
            return apply_linear(self.fc2, x, residual)
        x = self.drop(apply_linear(self.fc2, x))
        return x if residual is None else x.add_(residual)

    def forward_op(self, x: torch.Tensor, hw: Tuple[int, int],
                   residual: Optional[torch.Tensor] = None,
                   pre_norm: Optional[nn.Module] = None) -> torch.Tensor:
        """The same function by ``torch.ops.paca_mm.conv_ffn_inference`` (CPU float32
        inference; see :mod:`paca_mm.ops`): each thread runs its share of the image rows a few
        rows at a time, LN to fc2 in one pass while the band's hidden map is in its L2 cache.
        ``residual`` may be ``x`` itself (the sum is written into it in place)."""
        C, hidden = x.shape[-1], self.fc1.out_features
        ln_w = ln_b = None
        eps = 0.
        if pre_norm is not None:
            if (plain_module(pre_norm, nn.LayerNorm) and pre_norm.normalized_shape == (C,)
                    and pre_norm.weight is not None and pre_norm.bias is not None):
                ln_w, ln_b, eps = pre_norm.weight, pre_norm.bias, pre_norm.eps
            else:
                x = pre_norm(x).contiguous()
        conv = self.dwconv.dwconv
        w9 = conv.weight.reshape(hidden, 9).t().contiguous()
        w9[4] += 1  # DWConv(h) + h: the shortcut is the centre tap + 1
        out = torch.empty_like(x) if residual is None else residual
        rows = max(1, self.op_band_bytes // (hw[1] * hidden * x.element_size()))
        fc1_w, fc1_b, dw_b, fc2_w, fc2_b = (t.contiguous() for t in (  # no copy normally
            self.fc1.weight, self.fc1.bias, conv.bias, self.fc2.weight, self.fc2.bias))
        if ln_w is not None:
            ln_w, ln_b = ln_w.contiguous(), ln_b.contiguous()
        ops.require()  # loaded (forward() checked it; a direct call may not have)
        torch.ops.paca_mm.conv_ffn_inference(
            x, hw[0], hw[1], ln_w, ln_b, eps, fc1_w, fc1_b, w9, dw_b, fc2_w, fc2_b, out,
            residual is not None, rows)
        return out

    def forward_banded(self, x: torch.Tensor, hw: Tuple[int, int], rows: int,
                       residual: Optional[torch.Tensor] = None,
                       pre_norm: Optional[nn.Module] = None) -> torch.Tensor:
        """The same function, computed ``rows`` image rows at a time (inference only).

        Output rows [r0, r1) need hidden rows [r0 - 1, r1 + 1) (the 3x3 conv's halo; zero
        rows outside the image, as the conv's zero padding). One buffer holds them; the two
        rows shared with the next band are moved to its top, so fc1 runs once per row. The
        shortcut is folded into the conv (centre tap + 1). Input rows are read before the
        same output rows are written, so ``residual`` may be ``x`` itself.
        """
        B, N, C = x.shape
        H, W = hw
        out = torch.empty_like(x) if residual is None else residual
        hidden = self.fc1.out_features
        w1t, w2t = self.fc1.weight.t(), self.fc2.weight.t()
        conv = self.dwconv.dwconv
        weight = conv.weight.clone()
        weight[:, :, 1, 1] += 1  # DWConv(h) + h
        buf = x.new_empty(rows + 2, W, hidden)  # hidden rows r0 - 1 .. r1
        for b in range(B):
            xb, ob = x[b].view(H, W, C), out[b].view(H, W, C)
            buf[0].zero_()  # row -1
            have = 1  # buffer rows already holding hidden rows r0 - 1, ...
            for r0 in range(0, H, rows):
                r1 = min(r0 + rows, H)
                start, stop = r0 - 1 + have, min(r1 + 1, H)  # new hidden rows
                n = have + stop - start
                if n > have:
                    xs = xb[start:stop]
                    if pre_norm is not None:
                        xs = pre_norm(xs)
                    torch.addmm(self.fc1.bias, xs.reshape(-1, C), w1t,
                                out=buf[have:n].view(-1, hidden))
                if r1 == H:
                    buf[n].zero_()  # row H
                    n += 1
                # rows r0 .. r1 - 1: no row padding (halo rows are in the buffer)
                y = conv_gelu(buf[:n].unsqueeze(0).permute(0, 3, 1, 2), weight, conv.bias,
                              (0, 1), hidden)
                y = y.permute(0, 2, 3, 1).reshape(-1, hidden)
                o = ob[r0:r1].view(-1, C)
                if residual is None:
                    torch.addmm(self.fc2.bias, y, w2t, out=o)
                else:
                    o.addmm_(y, w2t).add_(self.fc2.bias)
                if r1 < H:  # hidden rows r1 - 1, r1 start the next band
                    buf[:2] = buf[n - 2:n].clone() if n < 4 else buf[n - 2:n]
                    have = 2
        return out
