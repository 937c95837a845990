"""Small building blocks shared by the backbone and the teacher."""
from typing import Tuple

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

    (B, N, C) -> (B, N, C). Without autograd the GELU runs in place (one (B, N, rC)
    buffer less at the peak).
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
        x = self.dwconv(self.fc1(x), hw)
        if torch.is_grad_enabled() and x.requires_grad:
            x = self.act(x)
        else:
            x = torch.ops.aten.gelu_(x)
        return self.drop(self.fc2(self.drop(x)))
