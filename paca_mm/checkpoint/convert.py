"""Converting PaCa-ViT checkpoints (official releases, our own) and loading them into a backbone.

Layouts accepted by :func:`extract_backbone_state_dict`:

* official ImageNet releases ``IMNET_224_<model>.pth``: a plain state_dict with backbone keys
  (``patch_embed.*``, ``stage1.0.*``, ``paca_teacher.*`` ...) and the classifier ``head.*``;
* mmengine/mmdet/mmseg/mmpretrain files ``{'state_dict': ..., 'meta': ...}`` with keys under
  ``backbone.*`` (and ``neck.*``, ``decode_head.*``, ``head.*`` ...);
* timm ``CheckpointSaver`` files ``{'state_dict': ..., 'state_dict_ema': ..., 'args': ...}``
  (``state_dict``, as timm loads it, unless ``ema=True`` asks for ``state_dict_ema``);
* any of these nested under ``state_dict`` / ``model`` / ``module`` / ``model_state``, or
  wrapped by DDP (``module.`` prefix).

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

_CLUSTERING = 'attn.clustering.clustering.'
# Tensors whose shape depends on the number of clusters M of their stage.
_CLUSTER_LAYER = re.compile(
    r'(^|\.)(attn\.clustering\.clustering\.\d+|paca_teacher\.to_clusters\d+)\.(weight|bias)$')
# Tensors that exist only when a stage has M > 0 (so a 0 <-> M change adds/removes them).
_CLUSTER_ONLY = re.compile(r'(^|\.)attn\.(cluster_norm|clustering)\.')
_WRAPPER_KEYS = ('state_dict', 'model', 'module', 'model_state')


def state_dict_of(ckpt, ema: bool = False) -> 'OrderedDict':
    """The tensors of a checkpoint's state_dict, whatever wraps it (see module docstring)."""
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
    """Backbone tensors: the keys under ``prefix`` (stripped); by default ``backbone.`` if there
    are such keys, else all but an official ImageNet file's classifier ``head.*``."""
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
    """Official ImageNet state_dict -> mmpretrain ``ImageClassifier`` keys (PaCaViT +
    GlobalAveragePooling + LinearClsHead gives the official logits)."""
    def renamed(k):
        if k.startswith(('backbone.', 'head.fc.', 'neck.')):
            return k
        return 'head.fc.' + k[len('head.'):] if k.startswith('head.') else 'backbone.' + k

    return OrderedDict((renamed(k), v) for k, v in state_dict_of(ckpt).items())


def cluster_count_keys(keys) -> set:
    """The keys whose tensor shape depends on the cluster count M: the *last* layer of every
    clustering module (conv ``.4``, mlp ``.2``, linear ``.0``) and the teacher's
    ``to_clusters``."""
    keys = list(keys)

    def position(k):  # (block, index of the layer in its clustering module)
        head, rest = k.split(_CLUSTERING, 1)
        return head, int(rest.split('.', 1)[0])

    # block -> index of its last layer (in sorted order the highest index comes last and wins)
    last = dict(sorted(position(k) for k in keys if _CLUSTERING in k and _CLUSTER_LAYER.search(k)))
    orphan = next((k for k in keys if _CLUSTERING in k and position(k)[0] not in last), None)
    if orphan is not None:  # its block's last layer, whose shape follows M, is unknown
        raise ValueError(f'{orphan}: its clustering module has no .weight/.bias tensor, so '
                         'the layer that depends on the cluster count is unknown; pass a '
                         "complete PaCaViT state_dict (or its keys)")
    return {k for k in keys if ('paca_teacher.to_clusters' in k and _CLUSTER_LAYER.search(k))
            or (_CLUSTERING in k and position(k) in last.items())}


