"""ONNX export of PaCa models and its check on ONNX Runtime.

Every graph takes the image as loaded (float32 ``(N, 3, H, W)`` in 0-255, in the pipeline's
channel order: BGR for mmcv's ``LoadImageFromFile``), N, H and W dynamic, and applies the data
preprocessor's channel flip and mean/std itself. Kinds: ``segmentor`` (mmseg's
``encode_decode`` logits ``(N, K, H, W)``), ``classifier`` (softmax scores ``(N, K)``) and
``backbone`` (the features of every output stage; of an mmdet detector, ``extract_feat``:
backbone + FPN). Mask R-CNN's RoI heads are not exported: they need mmdeploy's rewriters and
its ONNX Runtime custom ops (RoIAlign, NMS), see ``docs/deployment.md``.
"""
import copy
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .fileio import atomic_path
from .models.backbones.paca_vit import PaCaViT
from .version import torch_version
from .visualization.inference import model_kind, normalize_inputs

KINDS = ('backbone', 'segmentor', 'classifier')


class ExportModule(nn.Module):
    """The graph of one export kind (see the module docstring)."""

    def __init__(self, model: nn.Module, kind: str):
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, img: torch.Tensor):
        x = normalize_inputs(self.model, img)
        if self.kind == 'segmentor':
            # img_shape as a torch.Size keeps H and W symbolic in the exported graph
            return self.model.encode_decode(x, [dict(img_shape=x.shape[2:])] * x.shape[0])
        if self.kind == 'classifier':
            return F.softmax(self.model(x, mode='tensor'), dim=1)
        return tuple(self.model(x) if isinstance(self.model, PaCaViT)
                     else self.model.extract_feat(x))


def export_module(model: nn.Module, kind: str) -> nn.Module:
    """The module whose graph :func:`export_onnx` writes (eval mode)."""
    needs = {'segmentor': ('an mmseg segmentor', hasattr(model, 'encode_decode')),
             'classifier': ('an mmpretrain classifier', model_kind(model) == 'classifier'),
             'backbone': ('a PaCaViT or a model with extract_feat',
                          isinstance(model, PaCaViT) or hasattr(model, 'extract_feat'))}
    if kind not in needs:
        raise ValueError(f'unknown export kind {kind!r}; choose one of {KINDS}')
    if not needs[kind][1]:
        raise ValueError(f'kind={kind} needs {needs[kind][0]}, got {type(model).__name__}' +
                         (" (use kind='backbone' for its features)" if kind != 'backbone' else ''))
    return ExportModule(model, kind).eval()


def default_kind(model: nn.Module) -> str:
    """The export kind of ``model``: its own for a segmentor or classifier, else backbone."""
    kind = model_kind(model)
    return kind if kind in ('segmentor', 'classifier') else 'backbone'


def exporter_kwargs() -> Dict[str, bool]:
    """Extra ``torch.onnx.export`` arguments that pick the TorchScript-based exporter on
    every torch (the one torch 2.1 has; torch >= 2.9 defaults to the dynamo exporter)."""
    return {'dynamo': False} if torch_version() >= (2, 5) else {}


def _adaptive_pools(model: nn.Module) -> List[Tuple[str, nn.Module, Tuple]]:
    """(name, module, output grid (h, w)) of every adaptive average/max pooling layer."""
    return [(name, mod, tuple(mod.output_size) if isinstance(mod.output_size, (tuple, list))
             else (mod.output_size, mod.output_size)) for name, mod in model.named_modules()
            if isinstance(mod, (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d))]


def _fixed_grid_pools(model: nn.Module) -> List[str]:
    """Names of the adaptive pooling layers whose output grid is not 1x1 (e.g. the pyramid
    pooling of UperNet's head): their ONNX form needs a known input size."""
    return [f'{name} (output_size={mod.output_size})' for name, mod, grid in
            _adaptive_pools(model) if any(s != 1 for s in grid)]


