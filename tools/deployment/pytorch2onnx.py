#!/usr/bin/env python
"""Export a paca_mm model to ONNX (dynamic batch, height and width) and check it on ONNX
Runtime against PyTorch.

    python tools/deployment/pytorch2onnx.py CONFIG CHECKPOINT --out model.onnx
        [--kind segmentor|classifier|backbone] [--shape H W] [--static-hw] [--opset 17]
        [--check [N H W ...]] [--rtol 1e-4] [--trust-checkpoint] [--cfg-options k=v ...]

CHECKPOINT may be 'none' (random weights). The kind defaults to the config's toolbox:
segmentor (mmseg: image -> logits at the input size), classifier (mmpretrain: image ->
class scores), backbone (mmdet: backbone + neck features; see docs/deployment.md for why
the RoI heads are not exported). The graph's input is the image as the dataset pipeline
loads it (float32, 0-255, BGR for mmcv's loader); the data preprocessor's normalisation is
in the graph. ``--check`` runs the file on ONNX Runtime at the export size and at the
given (N, H, W) sizes and fails if any output differs by more than ``--rtol`` relative.
``--static-hw`` fixes H and W to ``--shape`` (needed by heads that pool to a fixed grid,
such as UperNet's pyramid pooling; the export says so when it is needed).
"""
import argparse
import os.path as osp
import sys

# from a checkout: its paca_mm when none is installed, and its demo package (the demo
# configs import demo.datasets)
sys.path.append(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
import paca_mm  # noqa: F401,E402  (registers PaCaViT & co.)

from mmengine.config import DictAction  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Export a paca_mm model to ONNX')
    p.add_argument('config', help='config file (segmentation, classification or detection)')
    p.add_argument('checkpoint', help="checkpoint file, or 'none' for random weights")
    p.add_argument('--out', required=True, help='output .onnx file')
    p.add_argument('--kind', choices=['segmentor', 'classifier', 'backbone'], default=None,
                   help='graph to export (default: from the config\'s toolbox)')
    p.add_argument('--shape', type=int, nargs=2, default=[512, 512], metavar=('H', 'W'),
                   help='example input size used for the export (H and W stay dynamic '
                   'unless --static-hw)')
    p.add_argument('--static-hw', action='store_true',
                   help='export for the --shape size only (the batch stays dynamic)')
    p.add_argument('--opset', type=int, default=17)
    p.add_argument('--check', type=int, nargs='*', default=None, metavar='N_H_W',
                   help='check on ONNX Runtime at the export size and at these extra '
                   'N H W triples (e.g. --check 2 320 480)')
    p.add_argument('--rtol', type=float, default=1e-4,
                   help='allowed max|ort - torch| / max|torch| per output (default 1e-4)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override config settings, key=value pairs')
    p.add_argument('--trust-checkpoint', action='store_true',
                   help='unpickle CHECKPOINT in full (it may run code): only for files you '
                   'trust; same as PACA_MM_TRUST_CHECKPOINTS=1')
    args = p.parse_args(argv)
    if args.check is not None and len(args.check) % 3:
        p.error(f'--check takes N H W triples, got {len(args.check)} numbers')
    if args.static_hw and args.check:
        for i in range(0, len(args.check), 3):
            if list(args.check[i + 1:i + 3]) != list(args.shape):
                p.error(f'--static-hw exports for H W = {args.shape[0]} {args.shape[1]} only; '
                        f'--check asks for {args.check[i + 1]} {args.check[i + 2]}')
    return args


def main(argv=None):
    args = parse_args(argv)
    from paca_mm.deployment import check_onnx, default_kind, export_onnx
    from paca_mm.visualization.inference import build_model
    ckpt = None if args.checkpoint.lower() == 'none' else args.checkpoint
    model = build_model(args.config, ckpt, 'cpu', args.cfg_options, trust=args.trust_checkpoint)
    kind = args.kind or default_kind(model)
    names = export_onnx(model, args.out, kind, shape=args.shape, opset=args.opset,
                        dynamic_hw=not args.static_hw)
    dims = f'dynamic N; H, W = {args.shape[0]}, {args.shape[1]}' if args.static_hw \
        else 'dynamic N, H, W'
    print(f'exported {kind} of {osp.basename(args.config)} to {args.out} '
          f'(outputs: {", ".join(names)}; {dims})')
    if args.check is not None:
        shapes = [(1, *args.shape)] + [tuple(args.check[i:i + 3])
                                       for i in range(0, len(args.check), 3)]
        for row in check_onnx(model, args.out, kind, shapes, rtol=args.rtol):
            worst = max(row['errors'].values())
            print(f'onnxruntime check {row["shape"]}: max relative error {worst:.2e} '
                  f'(<= {args.rtol})')
    return args.out


if __name__ == '__main__':
    from paca_mm.checkpoint import CheckpointError
    try:
        main()
    except (CheckpointError, ValueError) as e:
        sys.exit(f'error: {e}')
