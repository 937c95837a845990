"""The PaCa operator: clustering modules and patch-to-cluster attention (paper Eqns. 1-6).

Shapes: ``B`` batch, ``N = H*W`` patches (row-major), ``C`` channels, ``M`` clusters,
``h`` heads, ``d = C / h``.

Submodule names follow the official implementation so released checkpoints load:
``cluster_norm``, ``clustering.clustering.<idx>``, ``q``, ``k``, ``v``, ``proj``.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import tokens_to_map

CLUSTERING_TYPES = ('conv', 'mlp', 'linear')
# Names used by the official configs (``paca_cfg.type``).
OFFICIAL_CLUSTERING_NAMES = {'P2CConv2d': 'conv', 'P2CMlp': 'mlp', 'P2CLinear': 'linear'}


class ConvClustering(nn.Module):
    """Eqns. 4-5: DWConv(k) + GELU, PWConv + GELU, PWConv to M (no bias).

    (B, N, C) tokens on an H x W grid -> (B, M, N) clustering logits.
    """

    def __init__(self, dim: int, num_clusters: int, kernel_size: int):
        super().__init__()
        self.clustering = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim),
            nn.GELU(),
            nn.Conv2d(dim, dim, 1),
            nn.GELU(),
            nn.Conv2d(dim, num_clusters, 1, bias=False),
        )

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        return self.clustering(tokens_to_map(x, hw)).flatten(2)


class MlpClustering(nn.Module):
    """Eqn. 6: Linear C -> rC, GELU, Linear rC -> M. (B, N, C) -> (B, M, N)."""

    def __init__(self, dim: int, num_clusters: int, mlp_ratio: float):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.clustering = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, num_clusters))

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        return self.clustering(x).transpose(1, 2)


class LinearClustering(nn.Module):
    """A single Linear C -> M (no bias). (B, N, C) -> (B, M, N)."""

    def __init__(self, dim: int, num_clusters: int):
        super().__init__()
        self.clustering = nn.Sequential(nn.Linear(dim, num_clusters, bias=False))

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        return self.clustering(x).transpose(1, 2)


def build_clustering(kind: str, dim: int, num_clusters: int, kernel_size: int,
                     mlp_ratio: float) -> nn.Module:
    """Build the clustering module ``kind`` in {'conv', 'mlp', 'linear'}."""
    if kind == 'conv':
        return ConvClustering(dim, num_clusters, kernel_size)
    if kind == 'mlp':
        return MlpClustering(dim, num_clusters, mlp_ratio)
    if kind == 'linear':
        return LinearClustering(dim, num_clusters)
    raise ValueError(f'clustering must be one of {CLUSTERING_TYPES} '
                     f'(or {tuple(OFFICIAL_CLUSTERING_NAMES)}), got {kind!r}')


def cluster_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Eqn. 2: the assignment ``C``, the softmax of (B, M, N) logits over the N patches.

    Computed and returned in float32 or better (float64 stays float64): under AMP the
    logits are half precision, and a half-precision assignment of N (up to ~10^5) weights
    per cluster loses most of their bits (see docs/benchmarks.md, "cluster softmax").
    """
    return logits.softmax(dim=-1, dtype=torch.float64 if logits.dtype == torch.float64
                          else torch.float32)


class PaCaAttention(nn.Module):
    """Patch-to-cluster attention (Eqns. 1-3).

    Queries come from the N patches; keys and values from the M cluster tokens
    ``Z = LN(C X)``, where the assignment ``C`` (B, M, N) is softmax-normalised over N.
    ``num_clusters == 0`` gives plain global multi-head self-attention.

    Args:
        dim: channels C. num_heads: h (must divide C). num_clusters: M (0 = plain MHSA).
        clustering: 'conv' | 'mlp' | 'linear' | None. None means this layer owns no clustering
            module and must be given the assignment ``z`` (shared within a stage or from
            the external teacher).
    """

    def __init__(self, dim: int, num_heads: int, num_clusters: int,
                 clustering: Optional[str] = 'conv', kernel_size: int = 7,
                 mlp_ratio: float = 4, attn_drop: float = 0., proj_drop: float = 0.):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'num_heads={num_heads} does not divide dim={dim}')
        self.num_heads = num_heads
        self.num_clusters = num_clusters
        if num_clusters > 0:
            self.cluster_norm = nn.LayerNorm(dim, eps=1e-6)
            if clustering is not None:
                self.clustering = build_clustering(clustering, dim, num_clusters,
                                                   kernel_size, mlp_ratio)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    @property
    def owns_clustering(self) -> bool:
        return hasattr(self, 'clustering')

    def forward(self, x: torch.Tensor, hw: Tuple[int, int],
                z: Optional[torch.Tensor] = None):
        """x: (B, N, C) normalised tokens on an H x W grid; z: the (B, M, N) assignment,
        required when this layer owns no clustering module.

        Returns ``(out (B, N, C), z (B, M, N) or None, logits (B, M, N) or None)``;
        ``logits`` are the pre-softmax clustering scores where this layer computed them.
        """
        B, N, C = x.shape
        logits = None
        kv = x  # plain MHSA: keys and values from the patches
        if self.num_clusters > 0:
            if self.owns_clustering:
                logits = self.clustering(x, hw)
                z = cluster_softmax(logits)
            elif z is None:
                raise RuntimeError('this PaCa layer has no clustering module and was not '
                                   'given a cluster assignment z')
            kv = self.cluster_norm(torch.matmul(z.to(x.dtype), x))  # (B, M, C)
        h = self.num_heads
        q = self.q(x).reshape(B, N, h, C // h).transpose(1, 2)  # (B, h, N, d)
        k = self.k(kv).reshape(B, -1, h, C // h).transpose(1, 2)  # (B, h, M, d)
        v = self.v(kv).reshape(B, -1, h, C // h).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop if self.training else 0.)
        out = self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, N, C)))
        return out, z, logits
