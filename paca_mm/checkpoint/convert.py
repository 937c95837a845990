"""Converting PaCa-ViT checkpoints (official releases and our own) and loading them into a
backbone.

Layouts accepted by :func:`extract_backbone_state_dict`:

* official ImageNet releases ``IMNET_224_<model>.pth``: a plain state_dict with backbone keys
  (``patch_embed.*``, ``stage1.0.*``, ``paca_teacher.*`` ...) and the classifier ``head.*``;
* mmengine/mmdet/mmseg/mmpretrain files ``{'state_dict': ..., 'meta': ...}`` with keys under
  ``backbone.*`` (and ``neck.*``, ``decode_head.*``, ``head.*`` ...);
* timm ``CheckpointSaver`` files ``{'state_dict': ..., 'state_dict_ema': ..., 'args': ...}``
  (``state_dict`` unless EMA is asked for, see :func:`state_dict_of`);
* any of these wrapped by DDP (``module.`` prefix).

Changing the cluster count at fine-tune time (e.g. 100 -> 200 on ADE20k) is supported: the
layers whose shape depends on M (the last clustering layer, the teacher's ``to_clusters``)
keep their fresh random init and a log line says so; every other tensor is loaded.
"""
import io
import logging
import os.path as osp
import re
from collections import OrderedDict
from typing import Dict, Optional

import torch
from mmengine.logging import print_log

from ..fileio import atomic_write
from .loading import CheckpointError, load_checkpoint_file

# Tensors whose shape depends on the number of clusters M of their stage.
_CLUSTER_LAYER = re.compile(
    r'(^|\.)(attn\.clustering\.clustering\.\d+\.(weight|bias)'
    r'|paca_teacher\.to_clusters\d+\.(weight|bias))$')
# Tensors that exist only when a stage has M > 0 (so a 0 <-> M change adds/removes them).
_CLUSTER_ONLY = re.compile(r'(^|\.)attn\.(cluster_norm|clustering)\.')
_WRAPPER_KEYS = ('state_dict', 'model', 'module', 'model_state')


def state_dict_of(ckpt, ema: bool = False) -> 'OrderedDict':
    """The tensors of a checkpoint's state_dict, whatever wraps it: a plain state_dict, or
    one under ``state_dict`` / ``model`` / ``module`` / ``model_state`` (nested too); a DDP
    ``module.`` prefix is stripped and non-tensor entries are dropped. ``ema=True``: a timm
    file's ``state_dict_ema`` (default: its ``state_dict``, as timm loads it)."""
    if not isinstance(ckpt, dict):
        raise CheckpointError(f'expected a dict checkpoint, got {type(ckpt).__name__}')
    if ema and not isinstance(ckpt.get('state_dict_ema'), dict):
        raise CheckpointError(f'EMA weights asked for, but the checkpoint has no '
                              f'state_dict_ema (a timm file trained with --model-ema); its '
                              f'keys: {list(ckpt)[:10]}. Drop the EMA option.')
    sd = ckpt['state_dict_ema'] if ema else ckpt
    while not any(torch.is_tensor(v) for v in sd.values()):
        inner = next((sd[k] for k in _WRAPPER_KEYS if isinstance(sd.get(k), dict)), None)
        if inner is None:
            break
        sd = inner
    return OrderedDict((k[len('module.'):] if k.startswith('module.') else k, v)
                       for k, v in sd.items() if torch.is_tensor(v))

def extract_backbone_state_dict(ckpt, prefix: Optional[str] = None,
                                ema: bool = False) -> 'OrderedDict':
    """Backbone state_dict from any accepted layout (see module docstring).

    Args:
        prefix: keep only keys under this prefix and strip it (e.g. 'backbone.'). By default
            'backbone.' is used when such keys exist; otherwise the classifier ``head.*`` of an
            official ImageNet file is dropped.
        ema: a timm file's ``state_dict_ema`` instead of ``state_dict`` (:func:`state_dict_of`).
    """
    sd = state_dict_of(ckpt, ema)
    if prefix is None and any(k.startswith('backbone.') for k in sd):
        prefix = 'backbone.'
    if prefix:
        prefix = prefix if prefix.endswith('.') else prefix + '.'
        out = OrderedDict((k[len(prefix):], v) for k, v in sd.items() if k.startswith(prefix))
        if not out:
            raise CheckpointError(f'no key starts with prefix {prefix!r}; first keys: '
                                  f'{list(sd)[:5]}')
        return out
    return OrderedDict((k, v) for k, v in sd.items() if not k.startswith('head.'))


