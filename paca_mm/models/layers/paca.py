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

from ... import ops
from .common import (apply_linear, conv_gelu, conv_gelu_fusable, linear,
                     map_to_tokens, op_inputs, plain_module, tokens_to_map)

CLUSTERING_TYPES = ('conv', 'mlp', 'linear')
# Names used by the official configs (``paca_cfg.type``).
OFFICIAL_CLUSTERING_NAMES = {'P2CConv2d': 'conv', 'P2CMlp': 'mlp', 'P2CLinear': 'linear'}


class ConvClustering(nn.Module):
    """Eqns. 4-5: DWConv(k) + GELU, PWConv + GELU, PWConv to M (no bias).

    (B, N, C) tokens on an H x W grid -> (B, M, N) clustering logits.
    """

    def __init__(self, dim: int, num_clusters: int, kernel_size: int = 7):
        super().__init__()
        self.clustering = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim),
            nn.GELU(),
            nn.Conv2d(dim, dim, 1),
            nn.GELU(),
            nn.Conv2d(dim, num_clusters, 1, bias=False),
        )

    fuse_gelu = True  # CPU inference: oneDNN convs with the GELU fused in (see below)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        # channels_last view in, channels_last out: (B, N, M) in memory, no layout copies.
        x = tokens_to_map(x, hw)
        if (self.fuse_gelu and conv_gelu_fusable(x)
                and plain_module(self.clustering[0], nn.Conv2d)
                and plain_module(self.clustering[2], nn.Conv2d)):
            # the same three convs, each GELU applied in the conv's output pass
            dw, pw, out = self.clustering[0], self.clustering[2], self.clustering[4]
            x = conv_gelu(x, dw.weight, dw.bias, dw.padding, dw.groups)
            x = out(conv_gelu(x, pw.weight, pw.bias, pw.padding, 1))
        else:
            x = self.clustering(x)
        return map_to_tokens(x).transpose(1, 2)


class MlpClustering(nn.Module):
    """Eqn. 6: Linear C -> rC, GELU, Linear rC -> M. (B, N, C) -> (B, M, N)."""

    def __init__(self, dim: int, num_clusters: int, mlp_ratio: float = 4):
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


