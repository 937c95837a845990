"""PaCa-ViT backbone (paper Sec. 3, Fig. 2; official ``PaCaViT``), one class for all variants.

A 4-stage pyramid (strides 4, 8, 16, 32). Every stage is a stack of pre-norm PaCa blocks
on (B, N, C) tokens; a strided 3x3 conv + LayerNorm2d moves between stages. Outputs are
the LayerNorm-ed stage maps (B, C_i, H_i, W_i) for ``out_indices``, with
``H_1 = ceil(ceil(H / 2) / 2)`` and ``H_{i+1} = ceil(H_i / 2)``.

State-dict keys equal the official implementation's (``patch_embed``, ``stage{i}.{j}``,
``norm{i}``, ``transition{i}``, ``paca_teacher``), so released checkpoints load directly.
"""
import copy
import math
from typing import Dict, List, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmcv.cnn.bricks import DropPath
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from ..layers.common import ConvFFN, LayerNorm2d, map_to_tokens, tokens_to_map
from ..layers.paca import (CLUSTERING_TYPES, OFFICIAL_CLUSTERING_NAMES,
                           PaCaAttention)
from .paca_teacher import ConvMixerTeacher

# Architecture settings (official ``_arch_settings``). The *_teacher ones have fewer
# ViT blocks, to leave room for the ConvMixer teacher.
ARCH_SETTINGS: Dict[str, dict] = {
    'tiny': dict(embed_dims=(96, 192, 320, 384), depths=(2, 2, 4, 2),
                 num_heads=(2, 4, 8, 16), mlp_ratios=(4, 4, 4, 4), drop_path_rate=0.1),
    'small': dict(embed_dims=(96, 192, 320, 384), depths=(3, 3, 10, 3),
                  num_heads=(2, 4, 8, 16), mlp_ratios=(4, 4, 4, 4), drop_path_rate=0.1),
    'base': dict(embed_dims=(96, 192, 384, 512), depths=(3, 3, 18, 3),
                 num_heads=(2, 4, 8, 16), mlp_ratios=(4, 4, 4, 4), drop_path_rate=0.5),
    'tiny_teacher': dict(embed_dims=(96, 192, 320, 384), depths=(2, 2, 2, 2),
                         num_heads=(2, 4, 8, 16), mlp_ratios=(4, 4, 4, 4),
                         drop_path_rate=0.1, teacher_depths=(2, 2, 2, 2)),
    'small_teacher': dict(embed_dims=(96, 192, 320, 384), depths=(3, 3, 7, 3),
                          num_heads=(2, 4, 8, 16), mlp_ratios=(4, 4, 4, 4),
                          drop_path_rate=0.1, teacher_depths=(2, 2, 2, 2)),
    'base_teacher': dict(embed_dims=(96, 192, 384, 512), depths=(3, 3, 16, 3),
                         num_heads=(2, 4, 8, 16), mlp_ratios=(4, 4, 4, 4),
                         drop_path_rate=0.1, teacher_depths=(2, 2, 4, 2)),
}


def _preset(arch, clusters, clustering='conv', sharing='stage', teacher=False):
    return dict(arch=arch, num_clusters=clusters, clustering=clustering,
                cluster_sharing=sharing, teacher=teacher)


# The released models (official timm names; ``_downstream`` suffixes are accepted too).
PRESETS: Dict[str, dict] = {
    'pacavit_tiny_p2cconv_100_0': _preset('tiny', (100, 100, 100, 0)),
    'pacavit_small_p2cconv_100_0': _preset('small', (100, 100, 100, 0)),
    'pacavit_base_p2cconv_100_0': _preset('base', (100, 100, 100, 0)),
    'pacavit_small_p2cmlp_100_0': _preset('small', (100, 100, 100, 0), 'mlp'),
    'pacavit_small_p2cconv_2_0': _preset('small', (2, 2, 2, 0)),
    'pacavit_small_p2cconv_49_0': _preset('small', (49, 49, 49, 0)),
    'pacavit_small_p2cconv_49_100': _preset('small', (49, 64, 81, 100)),
    'pacavit_small_p2cconv_100_49': _preset('small', (100, 81, 64, 49)),
    'pacavit_small_p2cconv_100': _preset('small', (100, 100, 100, 100)),
    'pacavit_small_p2cconv_100_blockwise': _preset('small', (100, 100, 100, 100),
                                                   sharing='block'),
    'pacavit_convmixer_tiny_100': _preset('tiny_teacher', (100, 100, 100, 100), teacher=True),
    'pacavit_convmixer_small_100': _preset('small_teacher', (100, 100, 100, 100),
                                           teacher=True),
    'pacavit_convmixer_base_100': _preset('base_teacher', (100, 100, 100, 100), teacher=True),
}
# Short aliases: 'tiny'/'small'/'base' are the default (conv, 100-100-100-0) models.
PRESET_ALIASES = {
    'tiny': 'pacavit_tiny_p2cconv_100_0', 'small': 'pacavit_small_p2cconv_100_0',
    'base': 'pacavit_base_p2cconv_100_0', 'small_mlp': 'pacavit_small_p2cmlp_100_0',
    'ec_tiny': 'pacavit_convmixer_tiny_100', 'ec_small': 'pacavit_convmixer_small_100',
    'ec_base': 'pacavit_convmixer_base_100',
    'small_blockwise': 'pacavit_small_p2cconv_100_blockwise',
}

