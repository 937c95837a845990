"""The one explicit CPU inference pass: :func:`fuse_for_cpu_inference`.

The model modules (``paca_mm/models``) compute the paper's math in one forward each, the
same in training and inference, on any device. Inference-only CPU speed code belongs here
and nowhere else, applied once by an explicit call, as mmcv's ``fuse_conv_bn`` and RepVGG's
``switch_to_deploy`` are::

    model = fuse_for_cpu_inference(model.eval())

The pass checks its preconditions once (every PaCa module in eval mode, float32, on the
CPU, of the plain classes it knows) and then swaps in the inference modules of
``INFERENCE_PIECES``. A piece is kept only where an A/B in one run shows at least 10 % on
the whole PaCa-Small forward at the sizes it targets (docs/benchmarks.md,
"Session 9"). The last A/Bs found no piece that does: ``INFERENCE_PIECES`` is empty, and the
pass returns the checked model unchanged.

The tools apply it on the CPU through :func:`apply_cpu_inference_pass` (``tools/test.py``
by :class:`~paca_mm.hooks.PaCaCPUInferenceHook`, ``image_demo.py``,
``visualize_clusters.py``, the forward timings of ``benchmark.py``); ``--no-fuse`` turns it
off, and each says in its log whether it ran.
"""
from typing import Callable, Dict, List

import torch
import torch.nn as nn
from mmengine.logging import print_log

from .models.backbones.paca_teacher import ConvMixerTeacher
from .models.backbones.paca_vit import PaCaBlock, PaCaViT, Stem, Transition
from .models.layers.common import ConvFFN, DWConvShortcut, LayerNorm2d
from .models.layers.paca import (ConvClustering, LinearClustering, MlpClustering,
                                 PaCaAttention)

# The classes the pass knows; a PaCa model containing a subclass or replacement of one of
# them (an adapter, a quantised layer) is refused rather than fused into something else.
PACA_CLASSES = (PaCaViT, PaCaBlock, Stem, Transition, PaCaAttention, ConvClustering,
                MlpClustering, LinearClustering, ConvFFN, DWConvShortcut, LayerNorm2d,
                ConvMixerTeacher)

# class -> function(module) returning its inference replacement. Empty: see the docstring.
INFERENCE_PIECES: Dict[type, Callable[[nn.Module], nn.Module]] = {}


def _paca_roots(model: nn.Module) -> List[nn.Module]:
    return [m for m in model.modules() if isinstance(m, PaCaViT)]


def check_cpu_inference(model: nn.Module) -> List[nn.Module]:
    """Raise ``ValueError`` naming the first unmet precondition of the CPU inference pass;
    return the PaCaViT backbones found in ``model``."""
    roots = _paca_roots(model)
    if not roots:
        raise ValueError(f'fuse_for_cpu_inference: {type(model).__name__} contains no PaCaViT '
                         'backbone; the pass is for models with PaCa modules')
    for root in roots:
        for name, m in root.named_modules():
            if m.training:
                raise ValueError(f'fuse_for_cpu_inference: {name or "the backbone"} is in '
                                 'training mode; call model.eval() first')
            if isinstance(m, PACA_CLASSES) and type(m) not in PACA_CLASSES:
                raise ValueError(f'fuse_for_cpu_inference: {name} is a {type(m).__name__}, a '
                                 'subclass of a PaCa module the pass does not know; run the '
                                 'model without the pass')
        for name, t in list(root.named_parameters()) + list(root.named_buffers()):
            if t.device.type != 'cpu':
                raise ValueError(f'fuse_for_cpu_inference: {name} is on {t.device}; the pass '
                                 'is for CPU inference (model.cpu())')
            if t.is_floating_point() and t.dtype != torch.float32:
                raise ValueError(f'fuse_for_cpu_inference: {name} is {t.dtype}; the pass is '
                                 'for float32 models (model.float())')
    return roots


def _fuse(model: nn.Module) -> int:
    """Check ``model`` and swap in the inference pieces; returns how many were swapped."""
    swapped = 0
    for root in check_cpu_inference(model):
        for parent in list(root.modules()):
            for name, child in parent.named_children():
                piece = INFERENCE_PIECES.get(type(child))
                if piece is not None:
                    setattr(parent, name, piece(child))
                    swapped += 1
    return swapped


def fuse_for_cpu_inference(model: nn.Module) -> nn.Module:
    """Prepare ``model`` (a PaCaViT, or a detector / segmentor / classifier containing one)
    for float32 CPU inference, in place; returns ``model``. Its outputs equal the unfused
    model's (tested to 1e-5 relative)."""
    _fuse(model)
    return model


def apply_cpu_inference_pass(model: nn.Module, enabled: bool = True) -> bool:
    """What the tools do: put ``model`` in eval mode and, when ``enabled`` and the model is
    a float32 CPU model containing a PaCaViT, apply :func:`fuse_for_cpu_inference` to it.
    Logs what it did (or why not) and returns whether the pass ran; an unmet precondition
    other than the device or a model without PaCa modules raises ``ValueError``."""
    model.eval()
    if not enabled:
        print_log('CPU inference pass off (--no-fuse)', logger='current')
        return False
    devices = {p.device.type for p in model.parameters()}
    if devices != {'cpu'}:
        print_log(f'CPU inference pass not applied: the model is on {sorted(devices)}',
                  logger='current')
        return False
    roots = _paca_roots(model)
    if not roots:
        print_log(f'CPU inference pass not applied: {type(model).__name__} contains no '
                  'PaCaViT', logger='current')
        return False
    swapped = _fuse(model)
    print_log(f'CPU inference pass applied (paca_mm.fuse_for_cpu_inference) to {len(roots)} '
              f'PaCaViT backbone(s): {swapped} inference piece(s) swapped in; --no-fuse turns '
              'it off', logger='current')
    return True
