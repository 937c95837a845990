"""PaCa segmentation head (paper Sec. 3.4, Fig. 5, Eqns. 9-14; official ``PaCaSegHead``).

Shapes: ``B`` batch, ``H1 x W1`` the grid of the first selected level (stride 4 for a
PaCa-ViT backbone), ``N1 = H1*W1``, ``D = channels``, ``n`` selected levels (4 normally),
``L = num_classes`` (the number of clusters equals the number of classes).

State-dict keys equal the official head's (``conv_seg``, ``convs.{i}``, ``q.0``,
``clustering.{0,1}``, ``k.{0,2}``, ``v.{0,2}``, ``proj``) so released ADE20k checkpoints
load. Unlike the official head, ``forward`` always returns the segmentation logits, the
K/V norm is built from ``norm_cfg`` (the official one is a hard-coded SyncBN) and the
auxiliary clustering loss is returned in the same loss dict under its own name
(``loss_paca``/``acc_paca`` by default), so mmseg's stock ``EncoderDecoder`` trains it.
"""
import copy
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmcv.cnn import ConvModule, build_activation_layer, build_norm_layer
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.models.losses import accuracy
from mmseg.models.utils import resize
from mmseg.registry import MODELS
from torch import Tensor

# The default auxiliary loss: CE on the raw clustering logits (official weight 0.4).
DEFAULT_AUX_LOSS = dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4,
                        avg_non_ignore=True, loss_name='loss_paca')

# norm types that work on (B, C, L) sequences, for the K/V LinearBlocks.
_SEQ_NORM = {'BN': 'BN1d', 'BN2d': 'BN1d', 'BN1d': 'BN1d', 'SyncBN': 'SyncBN',
             'GN': 'GN', 'IN': 'IN1d', 'IN2d': 'IN1d', 'IN1d': 'IN1d'}


class Transpose(nn.Module):
    """Swap the last two dimensions: (B, L, D) <-> (B, D, L). No parameters."""

    def forward(self, x: Tensor) -> Tensor:
        return x.transpose(1, 2)


class Flatten2d(nn.Module):
    """(B, D, H, W) -> (B, H*W, D). No parameters."""

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(2).transpose(1, 2)


def linear_block(in_features: int, out_features: int, norm_cfg: Optional[dict],
                 act_cfg: Optional[dict]) -> nn.Sequential:
    """LinearBlock of Eqn. 12 on (B, L, C_in) cluster tokens -> (B, L, C_out).

    Indices match the official ``k``/``v`` Sequentials: 0 Linear, 1 transpose, 2 norm over
    channels (L acts as the length axis), 3 transpose back, 4 activation.
    """
    if norm_cfg is None:
        norm = nn.Identity()
    else:
        cfg = dict(norm_cfg)
        norm_type = cfg.get('type')
        if norm_type not in _SEQ_NORM:
            raise ValueError(f'PaCaHead: norm_cfg type {norm_type!r} cannot normalise the '
                             f'(B, D, L) cluster tokens of k/v; use one of {sorted(_SEQ_NORM)}')
        cfg['type'] = _SEQ_NORM[norm_type]
        norm = build_norm_layer(cfg, out_features)[1]
    if act_cfg is None:
        act = nn.Identity()
    else:
        act = build_activation_layer(act_cfg)
    return nn.Sequential(nn.Linear(in_features, out_features), Transpose(), norm, Transpose(),
                         act)