DEFAULT_CLUSTERS = (100, 100, 100, 0)


def resolve_preset(arch: Union[str, dict]) -> dict:
    """Map an ``arch`` argument to a full setting dict (embed dims, depths, ... and the
    clustering defaults of the preset). Raises ValueError naming the valid values."""
    if isinstance(arch, dict):
        setting = dict(arch)
        for key in ('embed_dims', 'depths', 'num_heads'):
            if key not in setting:
                raise ValueError(f'a custom arch dict needs {key!r}; got keys {sorted(setting)}')
        setting.setdefault('mlp_ratios', (4,) * len(setting['embed_dims']))
        return setting
    name = arch.lower() if isinstance(arch, str) else arch
    if isinstance(name, str) and name.endswith('_downstream'):
        name = name[:-len('_downstream')]
    name = PRESET_ALIASES.get(name, name)
    if name in PRESETS:
        preset = PRESETS[name]
        setting = copy.deepcopy(ARCH_SETTINGS[preset['arch']])
        setting.update({k: v for k, v in preset.items() if k != 'arch'})
        return setting
    if name in ARCH_SETTINGS:
        setting = copy.deepcopy(ARCH_SETTINGS[name])
        setting['teacher'] = 'teacher_depths' in setting
        return setting
    raise ValueError(
        f'Unknown PaCaViT arch {arch!r}. Valid: {sorted(ARCH_SETTINGS)}, presets '
        f'{sorted(PRESETS)}, aliases {sorted(PRESET_ALIASES)}, or a dict with embed_dims, '
        'depths, num_heads (and optionally mlp_ratios).')


