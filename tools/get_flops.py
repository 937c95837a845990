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

from paca_mm.flops import count  # noqa: F401  (the counting rule lives there)
from paca_mm.models.backbones import PaCaViT

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
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


def _strip_pretrained(node):
    """Remove Pretrained init_cfgs / pretrained paths (in place): counting needs no weights."""
    if isinstance(node, dict):
        init = node.get('init_cfg')
        if isinstance(init, dict) and init.get('type') == 'Pretrained':
            node['init_cfg'] = None
        elif isinstance(init, list):
            node['init_cfg'] = [c for c in init if c.get('type') != 'Pretrained'] or None
        if isinstance(node.get('pretrained'), str):
            node['pretrained'] = None
        for value in node.values():
            _strip_pretrained(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _strip_pretrained(value)


def build_from_config(config, cfg_options: Optional[Dict] = None) -> Tuple[nn.Module, str]:
    """Build ``cfg.model`` in its toolbox (by ``default_scope``) without loading weights.

    Returns (model in eval mode, kind) with kind in 'detector' | 'segmentor' | 'classifier' |
    'model'.
    """
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import MODELS, init_default_scope

    from paca_mm.utils import runtime
    cfg = config if isinstance(config, Config) else Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = runtime.register_toolbox_modules(cfg)
    init_default_scope(scope)
    model_cfg = copy.deepcopy(cfg.model)
    _strip_pretrained(model_cfg)
    model = revert_sync_batchnorm(MODELS.build(model_cfg))
    kind = 'model'
    try:
        from mmdet.models.detectors import BaseDetector
        if isinstance(model, BaseDetector):
            kind = 'detector'
    except ImportError:
        pass
    try:
        from mmseg.models.segmentors import BaseSegmentor
        if isinstance(model, BaseSegmentor):
            kind = 'segmentor'
    except ImportError:
        pass
    try:
        from mmpretrain.models.classifiers import BaseClassifier
        if isinstance(model, BaseClassifier):
            kind = 'classifier'
    except ImportError:
        pass
    return model.eval(), kind


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


# Published numbers (paper Tables 1-4) and those measured from the official code with
# mmengine + fvcore conventions (spec 3.3, 7.2, 8.1-8.3), for docs/complexity.md.
# name: (key, published params M, published GFLOPs, official-code params, official GMACs)
TABLE1 = [
    ('PaCa-Tiny', 'pacavit_tiny_p2cconv_100_0', 12.2, 3.2, 12_200_680, 3.237),
    ('PaCa-Small', 'pacavit_small_p2cconv_100_0', 22.0, 5.5, 22_037_704, 5.529),
    ('PaCa-Small (mlp)', 'pacavit_small_p2cmlp_100_0', 22.6, 5.9, 22_637_268, 5.891),
    ('PaCa-Small^ec', 'pacavit_convmixer_small_100', 21.1, 5.4, 21_075_064, 5.442),
    ('PaCa-Base', 'pacavit_base_p2cconv_100_0', 46.9, 9.5, 46_911_304, 9.574),
    ('PaCa-Base^ec', 'pacavit_convmixer_base_100', 46.7, 9.7, 47_659_192, 9.733),
    ('Small, M=2,2,2,0', 'pacavit_small_p2cconv_2_0', 22.0, 4.7, 21_978_120, 4.666),
    ('Small, M=49,49,49,0', 'pacavit_small_p2cconv_49_0', 22.0, 5.0, 22_006_696, 5.080),
    ('Small, M=49,64,81,100', 'pacavit_small_p2cconv_49_100', 22.2, 5.3, 22_227_560, 5.301),
    ('Small, M=100,81,64,49', 'pacavit_small_p2cconv_100_49', 22.2, 5.3, 22_210_696, 5.364),
    ('Small, M=100x4', 'pacavit_small_p2cconv_100', 22.3, 5.6, 22_245_448, 5.596),
    ('Small, M=100x4 block-wise', 'pacavit_small_p2cconv_100_blockwise', 24.1, 6.1,
     24_191_944, 6.131),
]
# (name, model key, published params M, published GFLOPs, official-code params M)
TABLE2 = [
    ('PaCa-Tiny', 'pacavit_tiny_p2cconv_100_0', 32.0, 252, 31.97),
    ('PaCa-Small', 'pacavit_small_p2cconv_100_0', 41.8, 296, 41.81),
    ('PaCa-Small (mlp)', 'pacavit_small_p2cmlp_100_0', 42.4, 303, 42.41),
    ('PaCa-Small^ec', 'pacavit_convmixer_small_100', 40.9, 292, 40.85),
    ('PaCa-Base', 'pacavit_base_p2cconv_100_0', 66.6, 373, 66.61),
    ('PaCa-Base^ec', 'pacavit_convmixer_base_100', 61.4, 372, 67.35),
    ('Small, M=2,2,2,0', 'pacavit_small_p2cconv_2_0', 41.6, 283, 41.75),
    ('Small, M=49,49,49,0', 'pacavit_small_p2cconv_49_0', 41.8, 289, 41.78),
    ('Small, M=49,64,81,100', 'pacavit_small_p2cconv_49_100', 42.0, 289, 42.00),
    ('Small, M=100,81,64,49', 'pacavit_small_p2cconv_100_49', 42.0, 291, 41.98),
    ('Small, M=100x4', 'pacavit_small_p2cconv_100', 42.0, 294, 42.02),
    ('Small, M=100x4 block-wise', 'pacavit_small_p2cconv_100_blockwise', 44.0, 304, 43.97),
]
# Official-code backbone GMACs at 800x1280 (spec 7.2).
DET_BACKBONE_OFFICIAL = {'pacavit_tiny_p2cconv_100_0': 65.6, 'pacavit_small_p2cconv_100_0': 110.5,
                         'pacavit_base_p2cconv_100_0': 187.4}
# (name, config glob stem, published params M, published GFLOPs, official-code params M,
#  official-code GMACs or None)
TABLE3 = [
    ('Tiny + PaCa head', 'paca_head/pacahead_pacavit_tiny_p2cconv_100_0', 13.3, 34.4, 13.33,
     34.34),
    ('Small + PaCa head', 'paca_head/pacahead_pacavit_small_p2cconv_100_0', 23.2, 47.2, 23.16,
     47.22),
    ('Small (mlp) + PaCa head', 'paca_head/pacahead_pacavit_small_p2cmlp_100_0', 24.0, 50.0,
     23.95, 49.92),
    ('Small^ec + PaCa head', 'paca_head/pacahead_pacavit_convmixer_small_100', 22.2, 46.4, 22.24,
     46.36),
    ('Base + PaCa head', 'paca_head/pacahead_pacavit_base_p2cconv_100_0', 48.0, 68.5, 47.96,
     68.50),
    ('Base^ec + PaCa head', 'paca_head/pacahead_pacavit_convmixer_base_100', 48.8, 68.7, 48.76,
     68.75),
    ('Tiny + UperNet', 'upernet/upernet_pacavit_tiny_p2cconv_100_0', 41.6, 229.9, 41.56, None),
    ('Small + UperNet', 'upernet/upernet_pacavit_small_p2cconv_100_0', 51.4, 242.7, 51.40, None),
    ('Base + UperNet', 'upernet/upernet_pacavit_base_p2cconv_100_0', 77.2, 264.1, 77.18, None),
]


def _pct(ours: float, ref: float) -> str:
    return f'{100.0 * (ours - ref) / ref:+.1f}%'


def markdown(sections: Sequence[str] = ('cls', 'det', 'seg'), log=print) -> str:
    """The tables of docs/complexity.md, every 'ours' number measured here and now."""
    import glob
    lines: List[str] = []
    if 'cls' in sections:
        lines += ['## Table 1: ImageNet classifiers at 224x224',
                  '',
                  'PaCaViT + GAP + 1000-way linear head (`tools/get_flops.py --backbone ARCH`).',
                  '',
                  '| model | params (ours) | params (paper / official code) | GFLOPs (ours) |'
                  ' GFLOPs (paper / official code) | diff vs official code |',
                  '|---|---|---|---|---|---|']
        for name, key, p_pub, f_pub, p_off, f_off in TABLE1:
            res = measure(backbone=key, shape=(224, 224))
            log(f'  {name}: {res["params"]:,} params, {res["flops"] / 1e9:.3f} G')
            lines.append(f'| {name} (`{key}`) | {res["params"]:,} | {p_pub} M / {p_off:,} | '
                         f'{res["flops"] / 1e9:.3f} | {f_pub} / {f_off:.3f} | '
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
        for name, key, p_pub, f_pub, p_off in TABLE2:
            cfg = osp.join(REPO_ROOT, 'configs', 'mask_rcnn',
                           f'mask_rcnn_{key}_mstrain_480_800_1x_coco.py')
            res = measure(config=cfg, shape=(800, 1280))
            bb = res['by_module'].get('backbone', 0) / 1e9
            off_bb = DET_BACKBONE_OFFICIAL.get(key)
            bb_txt = f'{bb:.1f}' + (f' (official code {off_bb})' if off_bb else '')
            log(f'  {name}: {res["params"]:,} params, {res["flops"] / 1e9:.1f} G '
                f'(backbone {bb:.1f} G), {res.get("num_rois")} RoIs')
            lines.append(f'| {name} | {res["params"] / 1e6:.2f} M | {p_pub} M / {p_off} M | '
                         f'{res["flops"] / 1e9:.1f} / {bb_txt} | {f_pub} | '
                         f'params {_pct(res["params"] / 1e6, p_off)} (vs code), '
                         f'FLOPs {_pct(res["flops"] / 1e9, f_pub)} | {res.get("num_rois")} |')
        lines.append('')
    if 'seg' in sections:
        rows = []
        for name, stem, p_pub, f_pub, p_off, f_off in TABLE3:
            found = sorted(glob.glob(osp.join(REPO_ROOT, 'configs', stem + '*.py')))
            if found:
                rows.append((name, found[0], p_pub, f_pub, p_off, f_off))
        lines += ['## Table 3: semantic segmentation at 512x512', '']
        if not rows:
            lines += ['(no segmentation configs found under configs/paca_head, '
                      'configs/upernet)', '']
        else:
            lines += ['`tools/get_flops.py CONFIG` (decode head only in the FLOPs; an '
                      'auxiliary head is included in the parameters).',
                      '',
                      '| model | params (ours) | params (paper / official code) | '
                      'GFLOPs (ours) | GFLOPs (paper / official code) | diff |',
                      '|---|---|---|---|---|---|']
            for name, cfg, p_pub, f_pub, p_off, f_off in rows:
                res = measure(config=cfg, shape=(512, 512))
                g = res['flops'] / 1e9
                ref = f_off if f_off is not None else f_pub
                log(f'  {name}: {res["params"]:,} params, {g:.2f} G')
                lines.append(
                    f'| {name} (`{osp.relpath(cfg, REPO_ROOT)}`) | {res["params"] / 1e6:.2f} M'
                    f' | {p_pub} M / {p_off} M | {g:.2f} | {f_pub} / '
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
    p.add_argument('--show-unsupported', action='store_true')
    return p.parse_args(argv)


def main(argv=None):
    with torch.no_grad():  # scoped: main() is also called in-process by the tests
        return _main(parse_args(argv))


def _main(args):
    if args.markdown:
        text = markdown(args.sections, log=lambda s: print(s, file=sys.stderr, flush=True))
        if args.out:
            with open(args.out, 'w') as f:
                f.write(text + '\n')
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
