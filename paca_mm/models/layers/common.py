"""Small building blocks shared by the backbone and the teacher."""
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, H, W) map, at every pixel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class DWConvShortcut(nn.Module):
    """3x3 depth-wise conv on (B, N, C) tokens of an H x W grid, plus its input."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        B, N, C = x.shape
        y = self.dwconv(x.transpose(1, 2).reshape(B, C, hw[0], hw[1]))
        return x + y.flatten(2).transpose(1, 2)


class ConvFFN(nn.Module):
    """Inverted-residual FFN: fc1 (C -> rC), DWConv3x3 + shortcut, GELU, fc2 (rC -> C).

    (B, N, C) -> (B, N, C).
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