def convert_official_to_classifier(ckpt) -> 'OrderedDict':
    """Official ImageNet state_dict -> mmpretrain ``ImageClassifier`` keys.

    ``<backbone key>`` -> ``backbone.<key>``; ``head.weight/bias`` -> ``head.fc.weight/bias``
    (PaCaViT + GlobalAveragePooling + LinearClsHead gives the official logits).
    """
    out = OrderedDict()
    for k, v in state_dict_of(ckpt).items():
        if k.startswith(('backbone.', 'head.fc.', 'neck.')):
            out[k] = v
        elif k.startswith('head.'):
            out['head.fc.' + k[len('head.'):]] = v
        else:
            out['backbone.' + k] = v
    return out


def cluster_count_keys(keys) -> set:
    """The keys (of a model or checkpoint) whose tensor shape depends on the cluster count M:
    the *last* layer of every clustering module (conv ``.4``, mlp ``.2``, linear ``.0``)
    and the teacher's ``to_clusters``."""
    keys = list(keys)
    last = {}
    for k in keys:
        m = _CLUSTER_LAYER.search(k)
        if m and 'attn.clustering.clustering.' in k:
            head, rest = k.split('attn.clustering.clustering.', 1)
            idx = int(rest.split('.', 1)[0])
            last[head] = max(last.get(head, -1), idx)
    out = set()
    for k in keys:
        if 'paca_teacher.to_clusters' in k and _CLUSTER_LAYER.search(k):
            out.add(k)
        elif 'attn.clustering.clustering.' in k:
            head, rest = k.split('attn.clustering.clustering.', 1)
            if int(rest.split('.', 1)[0]) == last[head]:
                out.add(k)
    return out


def match_state_dict(model_sd, sd) -> dict:
    """Compare a checkpoint state_dict with a model's.

    Returns dict(load=OrderedDict to load, missing, unexpected, mismatched (other shape
    mismatches as (key, ckpt_shape, model_shape)), reinit (cluster-count layers kept at random
    init, as (key, ckpt_shape, model_shape) or (key, None, shape) if absent from the ckpt)).
    """
    load, mismatched, reinit = OrderedDict(), [], []
    cluster_keys = cluster_count_keys(model_sd)
    for k, v in sd.items():
        if k not in model_sd:
            continue
        if v.shape == model_sd[k].shape:
            load[k] = v
        elif k in cluster_keys and v.shape[1:] == model_sd[k].shape[1:]:
            reinit.append((k, tuple(v.shape), tuple(model_sd[k].shape)))
        else:
            mismatched.append((k, tuple(v.shape), tuple(model_sd[k].shape)))
    missing = [k for k in model_sd if k not in sd]
    unexpected = [k for k in sd if k not in model_sd]

    # A stage that was plain attention (M = 0) in the checkpoint and has clusters now (or the
    # reverse) gains (loses) its cluster_norm + clustering tensors: that is a cluster-count
    # change, not a wrong model. Recognised by the block's cluster_norm being absent on the
    # other side.
    def _m0_on(other, k):
        return _CLUSTER_ONLY.search(k) and \
            k.split('attn.', 1)[0] + 'attn.cluster_norm.weight' not in other
    gained = [k for k in missing if _m0_on(sd, k) or
              (k in cluster_keys and 'paca_teacher.' in k)]
    dropped = [k for k in unexpected if _m0_on(model_sd, k) or
               ('paca_teacher.to_clusters' in k and 'paca_teacher.block1.0.1.weight' in model_sd)]
    reinit += [(k, None, tuple(model_sd[k].shape)) for k in gained]
    reinit += [(k, tuple(sd[k].shape), None) for k in dropped]
    missing = [k for k in missing if k not in set(gained)]
    unexpected = [k for k in unexpected if k not in set(dropped)]
    return dict(load=load, missing=missing, unexpected=unexpected, mismatched=mismatched,
                reinit=reinit)


