#!/usr/bin/env python
"""Training step time through mmengine, eager against ``compile=True``.

For a config, trains a few iterations twice through ``tools/train.py``, each in a fresh
process: as configured (eager) and with mmengine's ``compile`` option (the Runner compiles
``train_step``; inductor by default). Every iteration is logged (``log_processor`` window
1) and its ``time`` read back from mmengine's ``scalars.json``; the first ``--skip``
iterations (compilation, warm-up) are left out. Prints a Markdown table with the median step
time of each and their ratio, and writes it to ``WORK_DIR/train_step_time.md``.

The demo configs train on generated data, so they need no dataset download; generate it
first (``--data seg`` / ``--data det`` writes it into the work dir and points the config at
it)::

    python dev/train_step_time.py demo/configs/pacahead_tiny_synthetic_seg.py --data seg
    python dev/train_step_time.py demo/configs/mask_rcnn_tiny_synthetic_coco.py --data det
"""
import argparse
import glob
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
from typing import List

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)


def generate_data(kind: str, work_dir: str, config: str) -> List[str]:
    """Generate the demo dataset ``kind`` ('seg' or 'det') under ``work_dir``; the
    ``--cfg-options`` that point the config's dataloaders (and COCO evaluators) at it."""
    from mmengine.config import Config
    cfg = Config.fromfile(config)
    root = osp.join(work_dir, 'data', kind)
    if kind == 'seg':
        from demo.datasets.synthetic_seg import generate_synthetic_seg
        generate_synthetic_seg(root, num_train=16, num_val=4)
    else:
        from demo.datasets.synthetic_coco import generate_synthetic_coco
        from demo.det import DEMO_DATA
        generate_synthetic_coco(root, **dict(DEMO_DATA, num_train=16, num_val=4))
        root += '/'
    options = [f'{split}_dataloader.dataset.data_root={root}'
               for split in ('train', 'val', 'test')
               if isinstance(cfg.get(f'{split}_dataloader'), dict)]
    if kind == 'det':
        options += [f'{split}_evaluator.ann_file={root}annotations/instances_val.json'
                    for split in ('val', 'test') if isinstance(cfg.get(f'{split}_evaluator'),
                                                               dict)]
    return options


def step_times(work_dir: str) -> List[float]:
    """Per-iteration ``time`` (s) from the run's ``vis_data/scalars.json``."""
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not files:
        raise FileNotFoundError(f'no vis_data/scalars.json under {work_dir}: did the run log?')
    times = {}
    with open(files[-1]) as f:
        for line in f:
            rec = json.loads(line)
            if 'time' in rec and 'iter' in rec:
                times[rec['iter']] = rec['time']
    return [times[i] for i in sorted(times)]


def run(config: str, work_dir: str, iters: int, options: List[str], threads: int) -> None:
    cmd = [sys.executable, osp.join(ROOT, 'tools', 'train.py'), config, '--work-dir',
           work_dir, '--cfg-options', f'train_cfg.max_iters={iters}',
           'default_hooks.logger.interval=1', 'log_processor.window_size=1',
           f'default_hooks.checkpoint.interval={iters + 1}', 'train_cfg.val_interval='
           f'{iters + 1}'] + options
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f'training failed ({" ".join(cmd)}):\n{proc.stderr[-3000:]}')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('config')
    p.add_argument('--work-dir', default='work_dirs/train_step_time')
    p.add_argument('--iters', type=int, default=12, help='iterations per run')
    p.add_argument('--skip', type=int, default=4,
                   help='first iterations left out (compilation, warm-up)')
    p.add_argument('--backend', default='inductor', help='torch.compile backend')
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--data', choices=['seg', 'det'],
                   help='generate this demo dataset and point the config at it')
    p.add_argument('--cfg-options', nargs='+', default=[],
                   help='more overrides for both runs (key=value)')
    args = p.parse_args(argv)
    if args.iters <= args.skip:
        p.error(f'--iters ({args.iters}) must exceed --skip ({args.skip}): no iteration '
                'would be timed')
    os.makedirs(args.work_dir, exist_ok=True)
    options = list(args.cfg_options)
    if args.data:
        options += generate_data(args.data, args.work_dir, args.config)
    medians = {}
    for mode in ('eager', 'compiled'):
        extra = [f'compile.backend={args.backend}'] if mode == 'compiled' else []
        wd = osp.join(args.work_dir, mode)
        run(args.config, wd, args.iters, options + extra, args.threads)
        times = step_times(wd)
        if len(times) != args.iters:
            raise RuntimeError(f'{mode}: {len(times)} logged iterations, expected {args.iters}')
        medians[mode] = statistics.median(times[args.skip:])
        print(f'{mode}: step times (s) {["%.3f" % t for t in times]}', flush=True)
    table = ('| config | eager s/iter | compiled s/iter | compiled / eager |\n|---|---|---|---|\n'
             f'| {osp.basename(args.config)} | {medians["eager"]:.3f} | '
             f'{medians["compiled"]:.3f} | {medians["compiled"] / medians["eager"]:.2f} |\n')
    print(table)
    out = osp.join(args.work_dir, 'train_step_time.md')
    from paca_mm.fileio import atomic_write
    atomic_write(f'backend {args.backend}, {args.threads} threads, median of iterations '
                 f'{args.skip + 1}-{args.iters}\n\n' + table, out)
    return medians


if __name__ == '__main__':
    main()
