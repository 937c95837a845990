"""External clustering teacher PaCa^ec (paper Fig. 4/8): a small ConvMixer-FPN.

It shares the backbone's stem: input is the (B, C1, H1, W1) stem output. For every stage
i it returns the assignment ``z_i`` (B, M_i, N_i), softmax over N (None where M_i = 0),
the pre-softmax logits, and the bottom-up features ``out_i`` as (B, N_i, C_i) tokens,
which the backbone adds to its stage outputs. Key names match the official
``PaCaTeacher_ConvMixer`` (``block{s}``, ``transition{s}``, ``lateral{s}``, ``fpn{s}``,
``to_clusters{s}``).
"""
from typing import List, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers.common import map_to_tokens
from ..layers.paca import cluster_softmax


class _Residual(nn.Module):
    def __init__(self, fn: nn.Module):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return x + self.fn(x)


def convmixer_unit(dim: int, kernel_size: int) -> nn.Sequential:
    """ConvMixer unit: x + BN(GELU(DWConv(x))), then PWConv, GELU, BN."""
    return nn.Sequential(
        _Residual(nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim),
            nn.GELU(), nn.BatchNorm2d(dim))),
        nn.Conv2d(dim, dim, 1), nn.GELU(), nn.BatchNorm2d(dim))


class BlurConv2d(nn.Module):
    """Fixed 3x3 binomial depth-wise blur (stride 1) followed by a learned strided conv."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3,
                 stride: int = 2, padding: int = 1):
        super().__init__()
        k = torch.tensor([1., 2., 1.])
        k = (k[:, None] * k[None, :]) / 16
        self.register_buffer('blur_filter', k.expand(in_channels, 1, 3, 3).clone())
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding)

    def forward(self, x):
        x = F.conv2d(x, self.blur_filter, padding=1, groups=x.shape[1])
        return self.conv(x)


class ConvMixerTeacher(nn.Module):
    """ConvMixer-FPN clustering teacher.

    Args:
        embed_dims: stage dims (same as the backbone). num_clusters: M per stage.
        depths: ConvMixer units per stage. kernel_size: depth-wise kernel (PaCaViT passes
            its teacher config's, default (2, 2, 2, 2) and 7).
    """

    def __init__(self, embed_dims: Sequence[int], num_clusters: Sequence[int],
                 depths: Sequence[int], kernel_size: int):
        super().__init__()
        self.num_stages = len(embed_dims)
        self.num_clusters = list(num_clusters)
        for i, dim in enumerate(embed_dims):
            s = i + 1
            setattr(self, f'block{s}', nn.Sequential(
                *[convmixer_unit(dim, kernel_size) for _ in range(depths[i])]))
            if i < self.num_stages - 1:
                nxt = embed_dims[i + 1]
                setattr(self, f'transition{s}', nn.Sequential(
                    BlurConv2d(dim, nxt), nn.GELU(), nn.BatchNorm2d(nxt)))
                setattr(self, f'lateral{s}', nn.Sequential(
                    nn.Conv2d(nxt, dim, 1), nn.GELU(), nn.BatchNorm2d(dim)))
                setattr(self, f'fpn{s}', convmixer_unit(dim, kernel_size))
            setattr(self, f'to_clusters{s}',
                    nn.Conv2d(dim, num_clusters[i], 1) if num_clusters[i] > 0 else None)

    def stage_modules(self, i: int) -> List[nn.Module]:
        """Modules that belong to stage ``i`` (0-based), for freezing."""
        s = i + 1
        names = [f'block{s}', f'transition{s}', f'lateral{s}', f'fpn{s}', f'to_clusters{s}']
        return [m for m in (getattr(self, n, None) for n in names) if m is not None]

    def forward(self, x: torch.Tensor):
        """x: (B, C1, H1, W1) -> (z list, logits list, token outs list)."""
        outs = []
        for i in range(self.num_stages):
            x = getattr(self, f'block{i + 1}')(x)
            outs.append(x)
            if i < self.num_stages - 1:
                x = getattr(self, f'transition{i + 1}')(x)
        feats = [None] * self.num_stages
        feats[-1] = outs[-1]
        for i in range(self.num_stages - 2, -1, -1):
            up = F.interpolate(feats[i + 1], size=outs[i].shape[-2:], mode='bilinear',
                               align_corners=False)
            feats[i] = getattr(self, f'fpn{i + 1}')(
                outs[i] + getattr(self, f'lateral{i + 1}')(up))
        zs: List[Optional[torch.Tensor]] = []
        logits: List[Optional[torch.Tensor]] = []
        for i in range(self.num_stages):
            head = getattr(self, f'to_clusters{i + 1}')
            if head is None:
                zs.append(None)
                logits.append(None)
                continue
            lg = head(feats[i]).flatten(2)
            logits.append(lg)
            zs.append(cluster_softmax(lg))
        return zs, logits, [map_to_tokens(o) for o in outs]