class PaCaHead(BaseDecodeHead):
    """PaCa segmentation head: a single-head patch-to-cluster attention with L = num_classes
    clusters that are directly supervised by the label map.

    Forward, for the selected levels ``X_i`` (B, C_i, H_i, W_i):
      1. ``F = cat_i(resize(convs[i](X_i), (H1, W1)))`` -> (B, n*D, H1, W1)
      2. clustering logits ``S = clustering(F)`` -> (B, L, H1, W1);
         ``C = softmax(S over N1)`` (Eqn. 9)
      3. ``Q = q(F)`` -> (B, N1, D) (Eqn. 10); ``Z = C F^T`` -> (B, L, n*D) (Eqn. 11)
      4. ``K = k(Z)``, ``V = v(Z)`` -> (B, L, D) (Eqn. 12, LinearBlocks)
      5. ``out = proj(softmax_L(Q K^T) V)`` -> (B, D, H1, W1) (Eqn. 13, no 1/sqrt(D) scale)
      6. ``cls_seg(out)`` (dropout + ``conv_seg``) -> (B, L, H1, W1) (Eqn. 14)

    Args:
        in_channels: channels of the selected levels, e.g. (96, 192, 320, 384).
        channels: D. num_classes: L (>= 1), also the number of clusters.
        in_index: which backbone outputs to use; default ``range(len(in_channels))``.
        interpolate_mode: resize mode for levels 2..n (default 'bilinear').
        aux_loss_decode: the loss(es) on the raw clustering logits ``S`` (resized to the
            label size, ignore_index and sampler as for the main loss), a dict or a list of
            dicts, or None to disable. Default: CE, weight 0.4, avg_non_ignore, reported as
            ``loss_paca``. An aux loss whose ``loss_name`` is also a main loss name (e.g. the
            official config's unnamed CE, 'loss_ce') is reported as 'loss_paca_<rest>'.
        **kwargs: everything else goes to ``BaseDecodeHead`` (``dropout_ratio``,
            ``norm_cfg``, ``act_cfg``, ``align_corners``, ``loss_decode``, ``sampler``,
            ``ignore_index``, ...). ``input_transform`` is always 'multiple_select'.
    """

    def __init__(self, in_channels: Sequence[int], channels: int = 256, *,
                 num_classes: int, in_index: Optional[Sequence[int]] = None,
                 interpolate_mode: str = 'bilinear',
                 aux_loss_decode: Union[dict, Sequence[dict], None] = DEFAULT_AUX_LOSS,
                 **kwargs):
        if isinstance(in_channels, int) or not isinstance(in_channels, (list, tuple)) \
                or len(in_channels) == 0:
            raise ValueError('PaCaHead: in_channels must be a non-empty list of channel '
                             f'numbers, one per selected backbone level; got {in_channels!r}')
        in_channels = [int(c) for c in in_channels]
        if in_index is None:
            in_index = list(range(len(in_channels)))
        elif isinstance(in_index, int):
            in_index = [in_index]
        in_index = list(in_index)
        if len(in_index) != len(in_channels):
            raise ValueError(f'PaCaHead: in_channels {in_channels} and in_index {in_index} '
                             'must have the same length (one channel number per level)')
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f'PaCaHead: num_classes must be an int >= 1, got {num_classes!r}')
        transform = kwargs.pop('input_transform', 'multiple_select')
        if transform not in (None, 'multiple_select'):
            raise ValueError("PaCaHead selects its levels itself; input_transform must be "
                             f"'multiple_select' (or omitted), got {transform!r}")
        super().__init__(in_channels, channels, num_classes=num_classes, in_index=in_index,
                         input_transform='multiple_select', **kwargs)
        self.interpolate_mode = interpolate_mode
        num_levels = len(in_channels)
        fused = num_levels * channels  # 4D in the paper
        conv = dict(conv_cfg=self.conv_cfg, norm_cfg=self.norm_cfg, act_cfg=self.act_cfg)

        self.convs = nn.ModuleList(
            [ConvModule(c, channels, 1, **conv) for c in in_channels])
        self.q = nn.Sequential(ConvModule(fused, channels, 1, **conv), Flatten2d())
        self.clustering = nn.Sequential(
            ConvModule(fused, channels, 1, **conv),
            nn.Conv2d(channels, num_classes, 1, bias=True))
        self.k = linear_block(fused, channels, self.norm_cfg, self.act_cfg)
        self.v = linear_block(fused, channels, self.norm_cfg, self.act_cfg)
        self.proj = ConvModule(channels, channels, 1, **conv)

        self.aux_loss_names: List[str] = []
        self.aux_loss_decode = self._build_aux_losses(aux_loss_decode)

    # ------------------------------------------------------------------ losses
    def _main_loss_names(self) -> List[str]:
        losses = self.loss_decode if isinstance(self.loss_decode, nn.ModuleList) else [
            self.loss_decode]
        return [loss.loss_name for loss in losses]

    def _build_aux_losses(self, cfg) -> Optional[nn.ModuleList]:
        if cfg is None:
            return None
        if isinstance(cfg, dict):
            cfgs = [cfg]
        elif isinstance(cfg, (list, tuple)):
            cfgs = list(cfg)
        else:
            raise TypeError('PaCaHead: aux_loss_decode must be a dict, a list of dicts or '
                            f'None, got {type(cfg).__name__}')
        main = set(self._main_loss_names())
        losses = nn.ModuleList()
        for c in cfgs:
            if not isinstance(c, dict):
                raise TypeError(f'PaCaHead: aux_loss_decode entries must be dicts, got {c!r}')
            loss = MODELS.build(copy.deepcopy(c))
            name = loss.loss_name
            if name in main:
                name = 'loss_paca_' + (name[len('loss_'):] if name.startswith('loss_')
                                       else name)
            if not name.startswith('loss'):
                raise ValueError(f'PaCaHead: aux loss name {name!r} must start with "loss" '
                                 '(mmengine only back-propagates keys containing "loss")')
            losses.append(loss)
            self.aux_loss_names.append(name)
        return losses

    # ----------------------------------------------------------------- forward
    def _check_inputs(self, inputs: Sequence[Tensor]):
        if not isinstance(inputs, (list, tuple)):
            raise TypeError('PaCaHead expects a list/tuple of backbone feature maps, got '
                            f'{type(inputs).__name__}')
        if max(self.in_index) >= len(inputs) or min(self.in_index) < -len(inputs):
            raise ValueError(f'PaCaHead: in_channels {self.in_channels} / in_index '
                             f'{self.in_index} ask for {len(self.in_index)} levels up to '
                             f'index {max(self.in_index)}, but the backbone returned '
                             f'{len(inputs)} outputs')
        for idx, c in zip(self.in_index, self.in_channels):
            x = inputs[idx]
            if x.dim() != 4 or x.shape[1] != c:
                raise ValueError(
                    f'PaCaHead: in_channels says level {idx} has {c} channels, but the '
                    f'backbone output {idx} has shape {tuple(x.shape)}; set in_channels to '
                    f'{[tuple(inputs[i].shape)[1] for i in self.in_index]}')

    def forward_with_clusters(self, inputs: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
        """Backbone maps -> (seg logits (B, L, H1, W1), raw clustering logits (B, L, H1, W1))."""
        self._check_inputs(inputs)
        xs = self._transform_inputs(inputs)
        size = xs[0].shape[2:]
        feats = [conv(x) for conv, x in zip(self.convs, xs)]
        feats = [feats[0]] + [
            resize(f, size=size, mode=self.interpolate_mode, align_corners=self.align_corners)
            for f in feats[1:]]
        fused = torch.cat(feats, dim=1)  # (B, nD, H1, W1)
        B, _, H, W = fused.shape

        cluster_logits = self.clustering(fused)  # (B, L, H1, W1)
        assign = cluster_logits.flatten(2).float().softmax(dim=-1).to(fused.dtype)  # over N1
        z = torch.bmm(assign, fused.flatten(2).transpose(1, 2))  # (B, L, nD)
        q = self.q(fused)  # (B, N1, D)
        k = self.k(z)  # (B, L, D)
        v = self.v(z)  # (B, L, D)
        attn = torch.bmm(q, k.transpose(1, 2)).float().softmax(dim=-1).to(v.dtype)  # (B,N1,L)
        out = torch.bmm(attn, v).transpose(1, 2).reshape(B, self.channels, H, W)
        out = self.cls_seg(self.proj(out))
        return out, cluster_logits

    def forward(self, inputs: Sequence[Tensor]) -> Tensor:
        """Backbone maps -> segmentation logits (B, L, H1, W1), in train and eval mode."""
        return self.forward_with_clusters(inputs)[0]

    def loss(self, inputs: Sequence[Tensor], batch_data_samples, train_cfg) -> Dict[str, Tensor]:
        """Main losses (``loss_by_feat``) plus the auxiliary clustering losses, one dict."""
        seg_logits, cluster_logits = self.forward_with_clusters(inputs)
        losses = self.loss_by_feat(seg_logits, batch_data_samples)
        if self.aux_loss_decode is not None:
            aux = self.aux_loss_by_feat(cluster_logits, batch_data_samples)
            overlap = set(aux) & set(losses)
            if overlap:  # only reachable through a custom loss_decode naming
                raise ValueError(f'PaCaHead: aux loss keys {sorted(overlap)} collide with '
                                 'the main loss keys; rename the aux loss (loss_name=...)')
            losses.update(aux)
        return losses

    def aux_loss_by_feat(self, cluster_logits: Tensor, batch_data_samples) -> Dict[str, Tensor]:
        """Aux losses on raw clustering logits (B, L, h, w), resized to the label size.

        Each pixel's L clustering logits are trained as class logits (softmax over L inside
        the CE), while the attention pooling uses their softmax over N1: the direct
        supervision of the assignment C described in paper Sec. 3.4.
        """
        seg_label = self._stack_batch_gt(batch_data_samples)
        cluster_logits = resize(cluster_logits, size=seg_label.shape[2:], mode='bilinear',
                                align_corners=self.align_corners)
        seg_weight = self.sampler.sample(cluster_logits, seg_label) \
            if self.sampler is not None else None
        seg_label = seg_label.squeeze(1)
        losses: Dict[str, Tensor] = {}
        for name, loss_fn in zip(self.aux_loss_names, self.aux_loss_decode):
            value = loss_fn(cluster_logits, seg_label, weight=seg_weight,
                            ignore_index=self.ignore_index)
            losses[name] = losses[name] + value if name in losses else value
        losses['acc_paca'] = accuracy(cluster_logits, seg_label,
                                      ignore_index=self.ignore_index)
        return losses
