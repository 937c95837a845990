#!/usr/bin/env python
"""Parameters and FLOPs of PaCa-ViT backbones, detectors and segmentors.

    python tools/get_flops.py CONFIG [--shape H [W]] [--cfg-options k=v ...]
    python tools/get_flops.py --backbone ARCH [--shape H [W]] [--num-classes 1000]
    python tools/get_flops.py --markdown [--out docs/complexity.md]

FLOPs are fvcore-style **MACs** (one multiply-add = 1), the paper's convention, counted by
mmengine's ``FlopAnalyzer`` (a jit trace, eval mode) with three extra operator handles:

* ``aten::scaled_dot_product_attention`` -- mmengine has no handle for it and drops it with
  at most a warning, which loses the attention matmuls (PaCaViT computes attention with
  ``F.scaled_dot_product_attention``). Counted as Q K^T plus A V:
  ``batch * heads * N_q * N_kv * (d_qk + d_v)``, exactly what the official code's explicit
  ``bmm`` calls (``F.multi_head_attention_forward``) are counted as;
* ``aten::baddbmm`` (bmm with an added term) and ``aten::addbmm``, like ``aten::bmm``.

``aten::matmul``/``bmm``/``linear``/convolutions and norms use mmengine's handles; softmax,
GELU and additions are not counted (as in fvcore). Parameters are all ``nn.Parameter``s.

Inputs: ``--backbone`` builds ``PaCaViT(arch)`` and, unless ``--num-classes 0``, the
ImageNet classifier of the paper (global average pool of the last stage + a
``num_classes``-way linear head), default 224x224. A detector config gets a random
(1, 3, H, W) image, default H x W = 800 x 1280, padded to the data preprocessor's size
divisor, and runs ``forward(mode='tensor')``: backbone, neck, RPN proposals (test_cfg,
e.g. 1000) and the RoI heads on them (the mask head on the first 100 RoIs, mmdet's
convention). A segmentor config gets a 512x512 image and runs the decode head
(``mode='tensor'``; an auxiliary head is counted in the parameters but not run).
``init_cfg`` checkpoints are not loaded (the counts do not depend on weights).
"""
import argparse
import copy
import os.path as osp
import sys
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

try:
    import paca_mm  # noqa: F401  (registers PaCaViT & co.)
except ImportError:  # running from a checkout that is not pip-installed
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
    import paca_mm  # noqa: F401

from mmengine.config import Config, DictAction

from paca_mm.fileio import atomic_write
from paca_mm.flops import count  # noqa: F401  (the counting rule lives there)
from paca_mm.models.backbones import PaCaViT

DEFAULT_SHAPES = {'backbone': (224, 224), 'detector': (800, 1280), 'segmentor': (512, 512)}


# -------------------------------------------------------------------- models
class PaCaClassifier(nn.Module):
    """PaCaViT + the paper's ImageNet head: GAP over the last stage, then Linear(C4, K).

    (B, 3, H, W) -> (B, K) logits. ``num_classes=0`` returns the backbone's stage maps.
    """

    def __init__(self, arch: str, num_classes: int = 1000, **kwargs):
        super().__init__()
        self.backbone = PaCaViT(arch, out_indices=(3, ), **kwargs)
        self.head = nn.Linear(self.backbone.embed_dims[-1], num_classes) \
            if num_classes > 0 else None

    def forward(self, x):
        feats = self.backbone(x)
        if self.head is None:
            return feats
        return self.head(feats[-1].mean((2, 3)))


def build_from_config(config, cfg_options: Optional[Dict] = None) -> Tuple[nn.Module, str]:
    """Build ``cfg.model`` in its toolbox (by ``default_scope``) without loading weights.

    Returns (model in eval mode, kind) with kind in 'detector' | 'segmentor' | 'classifier' |
    'model' (:func:`paca_mm.visualization.inference.model_kind`).
    """
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import MODELS, init_default_scope

    from paca_mm.registry import register_toolbox_modules
    from paca_mm.visualization.inference import load_config, model_kind, strip_pretrained
    cfg = load_config(config, cfg_options)
    init_default_scope(register_toolbox_modules(cfg))
    model = revert_sync_batchnorm(MODELS.build(strip_pretrained(copy.deepcopy(cfg.model))))
    return model.eval(), model_kind(model)


