"""The PaCa forward explainer (paper Sec. 3.3, Figs. 6 and 9-10).

A PaCa stage assigns its N = H_i x W_i patches to M clusters; ``PaCaViT`` keeps the
pre-softmax assignment logits (B, M, H_i, W_i) when ``record_clusters = True``. Images are
raw pixels, (3, H, W) BGR in [0, 255] as the toolboxes' packers produce them: masks apply to
them (masked-out pixels are black), the model's ``data_preprocessor`` afterwards.
"""
import contextlib
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .inference import model_kind, normalize_inputs, unwrap


def find_backbone(model: nn.Module) -> nn.Module:
    """The PaCaViT backbone of a (wrapped) classifier/detector/segmentor, or the backbone
    itself. Raises TypeError when it cannot record clusters (not a PaCaViT)."""
    model = unwrap(model)
    backbone = model if hasattr(model, 'record_clusters') else getattr(model, 'backbone', None)
    if not hasattr(backbone, 'record_clusters'):
        name = type(getattr(model, 'backbone', model)).__name__
        raise TypeError(f'the cluster explainer needs a PaCaViT backbone (model.backbone with '
                        f'record_clusters), got {name}')
    return backbone


@contextlib.contextmanager
def recording(backbone: nn.Module, model: Optional[nn.Module] = None):
    """Sets ``backbone.record_clusters`` and ``model`` (default: backbone) eval; undone after."""
    model = backbone if model is None else model
    old_record, was_training = backbone.record_clusters, model.training
    backbone.record_clusters = True
    model.eval()
    try:
        yield backbone
    finally:
        backbone.record_clusters = old_record
        model.train(was_training)


def check_stage(backbone: nn.Module, stage: int) -> int:
    """Validate a 1-based stage index; returns the 0-based one."""
    num_stages = len(backbone.num_clusters)
    with_clusters = [i + 1 for i, m in enumerate(backbone.num_clusters) if m > 0]
    if not isinstance(stage, int) or not 1 <= stage <= num_stages:
        raise ValueError(f'stage is 1-based and must be in 1..{num_stages}, got {stage!r}')
    if backbone.num_clusters[stage - 1] == 0:
        raise ValueError(f'stage {stage} has no clusters (M=0, plain attention); stages with '
                         f'clusters: {with_clusters}')
    return stage - 1


@torch.no_grad()
def stage_cluster_logits(model: nn.Module, raw: torch.Tensor, stage: int = 3) -> torch.Tensor:
    """(B, M, H_s, W_s) float32 pre-softmax cluster assignment logits of one (1-based) stage
    from one backbone forward pass of (3, H, W) or (B, 3, H, W) raw pixels."""
    backbone = find_backbone(model)
    s = check_stage(backbone, stage)
    raw = raw[None] if raw.dim() == 3 else raw
    x = normalize_inputs(model, raw.to(next(backbone.parameters()).device))
    with recording(backbone):
        backbone(x)
        return backbone.cluster_logits[s].float()


def cluster_heatmaps(logits: torch.Tensor) -> torch.Tensor:
    """The paper's heatmaps ``H^m``: sigmoid of (B, M, h, w) or (M, h, w) logits."""
    return torch.sigmoid(logits.float())


def cluster_masks(logits: torch.Tensor, size=None) -> torch.Tensor:
    """Eqn. 7: bool masks ``H^m > mean(H^m)`` of (B, M, h, w) or (M, h, w) logits, nearest-
    upsampled to ``size`` (H, W) unless it is None."""
    squeeze = logits.dim() == 3
    heat = cluster_heatmaps(logits[None] if squeeze else logits)
    if heat.dim() != 4:
        raise ValueError(f'expected (B, M, h, w) or (M, h, w) logits, got {tuple(logits.shape)}')
    masks = heat > heat.mean(dim=(2, 3), keepdim=True)
    if size is not None:
        masks = F.interpolate(masks.float(), size=tuple(size), mode='nearest') > 0.5
    return masks[0] if squeeze else masks