class Stem(nn.Module):
    """Two 3x3 stride-2 convs (no act/norm between) + LayerNorm2d: (B,3,H,W) -> (B,C,H/4,W/4)."""

    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        self.proj = nn.Sequential(
            nn.Conv2d(in_channels, dim // 2, 3, 2, 1), nn.Conv2d(dim // 2, dim, 3, 2, 1))
        self.norm = LayerNorm2d(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x))


class Transition(nn.Module):
    """3x3 stride-2 conv + LayerNorm2d: (B, C_i, H, W) -> (B, C_{i+1}, ceil(H/2), ceil(W/2))."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_dim, out_dim, 3, 2, 1)
        self.norm = LayerNorm2d(out_dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x))


class PaCaBlock(nn.Module):
    """Pre-norm block: x + DropPath(PaCa(LN(x))), then x + DropPath(ConvFFN(LN(x))).

    (B, N, C) -> (B, N, C); also passes the (B, M, N) assignment ``z`` on to the next block.
    """

    def __init__(self, dim: int, num_heads: int, num_clusters: int, clustering: Optional[str],
                 mlp_ratio: float, drop_path: float, attn_drop: float, drop: float,
                 kernel_size: int, layer_scale: Optional[float]):
        super().__init__()
        self.norm1_before = nn.LayerNorm(dim, eps=1e-6)
        self.attn = PaCaAttention(dim, num_heads, num_clusters, clustering, kernel_size,
                                  mlp_ratio, attn_drop, drop)
        self.norm2_before = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ConvFFN(dim, mlp_ratio, drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        if layer_scale is not None:
            self.gamma1 = nn.Parameter(torch.full((dim,), float(layer_scale)))
            self.gamma2 = nn.Parameter(torch.full((dim,), float(layer_scale)))
        else:
            self.gamma1 = self.gamma2 = None

    def forward(self, x: torch.Tensor, hw, z: Optional[torch.Tensor] = None):
        """x: (B, N, C) tokens, z: the stage's (B, M, N) assignment or None ->
        (x (B, N, C), z, this block's clustering logits (B, M, N) or None)."""
        a, z, logits = self.attn(self.norm1_before(x), hw, z)
        if self.gamma1 is not None:
            a = self.gamma1 * a
        x = x + self.drop_path(a)
        f = self.mlp(self.norm2_before(x), hw)
        if self.gamma2 is not None:
            f = self.gamma2 * f
        return x + self.drop_path(f), z, logits


def _per_stage(value, num_stages: int, name: str, cast=int) -> List:
    if isinstance(value, (int, float, str)):
        return [value] * num_stages
    value = list(value)
    if len(value) != num_stages:
        raise ValueError(f'{name} must have one entry per stage ({num_stages}), got {value}')
    return [cast(v) if not isinstance(v, str) else v for v in value]


class PaCaViT(BaseModule):
    """PaCa-ViT backbone.

    Args:
        arch: 'tiny' | 'small' | 'base' | '*_teacher', an official preset name such as
            'pacavit_small_p2cmlp_100_0' (see ``PRESETS``/``PRESET_ALIASES``), or a dict with
            ``embed_dims``, ``depths``, ``num_heads`` (``mlp_ratios``).
        num_clusters: M per stage, e.g. (100, 100, 100, 0); 0 = plain MHSA in that stage.
            Default: the preset's, else (100, 100, 100, 0).
        clustering: 'conv' (Eqns. 4-5) | 'mlp' (Eqn. 6) | 'linear'. Default: preset's/'conv'.
        cluster_sharing: 'stage' (the first block clusters, the others reuse its assignment),
            'block' (every block clusters), an int k (blocks j % k == 0 cluster), or one of
            these per stage.
        teacher: False/None, True (ConvMixer teacher with the arch's ``teacher_depths``), or a
            dict(depths=..., kernel_size=7) — the external clustering teacher PaCa^ec.
        drop_path_rate: stochastic depth, linear over all blocks. Default: the arch's.
        layer_scale: None or an initial value for per-block layer scale (not in releases).
        out_indices: stages whose maps are returned. frozen_stages: -1 none, 0 the stem,
            k >= 1 the stem and stages 1..k. norm_eval: BN layers (teacher) in eval mode.
        with_cp: activation checkpointing per block.
        init_cfg: e.g. ``dict(type='Pretrained', checkpoint=PATH, prefix=None)``; loaded in
            ``init_weights`` after the random init (see ``paca_mm.checkpoint``).
    """

    def __init__(self, arch: Union[str, dict] = 'tiny', in_channels: int = 3,
                 num_clusters: Optional[Sequence[int]] = None, clustering: Optional[str] = None,
                 cluster_sharing=None, teacher=None, clustering_kernel_size: int = 7,
                 drop_path_rate: Optional[float] = None, attn_drop_rate: float = 0.,
                 drop_rate: float = 0., layer_scale: Optional[float] = None,
                 out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False,
                 init_cfg: Optional[Union[dict, List[dict]]] = None):
        super().__init__(init_cfg=init_cfg)
        setting = resolve_preset(arch)
        self.arch = arch
        self.embed_dims = list(setting['embed_dims'])
        depths = list(setting['depths'])
        self.num_stages = len(self.embed_dims)
        num_heads = _per_stage(setting['num_heads'], self.num_stages, 'num_heads')
        mlp_ratios = _per_stage(setting['mlp_ratios'], self.num_stages, 'mlp_ratios', float)
        depths = _per_stage(depths, self.num_stages, 'depths')
        self.depths = depths

        num_clusters = num_clusters if num_clusters is not None else setting.get(
            'num_clusters', DEFAULT_CLUSTERS)
        num_clusters = _per_stage(num_clusters, self.num_stages, 'num_clusters')
        for m in num_clusters:
            if m < 0:
                raise ValueError(f'num_clusters must be >= 0 per stage (0 = plain attention), '
                                 f'got {num_clusters}')
        self.num_clusters = num_clusters
        clustering = clustering if clustering is not None else setting.get('clustering', 'conv')
        clustering = OFFICIAL_CLUSTERING_NAMES.get(clustering, clustering)
        if clustering not in CLUSTERING_TYPES:
            raise ValueError(f'clustering must be one of {CLUSTERING_TYPES}, got {clustering!r}')
        self.clustering = clustering
        sharing = cluster_sharing if cluster_sharing is not None else setting.get(
            'cluster_sharing', 'stage')
        sharing = sharing if isinstance(sharing, (list, tuple)) else [sharing] * self.num_stages
        if len(sharing) != self.num_stages:
            raise ValueError(f'cluster_sharing needs one entry per stage, got {sharing}')
        every = []
        for s in sharing:
            if s == 'stage' or s == 0:
                every.append(0)
            elif s == 'block':
                every.append(1)
            elif isinstance(s, int) and s > 0:
                every.append(s)
            else:
                raise ValueError("cluster_sharing must be 'stage', 'block' or a positive int "
                                 f'(cluster every k blocks), got {s!r}')
        self.cluster_every = every

        if teacher is None:
            teacher = setting.get('teacher', False)
        if teacher is True:
            if 'teacher_depths' not in setting:
                raise ValueError(f'arch {arch!r} has no teacher_depths; pass teacher=dict('
                                 'depths=(2, 2, 2, 2)) or use a *_teacher arch')
            teacher = dict(depths=setting['teacher_depths'])
        self.teacher_cfg = dict(teacher) if teacher else None

        for i, (dim, h) in enumerate(zip(self.embed_dims, num_heads)):
            if dim % h:
                raise ValueError(f'num_heads[{i}]={h} does not divide embed_dims[{i}]={dim}')
        out_indices = [out_indices] if isinstance(out_indices, int) else list(out_indices)
        for i, idx in enumerate(out_indices):
            if idx < 0:
                out_indices[i] = idx + self.num_stages
            if not 0 <= out_indices[i] < self.num_stages:
                raise ValueError(f'out_indices {idx} out of range: valid are 0..'
                                 f'{self.num_stages - 1} (or negative from the end)')
        self.out_indices = out_indices
        if not -1 <= frozen_stages <= self.num_stages:
            raise ValueError(f'frozen_stages must be in [-1, {self.num_stages}], '
                             f'got {frozen_stages}')
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp
        if drop_path_rate is None:
            drop_path_rate = setting.get('drop_path_rate', 0.)
        self.drop_path_rate = drop_path_rate

        # Registration order follows the official model (teacher first) so that state_dict
        # key order matches the released checkpoints.
        if self.teacher_cfg:
            self.paca_teacher = ConvMixerTeacher(
                self.embed_dims, num_clusters,
                depths=_per_stage(self.teacher_cfg.get('depths', 2), self.num_stages,
                                  'teacher depths'),
                kernel_size=self.teacher_cfg.get('kernel_size', 7))
        else:
            self.paca_teacher = None
        self.patch_embed = Stem(in_channels, self.embed_dims[0])
        self.in_channels = in_channels
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        cur = 0
        for i in range(self.num_stages):
            blocks = nn.ModuleList()
            for j in range(depths[i]):
                onsite = (not self.teacher_cfg) and (
                    j == 0 or (every[i] > 0 and j % every[i] == 0))
                blocks.append(PaCaBlock(
                    self.embed_dims[i], num_heads[i], num_clusters[i],
                    clustering if onsite else None, mlp_ratios[i], dpr[cur + j],
                    attn_drop_rate, drop_rate, clustering_kernel_size, layer_scale))
            cur += depths[i]
            setattr(self, f'stage{i + 1}', blocks)
            setattr(self, f'norm{i + 1}', nn.LayerNorm(self.embed_dims[i], eps=1e-6))
            if i < self.num_stages - 1:
                setattr(self, f'transition{i + 1}',
                        Transition(self.embed_dims[i], self.embed_dims[i + 1]))
        self.record_clusters = False
        self.cluster_logits: List[Optional[torch.Tensor]] = []
        self._freeze_stages()

    # ------------------------------------------------------------------ init
    def _random_init(self):
        """Official init: trunc_normal(0.02) Linear, unit norms, He-normal(fan_out) convs."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.LayerNorm, _BatchNorm, nn.GroupNorm)):
                if m.weight is not None:
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                nn.init.normal_(m.weight, 0, math.sqrt(2.0 / fan_out))
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def init_weights(self):
        """Random init, then the ``Pretrained`` checkpoint of ``init_cfg`` if one is given.

        Unlike the official code (which loads in ``__init__`` and is then re-randomised by
        mmengine's Runner), loading happens here, after the random init.
        """
        self._random_init()
        cfgs = self.init_cfg if isinstance(self.init_cfg, list) else (
            [self.init_cfg] if self.init_cfg else [])
        for cfg in cfgs:
            if cfg.get('type') != 'Pretrained':
                raise ValueError(f'PaCaViT supports init_cfg type "Pretrained" only (the random '
                                 f'init is built in), got {cfg}')
            from ...checkpoint import load_backbone_checkpoint
            load_backbone_checkpoint(self, cfg['checkpoint'], prefix=cfg.get('prefix'),
                                     strict=cfg.get('strict', False),
                                     map_location=cfg.get('map_location', 'cpu'),
                                     trust=cfg.get('trust', False))
        self._is_init = True

    # ----------------------------------------------------------- freezing
    def _stage_modules(self, i: int) -> List[nn.Module]:
        mods = [getattr(self, f'stage{i + 1}'), getattr(self, f'norm{i + 1}')]
        if i > 0:
            mods.append(getattr(self, f'transition{i}'))
        if self.paca_teacher is not None:
            mods += self.paca_teacher.stage_modules(i)
        return mods

    def _freeze_stages(self):
        if self.frozen_stages < 0:
            return
        mods = [self.patch_embed]
        for i in range(self.frozen_stages):
            mods += self._stage_modules(i)
        for m in mods:
            m.eval()
            for p in m.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    # ------------------------------------------------------------ forward
    def _check_input(self, x: torch.Tensor):
        if not torch.is_tensor(x) or x.dim() != 4:
            shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
            raise ValueError(f'PaCaViT expects a 4-D (B, C, H, W) tensor, got {shape}')
        if x.shape[2] < 1 or x.shape[3] < 1:
            raise ValueError(f'PaCaViT got an empty image {tuple(x.shape)}: H and W must be >= 1 '
                             '(any size >= 1x1 works; odd sizes are handled by the strided convs)')
        if x.shape[1] != self.in_channels:
            raise ValueError(f'PaCaViT was built with in_channels={self.in_channels} but the '
                             f'input has {x.shape[1]} channels (shape {tuple(x.shape)})')

    def forward(self, x: torch.Tensor):
        """(B, in_channels, H, W) -> tuple of (B, C_i, H_i, W_i) for i in ``out_indices``.

        With ``self.record_clusters = True`` the pre-softmax assignment logits of every
        stage, (B, M_i, H_i, W_i) (None where M_i = 0; the first clustering block's in
        block-wise mode), are kept in ``self.cluster_logits`` from the same pass.
        """
        self._check_input(x)
        x = self.patch_embed(x)  # (B, C_1, H_1, W_1), channels_last (see LayerNorm2d)
        B = x.shape[0]
        if self.paca_teacher is not None:
            t_z, t_logits, t_outs = self.paca_teacher(x)
        record = self.record_clusters
        cluster_logits = []
        outs = []
        for i in range(self.num_stages):
            hw = (x.shape[2], x.shape[3])  # x: (B, C_i, H_i, W_i) map
            x = map_to_tokens(x)
            z = t_z[i] if self.paca_teacher is not None else None
            first_logits = t_logits[i] if self.paca_teacher is not None else None
            for blk in getattr(self, f'stage{i + 1}'):
                if self.with_cp and self.training and x.requires_grad:
                    x, z, logits = cp.checkpoint(blk, x, hw, z, use_reentrant=False)
                else:
                    x, z, logits = blk(x, hw, z)
                if first_logits is None:
                    first_logits = logits
            if self.paca_teacher is not None:
                x = x + t_outs[i]
            x = getattr(self, f'norm{i + 1}')(x)
            if record:
                cluster_logits.append(None if first_logits is None else
                                      first_logits.detach().reshape(B, -1, hw[0], hw[1]))
            if i in self.out_indices:
                # (B, C, H, W), contiguous: mmcv's RoIAlign (and other custom ops) read the
                # raw NCHW memory and give wrong results on channels_last strides.
                outs.append(tokens_to_map(x, hw).contiguous())
            if i < self.num_stages - 1:
                x = getattr(self, f'transition{i + 1}')(tokens_to_map(x, hw))
        if record:
            self.cluster_logits = cluster_logits
        return tuple(outs)