class _FixedSizeAdaptivePool(nn.Module):
    """Adaptive average/max pooling written as one pooling per output bin, for an export at
    a fixed input size: the ONNX exporter handles ``adaptive_avg_pool2d`` only when the
    input size is a multiple of the output size (UperNet's 1, 2, 3, 6 grid at 512x512 is
    not). Bin ``i`` of ``n`` over ``L`` spans ``[floor(i L / n), ceil((i + 1) L / n))``, as
    in PyTorch."""

    def __init__(self, pool: nn.Module):
        super().__init__()
        self.output_size = _adaptive_pools(pool)[0][2]
        self.reduce = 'mean' if isinstance(pool, nn.AdaptiveAvgPool2d) else 'amax'

    @staticmethod
    def _bins(length: int, n: int) -> List[Tuple[int, int]]:
        return [(i * length // n, -(-(i + 1) * length // n)) for i in range(n)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = int(x.shape[-2]), int(x.shape[-1])
        oh = self.output_size[0] if self.output_size[0] is not None else h
        ow = self.output_size[1] if self.output_size[1] is not None else w
        rows = []
        for h0, h1 in self._bins(h, oh):
            cells = [getattr(x[..., h0:h1, w0:w1], self.reduce)(dim=(-2, -1))
                     for w0, w1 in self._bins(w, ow)]
            rows.append(torch.stack(cells, dim=-1))
        return torch.stack(rows, dim=-2)


def _with_fixed_size_pools(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose fixed-grid adaptive pools are :class:`_FixedSizeAdaptivePool`
    (the model itself is left as it is)."""
    if not _fixed_grid_pools(model):
        return model
    model = copy.deepcopy(model)
    for name, mod, _ in _adaptive_pools(model):
        parent_name, _, child = name.rpartition('.')
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _FixedSizeAdaptivePool(mod))
    return model


def export_onnx(model: nn.Module, out_file: str, kind: str, shape: Sequence[int] = (512, 512),
                opset: int = 17, batch: int = 1, dynamic_hw: bool = True) -> List[str]:
    """Export ``model`` as ``kind`` to ``out_file`` (written atomically), with dynamic batch
    and, unless ``dynamic_hw=False``, dynamic height and width; ``shape`` (H, W) is the size
    of the example input (the only size a static export accepts). Returns the output names."""
    module = export_module(model if dynamic_hw else _with_fixed_size_pools(model), kind)
    pools = _fixed_grid_pools(model) if dynamic_hw else []
    if pools:
        raise ValueError(
            'cannot export with dynamic H and W: adaptive pooling to a fixed grid has no ONNX '
            f'form for an unknown input size, in {", ".join(pools)}. Export at one size '
            '(dynamic_hw=False; --static-hw --shape H W in tools/deployment/pytorch2onnx.py)')
    example = torch.rand(batch, 3, int(shape[0]), int(shape[1])) * 255
    with torch.no_grad():
        outs = module(example)
    names = {'segmentor': ['logits'], 'classifier': ['scores']}.get(kind) or \
        [f'feat{i}' for i in range(len(outs))]
    dynamic: Dict[str, Dict[int, str]] = {
        'img': {0: 'batch', 2: 'height', 3: 'width'} if dynamic_hw else {0: 'batch'}}
    for name in names:
        dynamic[name] = {0: 'batch'} if kind == 'classifier' or not dynamic_hw else \
            {0: 'batch', 2: f'{name}_height', 3: f'{name}_width'}
    with atomic_path(out_file) as tmp:
        torch.onnx.export(module, (example,), tmp, input_names=['img'], output_names=names,
                          dynamic_axes=dynamic, opset_version=opset, **exporter_kwargs())
    return names


def check_onnx(model: nn.Module, onnx_file: str, kind: str,
               shapes: Sequence[Sequence[int]], rtol: float = 1e-4) -> List[Dict]:
    """Run ``onnx_file`` on ONNX Runtime (CPU) for an input of every (N, H, W) in ``shapes``
    and compare each output with PyTorch's; raises ``AssertionError`` naming the output
    and the error when ``max|ort - torch| / max|torch|`` exceeds ``rtol``. Returns one dict
    per shape with the errors."""
    import onnxruntime as ort
    module = export_module(model, kind)
    session = ort.InferenceSession(onnx_file, providers=['CPUExecutionProvider'])
    names = [o.name for o in session.get_outputs()]
    report = []
    gen = torch.Generator().manual_seed(0)
    for n, h, w in shapes:
        img = torch.rand(n, 3, h, w, generator=gen) * 255
        with torch.no_grad():
            ref = module(img)
        ref = list(ref) if isinstance(ref, (tuple, list)) else [ref]
        got = session.run(None, {'img': img.numpy()})
        if len(got) != len(ref):
            raise AssertionError(f'{onnx_file}: {len(got)} outputs, PyTorch gives {len(ref)}')
        errors = {}
        for name, r, g in zip(names, ref, got):
            g = torch.from_numpy(g)
            if g.shape != r.shape:
                raise AssertionError(f'{onnx_file}: output {name} at input {(n, 3, h, w)} has '
                                     f'shape {tuple(g.shape)}, PyTorch {tuple(r.shape)}')
            err = float((g - r).abs().max() / r.abs().max().clamp_min(1e-12))
            if not err <= rtol:
                raise AssertionError(f'{onnx_file}: output {name} at input {(n, 3, h, w)} '
                                     f'differs from PyTorch by {err:.3g} relative (> {rtol})')
            errors[name] = err
        report.append(dict(shape=(n, 3, h, w), errors=errors))
    return report
