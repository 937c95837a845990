"""Train with any paca_mm config (mmseg, mmdet or mmpretrain, chosen by default_scope).

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp]
        [--auto-scale-lr] [--trust-checkpoint] [--cfg-options k=v ...]
        [--launcher none|pytorch|slurm|mpi]

Same flags and semantics as the toolboxes' own tools/train.py. ``--resume`` alone resumes
from the latest checkpoint in the work dir, ``--resume CKPT`` from that file. On a machine
without CUDA: SyncBN -> BN, ``--amp`` -> bf16 autocast, distributed -> gloo (see
``paca_mm/engine/cpu.py``). Checkpoints also keep the torch RNG state, so a resumed
run continues the dropout/drop-path stream exactly (``paca_mm/hooks/rng_state_hook.py``).
Checkpoints are written atomically (temporary file + ``os.replace``; ``last_checkpoint`` is
updated after the file is complete), unless the config gives the CheckpointHook its own
``backend_args``. ``--resume`` checks the checkpoint first: a truncated or corrupt newest
one is named in a warning and the newest complete one in the work dir is used; with none
(or a broken ``--resume CKPT``) the run stops with an error naming the files.
Checkpoints (``--resume``, ``load_from``, a backbone's ``init_cfg``) are loaded weights-only
plus what mmengine Runner checkpoints contain (``paca_mm/checkpoint/loading.py``); a file that
pickles other objects is refused unless you trust it: ``--trust-checkpoint`` or
``PACA_MM_TRUST_CHECKPOINTS=1``.
Multi-process: tools/dist_train.sh, tools/slurm_train.sh.
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
from paca_mm.engine.args import (apply_train_args, build_runner,  # noqa: E402
                                 run_with_checkpoint_hint, set_work_dir)
from paca_mm.engine.checkpoints import (add_rng_state_hook,  # noqa: E402
                                        check_resume_checkpoint, use_atomic_checkpoints)
from paca_mm.engine.compile import (add_eager_optimizer_step_hook,  # noqa: E402
                                    compile_static_shapes, compiled_adam_lr_zero,
                                    compiled_cpu_attention_torch_bug)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a PaCa-ViT model (mmseg/mmdet/mmpretrain)')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto',
        help='resume from CKPT; without a value, from the latest checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true', default=False,
                        help='enable automatic mixed precision training')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the learning rate by total batch size / base_batch_size')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config settings, key=value pairs (e.g. train_cfg.max_iters=100; '
        'lists as key="[a,b]" or key=a,b; no white space)')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    # torch.distributed.launch passes --local-rank; torchrun sets LOCAL_RANK
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
    trust_checkpoints(args.trust_checkpoint)
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    set_work_dir(cfg, args.work_dir, args.config)
    notes = apply_train_args(cfg, amp=args.amp, auto_scale_lr=args.auto_scale_lr,
                             resume=args.resume)
    notes += add_rng_state_hook(cfg)
    notes += add_eager_optimizer_step_hook(cfg)
    notes += use_atomic_checkpoints(cfg)
    static_notes, warnings = compile_static_shapes(cfg)
    notes += static_notes
    warnings += check_resume_checkpoint(cfg)  # CheckpointError: nothing to resume
    for compile_warning in (compiled_adam_lr_zero(cfg), compiled_cpu_attention_torch_bug(cfg)):
        warnings += [compile_warning] if compile_warning else []
    runner = build_runner(cfg)
    for note in notes:
        runner.logger.info(note)
    for warning in warnings:
        runner.logger.warning(warning)
    run_with_checkpoint_hint(runner.train)


if __name__ == '__main__':
    try:
        main()
    except CheckpointError as e:  # a refused or unreadable checkpoint: one clear line
        sys.exit(f'error: {e}')