def _fmt(items, limit=20):
    items = [str(i) for i in items]
    more = f' ... and {len(items) - limit} more' if len(items) > limit else ''
    return '\n    ' + '\n    '.join(items[:limit]) + more


def load_backbone_checkpoint(model: torch.nn.Module, checkpoint, prefix: Optional[str] = None,
                             strict: bool = False, map_location='cpu',
                             trust: bool = False) -> dict:
    """Load a checkpoint (path/URL or dict) into a PaCaViT backbone.

    A path is read by :func:`load_checkpoint_file` (weights-only + the Runner allow-list;
    ``trust=True`` or ``PACA_MM_TRUST_CHECKPOINTS=1`` for a trusted file that pickles other
    objects). Cluster-count layers with another M are re-initialised (logged). Missing, unexpected
    and other mismatched keys are logged as warnings; with ``strict=True`` they raise
    :class:`CheckpointError` instead (mmengine semantics). Returns the report of
    :func:`match_state_dict` (without the tensors).
    """
    source = checkpoint if isinstance(checkpoint, str) else '<state_dict>'
    ckpt = load_checkpoint_file(checkpoint, map_location, trust) \
        if isinstance(checkpoint, str) else checkpoint
    sd = extract_backbone_state_dict(ckpt, prefix)
    report = match_state_dict(model.state_dict(), sd)
    problems = []
    if report['missing']:
        problems.append(f'missing keys (kept at random init): {_fmt(report["missing"])}')
    if report['unexpected']:
        problems.append(f'unexpected keys (ignored): {_fmt(report["unexpected"])}')
    if report['mismatched']:
        problems.append('size mismatch (kept at random init): ' + _fmt(
            f'{k}: checkpoint {a}, model {b}' for k, a, b in report['mismatched']))
    if problems and strict:
        raise CheckpointError(f'checkpoint {source} does not match the model:\n' +
                              '\n'.join(problems))
    model.load_state_dict(report['load'], strict=False)
    print_log(f'Loaded {len(report["load"])}/{len(model.state_dict())} tensors of '
              f'{type(model).__name__} from {source}', logger='current')
    if report['reinit']:
        print_log('cluster count changed: re-initialised the cluster-count dependent layers: '
                  + _fmt(f'{k}: checkpoint {a or "absent (M=0)"} -> model {b or "absent (M=0)"}'
                         for k, a, b in report['reinit']), logger='current')
    for p in problems:
        print_log(f'{source}: {p}', logger='current', level=logging.WARNING)
    report.pop('load')
    return report


def save_checkpoint_atomic(obj, dst: str, src: Optional[str] = None) -> None:
    """``torch.save`` ``obj`` to ``dst`` atomically (:func:`paca_mm.fileio.atomic_write`).

    Refuses to overwrite ``src`` (the input of a conversion).
    """
    if src is not None and osp.exists(dst) and osp.samefile(src, dst):
        raise ValueError(f'refusing to overwrite the input checkpoint {src!r}; choose another '
                         'output path')
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write(buffer.getvalue(), dst)


def adapt_cluster_layers(sd: Dict[str, torch.Tensor], model: torch.nn.Module) -> 'OrderedDict':
    """Return the backbone state_dict ``sd`` with the cluster-count dependent tensors taken
    from ``model`` (its random init) or dropped, so that it loads strictly into ``model``
    (e.g. 100 -> 200 clusters, or 100 -> 0 in a stage). Other differences raise."""
    model_sd = model.state_dict()
    report = match_state_dict(model_sd, sd)
    if report['mismatched'] or report['missing'] or report['unexpected']:
        raise CheckpointError(
            'checkpoint does not fit the target model beyond the cluster count:' +
            _fmt([f'{k}: checkpoint {a} vs model {b}' for k, a, b in report['mismatched']] +
                 [f'missing {k}' for k in report['missing']] +
                 [f'unexpected {k}' for k in report['unexpected']]))
    out = OrderedDict()
    for k in model_sd:
        out[k] = sd[k] if k in report['load'] else model_sd[k].clone()
    return out