@torch.no_grad()
def classify(model: nn.Module, raw: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
    """(B, 3, H, W) raw BGR pixels -> (B, K) class probabilities (softmax of the logits)."""
    if model_kind(model) != 'classifier':
        raise TypeError(f'{type(model).__name__} is not an image classifier; the group '
                        'analysis needs class predictions (the heatmaps work for any model)')
    device, out = next(model.parameters()).device, []
    for i in range(0, raw.shape[0], batch_size):
        x = normalize_inputs(model, raw[i:i + batch_size].to(device))
        logits = model(x, mode='tensor')
        if isinstance(logits, (tuple, list)):
            logits = logits[-1]
        out.append(torch.softmax(logits.float(), dim=-1).cpu())
    return torch.cat(out)


@dataclass
class ClusterGroups:
    """Result of :func:`analyze_cluster_groups`. ``label`` is the ground truth (the unmasked
    prediction unless ``label_given``); ``base_*`` are of the unmasked image; ``probs`` (M,)
    is P(label) and ``preds`` (M,) the prediction of each masked image."""
    stage: int
    label: int
    label_given: bool
    base_prob: float
    base_pred: int
    probs: torch.Tensor
    preds: torch.Tensor
    positive: List[int]
    negative: List[int]
    logits: torch.Tensor
    masks: torch.Tensor
    class_names: Optional[List[str]] = field(default=None)

    def class_name(self, c: int) -> str:
        names = self.class_names
        return names[c] if names and 0 <= c < len(names) else str(c)

    def summary(self) -> dict:
        """JSON-serialisable numbers."""
        groups = {title: [dict(cluster=m, prob=float(self.probs[m]), pred=int(self.preds[m]),
                               mask_fraction=float(self.masks[m].float().mean()))
                          for m in members]
                  for title, members in (('positive', self.positive), ('negative', self.negative))}
        for entry in groups['negative']:
            entry['pred_name'] = self.class_name(entry['pred'])
        return dict(stage=self.stage, label=self.label, label_name=self.class_name(self.label),
                    label_given=self.label_given, base_prob=self.base_prob,
                    base_pred=self.base_pred, num_clusters=int(self.probs.numel()), **groups)


@torch.no_grad()
def analyze_cluster_groups(model: nn.Module, raw: torch.Tensor, stage: int = 3,
                           label: Optional[int] = None, batch_size: int = 16,
                           class_names: Optional[List[str]] = None) -> ClusterGroups:
    """Eqn. 8 on one (3, H, W) raw image with a PaCaViT classifier: every masked image
    ``I * M^m`` is re-classified; clusters whose masked image still predicts ``label`` (None:
    the unmasked prediction) form the positive group, the others the negative group, each
    ranked by P(label)."""
    if raw.dim() != 3 or raw.shape[0] != 3:
        raise ValueError(f'expected one (3, H, W) raw image, got shape {tuple(raw.shape)}')
    backbone = find_backbone(model)
    s = check_stage(backbone, stage)
    raw = raw.float().cpu()
    with recording(backbone, model):
        # one pass gives both the prediction and the assignment
        base = classify(model, raw[None])[0]
        logits = backbone.cluster_logits[s][0].float().cpu()
        num_classes = base.numel()
        if label is not None and not 0 <= int(label) < num_classes:
            raise ValueError(f'label {label} out of range for {num_classes} classes')
        gt = int(base.argmax()) if label is None else int(label)
        masks = cluster_masks(logits, size=raw.shape[-2:])  # (M, H, W)
        probs, preds = [], []
        for i in range(0, masks.shape[0], batch_size):
            masked = raw[None] * masks[i:i + batch_size, None].float()
            p = classify(model, masked, batch_size)
            probs.append(p[:, gt])
            preds.append(p.argmax(-1))
    probs, preds = torch.cat(probs), torch.cat(preds)
    order = torch.argsort(probs, descending=True).tolist()
    positive = [m for m in order if int(preds[m]) == gt]
    negative = [m for m in order if int(preds[m]) != gt]
    return ClusterGroups(stage=stage, label=gt, label_given=label is not None,
                         base_prob=float(base[gt]), base_pred=int(base.argmax()), probs=probs,
                         preds=preds, positive=positive, negative=negative, logits=logits,
                         masks=masks, class_names=class_names)
