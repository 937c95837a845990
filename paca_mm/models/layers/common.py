"""Small building blocks shared by the backbone and the teacher."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


def tokens_to_map(x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
    """(B, N, C) tokens -> (B, C, H, W) map, as a channels_last *view* (no copy)."""
    B, N, C = x.shape
    return x.reshape(B, hw[0], hw[1], C).permute(0, 3, 1, 2)


def map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) map -> (B, H*W, C) tokens; free for channels_last maps."""
    B, C, H, W = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, H * W, C)


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


class ConvFFN(nn.Module):
    """Inverted-residual FFN: fc1 (C -> rC), DWConv3x3 + shortcut, GELU, fc2 (rC -> C).

    (B, N, C) -> (B, N, C), plus ``residual`` when given (on the banded path the sum is
    written into ``residual`` in place: pass a tensor nobody else needs). Without autograd
    the GELU runs in place (one (B, N, rC) buffer less at the peak).

    CPU inference (eval mode, no autograd) runs the FFN over bands of image rows
    (:meth:`forward_banded`), so the rC-wide hidden map of a band stays in cache instead of
    making six passes through memory; bands of about ``band_bytes`` of hidden activations.
    """

    band_bytes = 8 << 20  # hidden-map bytes per band on the CPU inference path

    def __init__(self, dim: int, mlp_ratio: float = 4, drop: float = 0.):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = DWConvShortcut(hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def _band_rows(self, x: torch.Tensor, hw: Tuple[int, int],
                   residual: Optional[torch.Tensor]) -> int:
        """Rows per band for the banded CPU inference path; 0 = run unbanded (also while
        torch.compile or a tracer such as the FLOP counter records the graph)."""
        if (self.training or x.device.type != 'cpu' or torch.is_grad_enabled()
                or torch.is_autocast_enabled('cpu') or torch.compiler.is_compiling()
                or torch.jit.is_tracing() or not x.is_contiguous()
                or (residual is not None and not residual.is_contiguous())
                or not isinstance(self.act, nn.GELU) or self.act.approximate != 'none'):
            return 0
        row_bytes = hw[1] * self.fc1.out_features * x.element_size()
        rows = max(1, self.band_bytes // row_bytes)
        return rows if rows < hw[0] else 0

    def forward(self, x: torch.Tensor, hw: Tuple[int, int],
                residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows = self._band_rows(x, hw, residual)
        if rows:
            return self.forward_banded(x, hw, rows, residual)
        x = self.dwconv(self.fc1(x), hw)
        if torch.is_grad_enabled() and x.requires_grad:
            x = self.act(x)
        else:
            x = torch.ops.aten.gelu_(x)
        x = self.drop(self.fc2(self.drop(x)))
        return x if residual is None else x.add_(residual)

    def forward_banded(self, x: torch.Tensor, hw: Tuple[int, int], rows: int,
                       residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The same function, computed ``rows`` image rows at a time (inference only).

        For output rows [r0, r1) the hidden map is computed on rows [r0 - 1, r1 + 1) (the
        3x3 conv's one-row halo, recomputed per band; zero padding at the image border as in
        the unbanded conv), so the result equals the unbanded FFN up to float rounding.
        """
        B, N, C = x.shape
        H, W = hw
        out = torch.empty_like(x) if residual is None else residual
        hidden = self.fc1.out_features
        w1t, w2t = self.fc1.weight.t(), self.fc2.weight.t()
        conv = self.dwconv.dwconv
        for b in range(B):
            xb = x[b].view(H, W, C)
            ob = out[b].view(H, W, C)
            for r0 in range(0, H, rows):
                r1 = min(r0 + rows, H)
                lo, hi = max(r0 - 1, 0), min(r1 + 1, H)
                h = torch.addmm(self.fc1.bias, xb[lo:hi].reshape(-1, C), w1t)
                h = h.view(1, hi - lo, W, hidden)
                # conv over the halo'd band; keep the output rows r0..r1-1
                y = conv(h.permute(0, 3, 1, 2))[:, :, r0 - lo:r1 - lo].permute(0, 2, 3, 1)
                y = torch.ops.aten.gelu_(y.add_(h[:, r0 - lo:r1 - lo]))
                y = y.reshape(-1, hidden)
                o = ob[r0:r1].view(-1, C)
                if residual is None:
                    torch.addmm(self.fc2.bias, y, w2t, out=o)
                else:
                    o.addmm_(y, w2t).add_(self.fc2.bias)
        return out