def _detector_forward(model: nn.Module, shape: Tuple[int, int], stats: Dict):
    """Bind a random preprocessed image of ``shape`` (padded to the size divisor) and its
    DetDataSample to ``model.forward``; returns the inputs tuple."""
    from mmdet.structures import DetDataSample
    h, w = shape
    div = int(getattr(model.data_preprocessor, 'pad_size_divisor', 1) or 1)
    ph, pw = -(-h // div) * div, -(-w // div) * div
    x = torch.zeros(1, 3, ph, pw)
    x[..., :h, :w] = torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(0))
    sample = DetDataSample(metainfo=dict(
        img_shape=(h, w), ori_shape=(h, w), pad_shape=(ph, pw), batch_input_shape=(ph, pw),
        scale_factor=(1.0, 1.0), img_id=0))
    model.forward = partial(model.forward, data_samples=[sample], mode='tensor')
    roi_head = getattr(model, 'roi_head', None)
    extractor = getattr(roi_head, 'bbox_roi_extractor', None)
    if isinstance(extractor, nn.Module):
        def record(module, args, output):
            stats['num_rois'] = int(args[1].shape[0])
        extractor.register_forward_hook(record)
    stats['input_shape'] = (ph, pw)
    return (x, )


def measure(config: Optional[str] = None, backbone: Optional[str] = None,
            shape: Optional[Sequence[int]] = None, num_classes: int = 1000,
            cfg_options: Optional[Dict] = None, backbone_kwargs: Optional[Dict] = None,
            seed: int = 0) -> Dict:
    """Count params and FLOPs of a config's model or of a backbone (see the module doc).

    Returns dict(flops, params, kind, shape (H, W) as given, input_shape (padded), by_module,
    params_by_module, unsupported, and num_rois for two-stage detectors).
    """
    if (config is None) == (backbone is None):
        raise ValueError('give exactly one of a config file or --backbone ARCH')
    torch.manual_seed(seed)
    if backbone is not None:
        model, kind = PaCaClassifier(backbone, num_classes, **(backbone_kwargs or {})), \
            'backbone'
    else:
        if not osp.isfile(config):
            raise FileNotFoundError(f'config file {config!r} does not exist')
        model, kind = build_from_config(config, cfg_options)
    if shape is None:
        shape = DEFAULT_SHAPES.get(kind, (224, 224))
    shape = tuple(int(s) for s in shape)
    if len(shape) == 1:
        shape = (shape[0], shape[0])
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f'--shape takes H or H W (positive), got {shape}')
    stats: Dict = {}
    if kind == 'detector':
        inputs = _detector_forward(model, shape, stats)
    else:
        inputs = (torch.randn(1, 3, *shape, generator=torch.Generator().manual_seed(0)), )
        if kind in ('segmentor', 'classifier'):
            model.forward = partial(model.forward, mode='tensor')
        stats['input_shape'] = shape
    result = count(model, inputs)
    result.update(stats, kind=kind, shape=shape)
    return result


# ------------------------------------------------------------------- reports
def fmt(n: float, unit: str = 'G') -> str:
    scale = {'G': 1e9, 'M': 1e6}[unit]
    return f'{n / scale:.3f}{unit}' if unit == 'G' else f'{n / scale:.2f}{unit}'


def print_result(res: Dict, name: str):
    h, w = res['shape']
    print(f'{name}  ({res["kind"]})')
    print(f'  input (1, 3, {h}, {w})' + (f', padded to {tuple(res["input_shape"])}'
                                         if tuple(res['input_shape']) != (h, w) else ''))
    print(f'  params: {res["params"]:,} ({fmt(res["params"], "M")})')
    print(f'  FLOPs (MACs): {res["flops"]:,} ({fmt(res["flops"])})')
    for child, flops in res['by_module'].items():
        p = res['params_by_module'].get(child, 0)
        if flops or p:
            print(f'    {child:<16} {fmt(flops):>10}  {fmt(p, "M"):>8}')
    if 'num_rois' in res:
        print(f'  RoIs through the bbox head: {res["num_rois"]} '
              f'(mask head: first {min(res["num_rois"], 100)})')
    if res['unsupported']:
        print('  not counted (no handle): ' + ', '.join(
            f'{k} x{v}' for k, v in sorted(res['unsupported'].items())))


