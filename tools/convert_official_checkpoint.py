#!/usr/bin/env python
"""Convert an official PaCa-ViT checkpoint for use with paca_mm.

Examples::

    # ImageNet release -> mmpretrain ImageClassifier (backbone.* + head.fc.*)
    python tools/convert_official_checkpoint.py IMNET_224_pacavit_tiny_p2cconv_100_0.pth \\
        paca_tiny_cls.pth --to classifier --arch pacavit_tiny_p2cconv_100_0

    # ImageNet release -> backbone only, with the ADE20k cluster counts (100 -> 200); the
    # cluster-count dependent layers are freshly initialised and the result loads strictly.
    python tools/convert_official_checkpoint.py IMNET_224_pacavit_tiny_p2cconv_100_0.pth \\
        paca_tiny_backbone_200.pth --to backbone --arch tiny --num-clusters 200 200 200 0

Released files load directly through ``init_cfg=dict(type='Pretrained', checkpoint=...)``
too; the converter is for layout changes and for checking a file against an arch. It never
overwrites its input and writes atomically (temporary file + rename). SRC is read
weights-only (tensors, plus what mmengine Runner and timm checkpoints contain: a timm
file's ``state_dict`` is taken, ``--ema`` takes its ``state_dict_ema``); a file that pickles
other objects is refused unless you trust it: ``--trust-checkpoint`` or
``PACA_MM_TRUST_CHECKPOINTS=1``.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from paca_mm.checkpoint import (CheckpointError, adapt_cluster_layers,  # noqa: E402
                                convert_official_to_classifier,
                                extract_backbone_state_dict, load_checkpoint_file,
                                match_state_dict, save_checkpoint_atomic, state_dict_of)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('src', help='official checkpoint (.pth): plain state_dict or mmengine file')
    p.add_argument('dst', help='output file (must differ from src)')
    p.add_argument('--to', choices=['backbone', 'classifier'], default='backbone',
                   help='backbone: PaCaViT keys only; classifier: mmpretrain ImageClassifier')
    p.add_argument('--arch', help='PaCaViT arch/preset to check the result against '
                   '(required with --num-clusters)')
    p.add_argument('--num-clusters', type=int, nargs='+',
                   help='target cluster count per stage (re-initialises M-dependent layers)')
    p.add_argument('--prefix', default=None,
                   help="key prefix of the backbone in src (default: 'backbone.' if present)")
    p.add_argument('--ema', action='store_true',
                   help="take a timm file's EMA weights (state_dict_ema); default: its "
                   'state_dict, as timm loads it')
    p.add_argument('--trust-checkpoint', action='store_true',
                   help='unpickle src in full (it may run code): only for a file you trust '
                   'that pickles objects beyond tensors and what mmengine Runner checkpoints '
                   'contain; same as PACA_MM_TRUST_CHECKPOINTS=1')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.num_clusters and not args.arch:
        sys.exit('error: --num-clusters needs --arch (the model to adapt to)')
    try:
        ckpt = load_checkpoint_file(args.src, trust=args.trust_checkpoint)
        backbone = extract_backbone_state_dict(ckpt, args.prefix, args.ema)
        if args.arch:
            from paca_mm.models.backbones import PaCaViT
            kwargs = {'num_clusters': args.num_clusters} if args.num_clusters else {}
            model = PaCaViT(arch=args.arch, **kwargs)
            if args.num_clusters:
                backbone = adapt_cluster_layers(backbone, model)
            report = match_state_dict(model.state_dict(), backbone)
            bad = report['missing'] + report['unexpected'] + report['mismatched'] + \
                report['reinit']
            if bad:
                raise CheckpointError(
                    f'{args.src} does not match arch {args.arch!r}: ' + '; '.join(
                        f'{name}: {report[name][:5]}' for name in
                        ('missing', 'unexpected', 'mismatched', 'reinit') if report[name])
                    + '. Pass --num-clusters to adapt a cluster count, or the right --arch.')
        if args.to == 'classifier':
            head = {k: v for k, v in state_dict_of(ckpt, args.ema).items()
                    if k.startswith('head.')}
            if not head:
                raise CheckpointError(f'{args.src} has no classifier head.* keys; use --to '
                                      'backbone')
            state = convert_official_to_classifier({**backbone, **head})
        else:
            state = backbone
        save_checkpoint_atomic({'state_dict': state, 'meta': {'converted_from':
                                                              osp.basename(args.src)}},
                               args.dst, src=args.src)
    except (CheckpointError, FileNotFoundError, ValueError) as e:
        sys.exit(f'error: {e}')
    print(f'wrote {args.dst}: {len(state)} tensors ({args.to})')


if __name__ == '__main__':
    main()