def build_clustering(kind: str, dim: int, num_clusters: int, kernel_size: int = 7,
                     mlp_ratio: float = 4) -> nn.Module:
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
    """Softmax of (B, M, N) clustering logits along N, computed in float32 or better.

    A long softmax in half precision loses mass, so under AMP (fp16/bf16 logits) the
    assignment is computed and kept in float32; float64 stays float64.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if logits.dim() == 3 and logits.stride(1) == 1 and logits.stride(2) != 1:
        # A transposed view of (B, N, M) memory (what the clustering modules return):
        # softmax over N in that layout (vectorised along M) and return the same view,
        # instead of transposing to (B, M, N) memory first (2.3x faster at N = 64000).
        t = logits.transpose(1, 2)
        if not (torch.is_grad_enabled() and t.requires_grad):
            # Without autograd, as max / exp / sum / divide passes: aten's softmax over a
            # non-last dim is 1.7x slower here (29.6 -> 17.1 ms at N = 64000, M = 100).
            e = torch.sub(t, t.amax(1, keepdim=True)).exp_()
            return e.div_(e.sum(1, keepdim=True)).transpose(1, 2)
        return torch.softmax(t, dim=1).transpose(1, 2)
    return torch.softmax(logits, dim=-1)


class PaCaAttention(nn.Module):
    """Patch-to-cluster attention (Eqns. 1-3).

    Queries come from the N patches; keys and values from M cluster tokens
    ``Z = LN(C^T X)`` where ``C`` (stored as (B, M, N)) is softmax-normalised over N.
    ``num_clusters == 0`` gives plain global multi-head self-attention.

    In CPU inference (eval mode, no autograd, float32) with M > 0, the attention from the
    cluster tokens on (q projection to output projection and residual) is computed by the
    compiled op (:meth:`forward_op`) where it is built; elsewhere by ATen's
    ``scaled_dot_product_attention`` between oneDNN projections.

    Args:
        dim: channels C. num_heads: h (must divide C). num_clusters: M (0 = plain MHSA).
        clustering: 'conv' | 'mlp' | 'linear' | None. None means this layer owns no clustering
            module and must be given the assignment ``z`` (shared within a stage or from
            the external teacher).
    """

    # The compiled op: tokens per thread and band, and when it folds the q and output
    # projections into per-image keys and values (h*M <= op_fold_ratio * (C + M), where that
    # costs about as many MACs as projecting and it replaces 2 + 2h GEMMs per band by 2).
    op_band_tokens = 512
    op_fold_ratio = 1.25

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

    @staticmethod
    def _fused(x: torch.Tensor, *linears: nn.Linear) -> torch.Tensor:
        """``cat([l(x) for l in linears], -1)`` as one GEMM (the separate q/k/v Linear
        modules are kept so checkpoint keys match the official ones); module calls where one
        of them is not a plain ``nn.Linear`` (see :func:`plain_module`)."""
        if not all(plain_module(m, nn.Linear) for m in linears):
            return torch.cat([m(x) for m in linears], dim=-1)
        return linear(x, torch.cat([m.weight for m in linears]),
                      torch.cat([m.bias for m in linears]))

    @property
    def owns_clustering(self) -> bool:
        return hasattr(self, 'clustering')

    def forward(self, x: torch.Tensor, hw: Tuple[int, int],
                z: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None,
                pre_norm: Optional[nn.Module] = None):
        """x: (B, N, C) tokens (normalised, or normalised here by ``pre_norm``); z: optional
        (B, M, N) float32 assignment; residual: optional (B, N, C) added to the output (in
        the projection's output pass where :func:`linear` can).

        Returns ``(out (B, N, C), z (B, M, N) or None, logits (B, M, N) or None)``;
        ``logits`` are the pre-softmax clustering scores when this layer computed them.
        Each (B, N, C) intermediate is released as soon as it is used, so that the
        allocator can reuse its memory for the next one.
        """
        if pre_norm is not None:
            x = pre_norm(x)
        B, N, C = x.shape
        logits = None
        if self.num_clusters > 0:
            if self.owns_clustering:
                logits = self.clustering(x, hw)
                z = cluster_softmax(logits)
            elif z is None:
                raise RuntimeError('this PaCa layer has no clustering module and was not '
                                   'given a cluster assignment z')
            c = self.cluster_norm(torch.matmul(z.to(x.dtype), x))  # (B, M, C)
            if self._use_op(x, residual):
                return self.forward_op(x, c, residual), z, logits
            q = apply_linear(self.q, x)
            k, v = self._fused(c, self.k, self.v).chunk(2, dim=-1)  # one GEMM for K and V
        else:  # plain MHSA: one GEMM for Q, K and V
            q, k, v = self._fused(x, self.q, self.k, self.v).chunk(3, dim=-1)
        del x
        h = self.num_heads
        q = q.view(B, N, h, C // h).transpose(1, 2)
        k = k.reshape(B, -1, h, C // h).transpose(1, 2)
        v = v.reshape(B, -1, h, C // h).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop if self.training else 0.)
        del q, k, v
        out = out.transpose(1, 2).reshape(B, N, C)
        if residual is not None and not (self.training and self.proj_drop.p > 0):
            return apply_linear(self.proj, out, residual), z, logits
        out = self.proj_drop(apply_linear(self.proj, out))
        return (out if residual is None else out + residual), z, logits

    def _use_op(self, x: torch.Tensor, residual: Optional[torch.Tensor]) -> bool:
        """Whether the compiled op computes this call: eval mode and :func:`op_inputs` (the
        op reads ``q``'s and ``proj``'s parameters directly)."""
        return not self.training and op_inputs(x, residual, (self.q, self.proj))

    def forward_op(self, x: torch.Tensor, c: torch.Tensor,
                   residual: Optional[torch.Tensor] = None,
                   out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(residual +) proj(attention(q(x), k(c), v(c)))`` by
        ``torch.ops.paca_mm.p2c_attention_inference``: x (B, N, C) normalised tokens, c
        (B, M, C) cluster tokens; returns ``out``, a new (B, N, C) tensor unless given (it
        may be ``x`` or ``residual`` itself). Each thread runs its share of the tokens
        ``op_band_tokens`` at a time, every intermediate in its cache."""
        B, N, C = x.shape
        h = self.num_heads
        d = C // h
        k, v = self._fused(c, self.k, self.v).chunk(2, dim=-1)  # (B, M, C) each
        M = k.shape[1]
        # per head, the keys transposed and scaled as in scaled_dot_product_attention
        kt = (k * d ** -0.5).reshape(B, M, h, d).permute(0, 2, 3, 1)  # (B, h, d, M)
        wq, bq, wp, bp = self.q.weight, self.q.bias, self.proj.weight, self.proj.bias
        ktt = kt.transpose(2, 3)  # (B, h, M, d)
        # q's bias enters the scores as bq_h kt_h: added in the op's softmax pass
        b_in = torch.matmul(ktt, bq.view(h, d, 1)).reshape(B, h * M)
        if h * M <= self.op_fold_ratio * (C + M):
            # scores = x (Wq_h^T kt_h) + bq_h kt_h; out = sum_h P_h (v_h Wp_h^T) + bp, and as
            # every head's P_h rows sum to 1, bp / h joins each of its columns
            w_in = torch.matmul(ktt, wq.view(h, d, C)).reshape(B, h * M, C)
            w_out = torch.matmul(wp.view(C, h, d).transpose(0, 1),  # (h, C, d)
                                 v.reshape(B, M, h, d).permute(0, 2, 3, 1))  # (B, h, C, M)
            w_out = (w_out + (bp / h).view(C, 1)).transpose(1, 2).reshape(B, C, h * M)
            kt = vals = bp = None
        else:
            w_in, w_out = wq.unsqueeze(0), wp.unsqueeze(0)
            kt, vals, bp = kt.contiguous(), v.contiguous(), bp.contiguous()
        if out is None:
            out = torch.empty_like(x)
        ops.require()  # loaded (forward() checked it; a direct call may not have)
        torch.ops.paca_mm.p2c_attention_inference(
            x, w_in.contiguous(), b_in.contiguous(), kt, vals, w_out.contiguous(), bp,
            residual, out, h, self.op_band_tokens)
        return out