def zoo_root() -> str:
    """The folder with model-index.yml and configs/: the one above this script (a checkout,
    or paca_mm/.mim where mim runs the tool), else the imported package's
    (:func:`paca_mm.apis.zoo_root`)."""
    from paca_mm.apis import zoo_root as package_zoo_root
    here = osp.dirname(osp.dirname(osp.abspath(__file__)))
    return here if osp.isfile(osp.join(here, 'model-index.yml')) else package_zoo_root()


def paper_models(task: str) -> List[Dict]:
    """The model-index entries whose results are for ``task`` and whose metadata hold the
    paper's numbers (``Paper FLOPs (G)``, see the metafiles), in model-index order."""
    from paca_mm.apis import zoo_models
    return [m for m in zoo_models(zoo_root()) if 'Paper FLOPs (G)' in m['Metadata']
            and any(r['Task'] == task for r in m.get('Results', []))]


def _pct(ours: float, ref: float) -> str:
    return f'{100.0 * (ours - ref) / ref:+.1f}%'


def markdown(sections: Sequence[str] = ('cls', 'det', 'seg'), log=print) -> str:
    """The tables of docs/complexity.md: every model of the metafiles that holds the paper's
    numbers, measured here and now and compared with them."""
    root = zoo_root()
    lines: List[str] = []
    if 'cls' in sections:
        lines += ['## Table 1: ImageNet classifiers at 224x224',
                  '',
                  'PaCaViT + GAP + 1000-way linear head (`tools/get_flops.py --backbone ARCH`).',
                  '',
                  '| model | params (ours) | params (paper / official code) | GFLOPs (ours) |'
                  ' GFLOPs (paper / official code) | diff vs official code |',
                  '|---|---|---|---|---|---|']
        for m in paper_models('Image Classification'):
            md, name = m['Metadata'], m['Metadata']['Paper Model']
            key = Config.fromfile(osp.join(root, m['Config'])).model.backbone.arch
            p_off, f_off = md['Official Code Parameters'], md['Official Code FLOPs (G)']
            res = measure(backbone=key, shape=(224, 224))
            log(f'  {name}: {res["params"]:,} params, {res["flops"] / 1e9:.3f} G')
            lines.append(f'| {name} (`{key}`) | {res["params"]:,} | '
                         f'{md["Paper Parameters (M)"]} M / {p_off:,} | '
                         f'{res["flops"] / 1e9:.3f} | {md["Paper FLOPs (G)"]} / {f_off:.3f} | '
                         f'params {_pct(res["params"], p_off)}, '
                         f'FLOPs {_pct(res["flops"] / 1e9, f_off)} |')
        lines.append('')
    if 'det' in sections:
        lines += ['## Table 2 and 4: Mask R-CNN (FPN) at 800x1280 (H x W)',
                  '',
                  '`tools/get_flops.py configs/mask_rcnn/mask_rcnn_<model>_mstrain_480_800_'
                  '1x_coco.py` (random image, 1000 RPN proposals into the bbox head, the first '
                  '100 into the mask head; RoIAlign and NMS are not counted).',
                  '',
                  '| model | params (ours) | params (paper / official code) | GFLOPs (ours:'
                  ' total / backbone) | GFLOPs (paper) | diff vs paper | RoIs |',
                  '|---|---|---|---|---|---|---|']
        for m in paper_models('Object Detection'):
            md, name = m['Metadata'], m['Metadata']['Paper Model']
            p_off, f_pub = md['Official Code Parameters (M)'], md['Paper FLOPs (G)']
            res = measure(config=osp.join(root, m['Config']), shape=(800, 1280))
            bb = res['by_module'].get('backbone', 0) / 1e9
            off_bb = md.get('Official Code Backbone FLOPs (G)')
            bb_txt = f'{bb:.1f}' + (f' (official code {off_bb})' if off_bb else '')
            log(f'  {name}: {res["params"]:,} params, {res["flops"] / 1e9:.1f} G '
                f'(backbone {bb:.1f} G), {res.get("num_rois")} RoIs')
            lines.append(f'| {name} | {res["params"] / 1e6:.2f} M | '
                         f'{md["Paper Parameters (M)"]} M / {p_off} M | '
                         f'{res["flops"] / 1e9:.1f} / {bb_txt} | {f_pub} | '
                         f'params {_pct(res["params"] / 1e6, p_off)} (vs code), '
                         f'FLOPs {_pct(res["flops"] / 1e9, f_pub)} | {res.get("num_rois")} |')
        lines.append('')
    if 'seg' in sections:
        lines += ['## Table 3: semantic segmentation at 512x512', '',
                  '`tools/get_flops.py CONFIG` (decode head only in the FLOPs; an '
                  'auxiliary head is included in the parameters).',
                  '',
                  '| model | params (ours) | params (paper / official code) | '
                  'GFLOPs (ours) | GFLOPs (paper / official code) | diff |',
                  '|---|---|---|---|---|---|']
        for m in paper_models('Semantic Segmentation'):
            md, name = m['Metadata'], m['Metadata']['Paper Model']
            p_off, f_pub = md['Official Code Parameters (M)'], md['Paper FLOPs (G)']
            f_off = md.get('Official Code FLOPs (G)')
            res = measure(config=osp.join(root, m['Config']), shape=(512, 512))
            g = res['flops'] / 1e9
            ref = f_off if f_off is not None else f_pub
            log(f'  {name}: {res["params"]:,} params, {g:.2f} G')
            lines.append(
                f'| {name} (`{m["Config"]}`) | {res["params"] / 1e6:.2f} M'
                f' | {md["Paper Parameters (M)"]} M / {p_off} M | {g:.2f} | {f_pub} / '
                f'{"-" if f_off is None else f_off} | params '
                f'{_pct(res["params"] / 1e6, p_off)}, FLOPs {_pct(g, ref)} '
                f'(vs {"official code" if f_off is not None else "paper"}) |')
        lines.append('')
    return '\n'.join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Count parameters and FLOPs (MACs) of a PaCa-ViT '
                                'backbone, detector or segmentor')
    p.add_argument('config', nargs='?', help='an mmdet / mmseg / mmpretrain config file')
    p.add_argument('--backbone', metavar='ARCH',
                   help="count PaCaViT(ARCH) (+ classifier head) instead of a config's model, "
                   "e.g. tiny, pacavit_small_p2cmlp_100_0")
    p.add_argument('--num-classes', type=int, default=1000,
                   help='--backbone: classes of the GAP + linear head; 0 = backbone only')
    p.add_argument('--shape', type=int, nargs='+',
                   help='input H [W]; default 224 (backbone), 800 1280 (detector), '
                   '512 (segmentor)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override config settings, key=value pairs')
    p.add_argument('--markdown', action='store_true',
                   help='measure every model of the paper tables and write markdown tables')
    p.add_argument('--sections', nargs='+', default=['cls', 'det', 'seg'],
                   choices=['cls', 'det', 'seg'], help='--markdown: which tables')
    p.add_argument('--out', help='--markdown: write the tables to this file (else stdout)')
    return p.parse_args(argv)


def main(argv=None):
    with torch.no_grad():  # scoped: main() is also called in-process by the tests
        return _main(parse_args(argv))


def _main(args):
    if args.markdown:
        text = markdown(args.sections, log=lambda s: print(s, file=sys.stderr, flush=True))
        if args.out:
            atomic_write(text + '\n', args.out)
            print(f'wrote {args.out}')
        else:
            print(text)
        return None
    if not args.config and not args.backbone:
        raise SystemExit('get_flops.py: give a CONFIG file or --backbone ARCH (or --markdown)')
    res = measure(config=args.config, backbone=args.backbone, shape=args.shape,
                  num_classes=args.num_classes, cfg_options=args.cfg_options)
    print_result(res, args.config or f'PaCaViT({args.backbone!r})' + (
        f' + GAP + Linear({args.num_classes})' if args.num_classes else ''))
    return res


if __name__ == '__main__':
    main()
