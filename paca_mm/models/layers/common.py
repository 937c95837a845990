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
    """3x3 depth-wise conv on (B, N, C) tokens of an H x W grid, plus its input."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        return x + map_to_tokens(self.dwconv(tokens_to_map(x, hw)))


class ConvFFN(nn.Module):
    """Inverted-residual FFN (official ``Mlp`` with dwconv and shortcut):
    fc1 (C -> rC), DWConv3x3 + shortcut, GELU, dropout, fc2 (rC -> C), dropout.

    (B, N, C) tokens on an H x W grid -> (B, N, C).
    """

    def __init__(self, dim: int, mlp_ratio: float = 4, drop: float = 0.):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = DWConvShortcut(hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        x = self.drop(self.act(self.dwconv(self.fc1(x), hw)))
        return self.drop(self.fc2(x))
