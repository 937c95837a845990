"""Visualise the learned clusters of a PaCa-ViT model on one image (paper Sec. 3.3).

    python tools/visualize_clusters.py CONFIG CHECKPOINT IMAGE [--stage 3] [--out DIR]
        [--groups] [--topk 5] [--label L] [--device cpu] [--size H W] [--no-per-cluster]
        [--trust-checkpoint] [--cfg-options k=v ...]

CONFIG may be a classification, detection or segmentation config (the toolbox is its
``default_scope``); the explainer uses ``model.backbone`` (a PaCaViT) with
``record_clusters = True`` and one forward pass. ``--stage`` is **1-based** (1..4; the
paper shows stage 3; a stage with M = 0 clusters has no assignment). The image goes through
the config's test pipeline (resize/crop) unless ``--size H W`` is given. CHECKPOINT is a
checkpoint of the full model (Runner layout) or an official PaCa-ViT ImageNet release
(``IMNET_224_<model>.pth``), or ``none`` for random weights; it is read weights-only plus
what Runner checkpoints contain, other pickled objects need ``--trust-checkpoint`` (or
``PACA_MM_TRUST_CHECKPOINTS=1``) for a file you trust.

Written to DIR (default ``work_dirs/cluster_vis``):
    stage{s}_heatmaps.png              input + the M sigmoid heatmaps (min-max per map)
    stage{s}_clusters/cluster_XXX.png  one overlay per cluster
    stage{s}_groups.png / .json        with --groups (classifiers): masks "sigmoid > mean"
                                       (Eqn. 7) -> masked images re-classified; top-k of the
                                       positive group (masked image still predicts the label)
                                       and of the negative group, with P(label) on each tile.
                                       The label is --label, else the unmasked prediction.
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
    p = argparse.ArgumentParser(description='PaCa-ViT cluster explainer (paper Sec. 3.3)')
    p.add_argument('config', help='config file (classification, detection or segmentation)')
    p.add_argument('checkpoint', help="model checkpoint, or 'none' for random weights")
    p.add_argument('image', help='input image file')
    p.add_argument('--stage', type=int, default=3, help='1-based stage index (default 3)')
    p.add_argument('--out', default='work_dirs/cluster_vis', help='output folder')
    p.add_argument('--groups', action='store_true',
                   help='positive/negative cluster group analysis (classifiers only)')
    p.add_argument('--topk', type=int, default=5, help='clusters shown per group')
    p.add_argument('--label', type=int, default=None,
                   help='ground-truth class index (default: the unmasked prediction)')
    p.add_argument('--device', default='cpu', help="e.g. 'cpu' or 'cuda:0'")
    p.add_argument('--size', type=int, nargs=2, metavar=('H', 'W'),
                   help='resize the image to H x W instead of using the test pipeline')
    p.add_argument('--tile', type=int, default=128, help='tile size of the figures (px)')
    p.add_argument('--batch-size', type=int, default=16, help='masked images per forward')
    p.add_argument('--no-per-cluster', action='store_true',
                   help='do not write one overlay file per cluster')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override config settings, key=value pairs')
    p.add_argument('--trust-checkpoint', action='store_true',
                   help='unpickle the checkpoint in full (it may run code): only for a file '
                   'you trust that pickles objects beyond tensors and what mmengine Runner '
                   'checkpoints contain; same as PACA_MM_TRUST_CHECKPOINTS=1')
    args = p.parse_args(argv)
    if args.topk < 1:
        p.error('--topk must be >= 1')
    return args


def main(argv=None):
    args = parse_args(argv)
    from paca_mm.visualization import explain_image, model_kind
    from paca_mm.visualization.inference import build_model, load_image
    ckpt = None if args.checkpoint.lower() == 'none' else args.checkpoint
    model = build_model(args.config, ckpt, args.device, args.cfg_options,
                        trust=args.trust_checkpoint)
    if args.groups and model_kind(model) != 'classifier':
        raise SystemExit(f'--groups needs a classification config; {args.config} builds a '
                         f'{type(model).__name__} (the heatmaps work without --groups)')
    raw = load_image(model.cfg, args.image, size=args.size)
    classes = model.dataset_meta.get('classes') if model.dataset_meta else None
    out = explain_image(model, raw, args.out, stage=args.stage, groups=args.groups,
                        topk=args.topk, label=args.label, tile=args.tile,
                        per_cluster=not args.no_per_cluster, batch_size=args.batch_size,
                        class_names=list(classes) if classes else None)
    print(f'stage {args.stage}: {out["logits"].shape[0]} clusters on a '
          f'{tuple(out["logits"].shape[1:])} grid; heatmaps -> {out["heatmaps"]}')
    if out['clusters']:
        print(f'per-cluster overlays -> {osp.dirname(out["clusters"][0])}')
    if out['result'] is not None:
        r = out['result']
        print(f'label {r.label} ({"given" if r.label_given else "predicted"}), '
              f'P(label | image) = {r.base_prob:.4f}; positive group {len(r.positive)}, '
              f'negative group {len(r.negative)} -> {out["groups"]} ({out["summary"]})')
    return out


if __name__ == '__main__':
    from paca_mm.checkpoint import CheckpointError
    try:
        main()
    except CheckpointError as e:  # a refused or unreadable checkpoint: one clear line
        sys.exit(f'error: {e}')
