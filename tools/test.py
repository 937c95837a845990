"""Test (and evaluate) a checkpoint with any paca_mm config (mmseg, mmdet or mmpretrain).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out OUT] [--show]
        [--show-dir DIR] [--tta] [--trust-checkpoint] [--cfg-options k=v ...] [--launcher ...]

Semantics follow the toolbox named by the config's default_scope: ``--out`` is a directory
of prediction maps for mmseg and a ``.pkl`` of predictions for mmdet and mmpretrain;
``--show-dir`` saves painted predictions; ``--tta`` uses the config's ``tta_model`` and
``tta_pipeline`` (mmdet/mmpretrain fall back to a flip TTA; see README "Tools").
CHECKPOINT is loaded weights-only plus what mmengine Runner checkpoints contain (see
``paca_mm/checkpoint/loading.py``); a file that pickles other objects is refused unless you
trust it: ``--trust-checkpoint`` or ``PACA_MM_TRUST_CHECKPOINTS=1``.
Multi-process: tools/dist_test.sh, tools/slurm_test.sh.
"""
import argparse
import os
import os.path as osp
import sys

# from a checkout: its paca_mm when none is installed, and its demo package (the demo
# configs import demo.datasets)
sys.path.append(osp.dirname(osp.dirname(osp.abspath(__file__))))
import paca_mm  # noqa: F401,E402  (registers PaCaViT & co.)

from mmengine.config import Config, DictAction  # noqa: E402

from paca_mm.checkpoint import CheckpointError, trust_checkpoints  # noqa: E402
from paca_mm.engine.args import (apply_test_args, build_runner,  # noqa: E402
                                 run_with_checkpoint_hint, set_work_dir)
from paca_mm.registry import get_scope  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test (and evaluate) a PaCa-ViT model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save the file with evaluation metrics')
    parser.add_argument(
        '--out', type=str,
        help='mmseg: directory for prediction maps (offline evaluation); mmdet/mmpretrain: '
        '.pkl file to dump the predictions to')
    parser.add_argument('--show', action='store_true', help='show prediction results')
    parser.add_argument('--show-dir', help='directory where painted images will be saved')
    parser.add_argument('--wait-time', type=float, default=2, help='the interval of show (s)')
    parser.add_argument('--interval', type=int, default=None,
                        help='with --show/--show-dir: draw every N-th test batch (default: '
                        'the hook\'s interval; 1 for mmpretrain)')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config settings, key=value pairs (e.g. test_dataloader.batch_size=2)')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--tta', action='store_true',
                        help='test time augmentation (the config\'s tta_model, tta_pipeline)')
    parser.add_argument(
        '--trust-checkpoint', action='store_true',
        help='unpickle the checkpoints this run loads in full (they may run code): only for '
        'files you trust that pickle objects beyond tensors and what mmengine Runner '
        'checkpoints contain; same as PACA_MM_TRUST_CHECKPOINTS=1')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main(argv=None):
    args = parse_args(argv)
    if '://' not in args.checkpoint and not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint {args.checkpoint!r} does not exist')
    trust_checkpoints(args.trust_checkpoint)
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    set_work_dir(cfg, args.work_dir, args.config)
    scope = get_scope(cfg)
    apply_test_args(cfg, scope, args.checkpoint, out=args.out, show=args.show,
                    show_dir=args.show_dir, wait_time=args.wait_time, tta=args.tta,
                    interval=args.interval)
    runner = build_runner(cfg)
    return run_with_checkpoint_hint(runner.test)


if __name__ == '__main__':
    try:
        main()
    except CheckpointError as e:  # a refused or unreadable checkpoint: one clear line
        sys.exit(f'error: {e}')