def match_state_dict(model_sd, sd) -> dict:
    """dict(load=the tensors to load, missing, unexpected, mismatched=[(key, ckpt shape, model
    shape)], reinit=[the same for cluster-count layers, a shape None where the key is absent])."""
    load, mismatched, reinit = OrderedDict(), [], []
    cluster_keys = cluster_count_keys(model_sd)
    for k, v in sd.items():
        if k in model_sd and v.shape == model_sd[k].shape:
            load[k] = v
        elif k in cluster_keys and v.shape[1:] == model_sd[k].shape[1:]:  # all in model_sd
            reinit.append((k, tuple(v.shape), tuple(model_sd[k].shape)))
        elif k in model_sd:
            mismatched.append((k, tuple(v.shape), tuple(model_sd[k].shape)))
    missing = [k for k in model_sd if k not in sd]
    unexpected = [k for k in sd if k not in model_sd]

    # A stage with M = 0 on one side and M > 0 on the other (recognised by its cluster_norm
    # missing on the M = 0 side) gains/loses its clustering tensors: a cluster-count change.
    def _m0_on(other, k):
        return _CLUSTER_ONLY.search(k) and \
            k.split('attn.', 1)[0] + 'attn.cluster_norm.weight' not in other
    gained = [k for k in missing if _m0_on(sd, k) or
              (k in cluster_keys and 'paca_teacher.' in k)]
    dropped = [k for k in unexpected if _m0_on(model_sd, k) or
               ('paca_teacher.to_clusters' in k and 'paca_teacher.block1.0.1.weight' in model_sd)]
    reinit += [(k, None, tuple(model_sd[k].shape)) for k in gained]
    reinit += [(k, tuple(sd[k].shape), None) for k in dropped]
    return dict(load=load, missing=[k for k in missing if k not in gained],
                unexpected=[k for k in unexpected if k not in dropped], mismatched=mismatched,
                reinit=reinit)


def _fmt(items, limit=20):
    items = [str(i) for i in items]
    more = f' ... and {len(items) - limit} more' if len(items) > limit else ''
    return '\n    ' + '\n    '.join(items[:limit]) + more


def load_backbone_checkpoint(model: torch.nn.Module, checkpoint, prefix: Optional[str] = None,
                             strict: bool = False, map_location='cpu',
                             trust: bool = False) -> dict:
    """Load a checkpoint (path/URL read by :func:`load_checkpoint_file`, or dict) into a PaCaViT
    backbone. Cluster-count layers with another M are re-initialised (logged); other missing,
    unexpected and mismatched keys are warnings, or with ``strict=True`` a
    :class:`CheckpointError`. Returns :func:`match_state_dict`'s report without ``load``."""
    source = checkpoint if isinstance(checkpoint, str) else '<state_dict>'
    if isinstance(checkpoint, str):
        checkpoint = load_checkpoint_file(checkpoint, map_location, trust)
    report = match_state_dict(model.state_dict(), extract_backbone_state_dict(checkpoint, prefix))
    problems = [f'{what}: {_fmt(keys)}' for what, keys in [
        ('missing keys (kept at random init)', report['missing']),
        ('unexpected keys (ignored)', report['unexpected']),
        ('size mismatch (kept at random init)',
         [f'{k}: checkpoint {a}, model {b}' for k, a, b in report['mismatched']])] if keys]
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
    """``torch.save`` ``obj`` to ``dst`` atomically; refuses to overwrite ``src``."""
    if src is not None and osp.exists(dst) and osp.samefile(src, dst):
        raise ValueError(f'refusing to overwrite the input checkpoint {src!r}; choose another '
                         'output path')
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write(buffer.getvalue(), dst)


def adapt_cluster_layers(sd: Dict[str, torch.Tensor], model: torch.nn.Module) -> 'OrderedDict':
    """``sd`` with the cluster-count dependent tensors taken from ``model`` (its random init)
    or dropped, so that it loads strictly into ``model``; other differences raise."""
    model_sd = model.state_dict()
    report = match_state_dict(model_sd, sd)
    if report['mismatched'] or report['missing'] or report['unexpected']:
        raise CheckpointError(
            'checkpoint does not fit the target model beyond the cluster count:' +
            _fmt([f'{k}: checkpoint {a} vs model {b}' for k, a, b in report['mismatched']] +
                 [f'missing {k}' for k in report['missing']] +
                 [f'unexpected {k}' for k in report['unexpected']]))
    return OrderedDict((k, sd[k] if k in report['load'] else v.clone())
                       for k, v in model_sd.items())
