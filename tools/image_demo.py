"""Run a PaCa-ViT model on one image and save the painted prediction.

    python tools/image_demo.py CONFIG CHECKPOINT IMAGE --out FILE [--device cpu]
        [--score-thr 0.3] [--topk 5] [--trust-checkpoint] [--cfg-options k=v ...]

The task follows the config's ``default_scope``: mmdet (boxes + masks, DetLocalVisualizer),
mmseg (colourised segmentation, SegLocalVisualizer) or mmpretrain (top-k classes,
UniversalVisualizer). CHECKPOINT: a Runner checkpoint of the full model, an official
ImageNet release for classifiers, or ``none`` (random weights, for smoke tests). It is read
weights-only plus what Runner checkpoints contain; other pickled objects need
``--trust-checkpoint`` (or ``PACA_MM_TRUST_CHECKPOINTS=1``) for a file you trust.
"""
import argparse
import os.path as osp
import sys

# from a checkout: its paca_mm when none is installed, and its demo package (the demo
# configs import demo.datasets)
sys.path.append(osp.dirname(osp.dirname(osp.abspath(__file__))))
import paca_mm  # noqa: F401,E402  (registers PaCaViT & co.)

from mmengine.config import DictAction  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='PaCa-ViT single-image inference demo')
    p.add_argument('config', help='config file (detection, segmentation or classification)')
    p.add_argument('checkpoint', help="checkpoint file, or 'none' for random weights")
    p.add_argument('image', help='image file')
    p.add_argument('--out', required=True, help='output image file (e.g. result.png)')
    p.add_argument('--device', default='cpu', help="e.g. 'cpu' or 'cuda:0'")
    p.add_argument('--score-thr', type=float, default=0.3, help='detection score threshold')
    p.add_argument('--topk', type=int, default=5, help='classes printed (classification)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override config settings, key=value pairs')
    p.add_argument('--trust-checkpoint', action='store_true',
                   help='unpickle the checkpoint in full (it may run code): only for a file '
                   'you trust that pickles objects beyond tensors and what mmengine Runner '
                   'checkpoints contain; same as PACA_MM_TRUST_CHECKPOINTS=1')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from paca_mm.visualization.image_demo import run_image_demo
    ckpt = None if args.checkpoint.lower() == 'none' else args.checkpoint
    out = run_image_demo(args.config, ckpt, args.image, args.out, device=args.device,
                         score_thr=args.score_thr, topk=args.topk,
                         cfg_options=args.cfg_options, trust=args.trust_checkpoint)
    if out['task'] == 'cls':
        print('top classes: ' + ', '.join(f'{c}: {p:.4f}' for c, p in out['top']))
    elif out['task'] == 'det':
        print(f'{out["num_instances"]} instances with score > {args.score_thr} (drawn)')
    print(f'result written to {out["out_file"]}')
    return out


if __name__ == '__main__':
    from paca_mm.checkpoint import CheckpointError
    try:
        main()
    except CheckpointError as e:  # a refused or unreadable checkpoint: one clear line
        sys.exit(f'error: {e}')
