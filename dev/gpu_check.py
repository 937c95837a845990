#!/usr/bin/env python
"""The GPU check's runs and report (started by dev/gpu_check.sh, which sets up the packages).

1. ``dev/benchmark.py`` twice, without and with ``--amp`` (fp16 autocast on CUDA, bf16 on
   the CPU): PaCa-Tiny, PaCa-Small, PVTv2-B2 and Swin-T; forward, forward+backward and peak
   forward memory (``torch.cuda.max_memory_allocated`` on CUDA) at 512² and 800×1280.
2. ``dev/zoo_benchmark.py`` without and with ``--amp``: the whole models of the
   speed-accuracy chart (segmentors image -> logits at 512², Mask R-CNN backbone + neck and
   predict at 800x1344; eager and ``torch.compile`` in fp32, eager with AMP), with peak
   memory; its JSON files (``OUT/zoo_fp32.json``, ``OUT/zoo_amp.json``) feed
   ``dev/zoo_chart.py`` as the CPU ones do.
3. ``tools/train.py demo/configs/pacahead_tiny_synthetic_seg.py --amp`` for a few iterations
   on freshly generated synthetic data.
4. ``OUT/gpu_check.md``: one Markdown table of both benchmark runs side by side, the
   whole-model tables, the training figures (loss, time per iteration, memory), and the
   versions and device they ran on.

``--device cpu`` is the dry run that CI does (PaCa-Tiny and PVTv2-B2 only, 64² inputs, one
repetition, no warm-up, one training iteration; the whole-model benchmark on PaCa-T with the
PaCa head and PaCa-T Mask R-CNN, eager, without memory runs), so the whole path is known to
work before it meets a GPU. The command exits non-zero if any step fails or the training loss is not
finite.
"""
import argparse
import csv
import json
import math
import os
import os.path as osp
import platform
import subprocess
import sys
import time

import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CONFIG = 'demo/configs/pacahead_tiny_synthetic_seg.py'
# per device: benchmark models, sizes, repeats, warm-up runs; training iterations, images per
# split; whole-model benchmark configs ([]: its default zoo), engines in fp32 and with AMP,
# rounds, extra arguments. The dry run keeps one PaCa model and the reference (each model's
# memory is measured in its own process, and those processes dominate the dry run's time).
PLANS = {
    'cuda': dict(models=['paca_tiny', 'paca_small', 'pvt_v2_b2', 'swin_t'],
                 sizes=['512', '800x1280'], repeats=20, warmup=5, iters=30, images=(64, 8),
                 zoo=dict(configs=[], engines=(['eager', 'compile'], ['eager']), rounds=10,
                          extra=[])),
    # the dry run: 1 thread (it checks the path, not the speed; CI runs it beside other tests)
    'cpu': dict(models=['paca_tiny', 'pvt_v2_b2'], sizes=['64'], repeats=1, warmup=0, iters=1,
                images=(4, 1), threads=1,
                zoo=dict(configs=[
                    'configs/paca_head/pacahead_pacavit_tiny_p2cconv_100_0_512x512_160k_'
                    'ade20k.py',
                    'configs/mask_rcnn/mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_'
                    'coco.py'],
                    engines=(['eager'], ['eager']), rounds=1,
                    extra=['--size', '64x64', '--warmup', '0', '--settle', '0',
                           '--skip-memory'])),
}


def run_step(name, cmd, log_path):
    """Run ``cmd`` from the repository root, its output to ``log_path``; seconds taken.
    Raises SystemExit naming the step and the log's tail if it fails."""
    print(f'[gpu_check] {name}: {" ".join(cmd)}', flush=True)
    start = time.perf_counter()
    with open(log_path, 'w') as log:
        res = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if res.returncode:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f'[gpu_check] {name} failed (exit {res.returncode}, log {log_path}):\n'
                         f'{tail}')
    print(f'[gpu_check] {name}: done in {seconds:.0f} s', flush=True)
    return seconds


def _threads(plan):
    return ['--threads', str(plan['threads'])] if plan.get('threads') else []


def benchmark(device, plan, out, amp):
    """dev/benchmark.py's rows (its CSV) for one precision, and the seconds it took."""
    tag = 'amp' if amp else 'fp32'
    bench_out = osp.join(out, f'benchmark_{tag}')
    cmd = [sys.executable, 'dev/benchmark.py', '--device', device,
           '--models', *plan['models'], '--sizes', *plan['sizes'],
           '--repeats', str(plan['repeats']), '--warmup', str(plan['warmup']),
           '--out', bench_out] + (['--amp'] if amp else []) + _threads(plan)
    seconds = run_step(f'benchmark ({tag})', cmd, osp.join(out, f'benchmark_{tag}.log'))
    with open(osp.join(bench_out, 'benchmark.csv'), newline='') as f:
        return list(csv.DictReader(f)), seconds


def zoo(device, plan, out, amp):
    """dev/zoo_benchmark.py's JSON for one precision, and the seconds it took."""
    tag = 'amp' if amp else 'fp32'
    z = plan['zoo']
    path = osp.join(out, f'zoo_{tag}.json')
    cmd = [sys.executable, 'dev/zoo_benchmark.py', *z['configs'], '--device', device,
           '--engine', *z['engines'][amp], '--rounds', str(z['rounds']), *z['extra'],
           '--out', path] + (['--amp'] if amp else []) + _threads(plan)
    seconds = run_step(f'whole models ({tag})', cmd, osp.join(out, f'zoo_{tag}.log'))
    with open(path) as f:
        data = json.load(f)
    return data, seconds


def train(plan, out):
    """A few AMP iterations of the seg demo; its per-iteration scalars and the seconds taken."""
    data = osp.join(out, 'data', 'seg')
    num_train, num_val = plan['images']
    run_step('synthetic data', [sys.executable, '-m', 'demo.datasets.synthetic_seg', '--root',
                                data, '--num-train', str(num_train), '--num-val', str(num_val),
                                '--overwrite'], osp.join(out, 'data.log'))
    work_dir = osp.join(out, 'train')
    iters = plan['iters']
    cmd = [sys.executable, 'tools/train.py', SEG_CONFIG, '--amp', '--work-dir', work_dir,
           '--cfg-options', f'train_cfg.max_iters={iters}',
           f'default_hooks.checkpoint.interval={iters}', 'default_hooks.logger.interval=1',
           f'train_dataloader.dataset.data_root={data}',
           f'test_dataloader.dataset.data_root={data}']
    seconds = run_step('seg demo training (AMP)', cmd, osp.join(out, 'train.log'))
    scalars = sorted(
        osp.join(dirpath, name) for dirpath, _, names in os.walk(work_dir) for name in names
        if name == 'scalars.json')
    if not scalars:
        raise SystemExit(f'[gpu_check] training wrote no scalars.json under {work_dir}')
    with open(scalars[-1]) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if len(records) != iters:
        raise SystemExit(f'[gpu_check] training logged {len(records)} iterations, '
                         f'expected {iters} ({scalars[-1]})')
    if not all(math.isfinite(r['loss']) for r in records):
        raise SystemExit(f'[gpu_check] non-finite training loss: {[r["loss"] for r in records]}')
    return records, seconds


def _num(row, key):
    value = row.get(key, '')
    return float(value) if value not in ('', 'None') else None


def _cell(value, digits=1):
    return '–' if value is None else f'{value:.{digits}f}'


def report(device, plan, fp32, amp, records, seconds, zoos):
    """The Markdown report: environment, benchmark table (fp32 | AMP), training table."""
    import mmcv
    import mmdet
    import mmengine
    import mmseg
    if device == 'cuda':
        dev = f'{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})'
    else:
        dev = f'CPU ({os.cpu_count()} cores), dry run'
    amp_kind = 'fp16' if device == 'cuda' else 'bf16'
    lines = [
        f'# GPU check ({time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})', '',
        f'Device: {dev}; Python {platform.python_version()}, torch {torch.__version__}, '
        f'mmcv {mmcv.__version__}, mmengine {mmengine.__version__}, mmdet {mmdet.__version__}, '
        f'mmseg {mmseg.__version__}. Steps: benchmark fp32 {seconds["fp32"]:.0f} s, '
        f'AMP {seconds["amp"]:.0f} s, whole models fp32 {seconds["zoo_fp32"]:.0f} s, AMP '
        f'{seconds["zoo_amp"]:.0f} s, training {seconds["train"]:.0f} s.', '',
        f'## Backbones (dev/benchmark.py, batch 1, median of {plan["repeats"]} runs after '
        f'{plan["warmup"]} warm-up; AMP = {amp_kind} autocast; memory: peak of one inference '
        'forward and of one training step)',
        '',
        '| model | input | params M | fwd ms fp32 | fwd ms AMP | fwd+bwd ms fp32 '
        '| fwd+bwd ms AMP | peak fwd MB fp32 | peak fwd MB AMP | peak train MB fp32 '
        '| peak train MB AMP |',
        '|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    amp_rows = {(r['model'], r['size']): r for r in amp}
    for r in fp32:
        a = amp_rows[(r['model'], r['size'])]
        lines.append(
            f'| {r["model"]} | {r["size"]} | {_cell(_num(r, "params_m"))} '
            f'| {_cell(_num(r, "best_fwd_ms"))} | {_cell(_num(a, "best_fwd_ms"))} '
            f'| {_cell(_num(r, "fwd_bwd_ms"))} | {_cell(_num(a, "fwd_bwd_ms"))} '
            f'| {_cell(_num(r, "mem_mb"))} | {_cell(_num(a, "mem_mb"))} '
            f'| {_cell(_num(r, "train_mem_mb"))} | {_cell(_num(a, "train_mem_mb"))} |')
    sys.path.insert(0, osp.join(ROOT, 'dev'))
    import zoo_chart
    for tag, data in zoos.items():
        lines += ['', f'## Whole models, {tag} (dev/zoo_benchmark.py; accuracies: published)',
                  '', zoo_chart.markdown(data['records'], [data['settings']])]
    times = [r['time'] for r in records[1:]] or [records[0]['time']]
    memory = max((r['memory'] for r in records if 'memory' in r), default=None)
    lines += [
        '', f'## Training ({SEG_CONFIG} through tools/train.py --amp)', '',
        '| iterations | first loss | last loss | s / iter (median, without the first) '
        '| peak memory MB |', '|---|---|---|---|---|',
        f'| {len(records)} | {records[0]["loss"]:.4f} | {records[-1]["loss"]:.4f} '
        f'| {sorted(times)[len(times) // 2]:.3f} | {_cell(memory, 0)} |', '']
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--device', choices=sorted(PLANS), default='cuda')
    p.add_argument('--out', default='work_dirs/gpu_check')
    args = p.parse_args(argv)
    if args.device == 'cuda' and not torch.cuda.is_available():
        p.error('--device cuda: torch.cuda.is_available() is False here; '
                'use --device cpu for the dry run')
    plan = PLANS[args.device]
    out = osp.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    fp32, t_fp32 = benchmark(args.device, plan, out, amp=False)
    amp, t_amp = benchmark(args.device, plan, out, amp=True)
    zoo_fp32, t_zoo_fp32 = zoo(args.device, plan, out, amp=False)
    zoo_amp, t_zoo_amp = zoo(args.device, plan, out, amp=True)
    records, t_train = train(plan, out)
    text = report(args.device, plan, fp32, amp, records,
                  dict(fp32=t_fp32, amp=t_amp, train=t_train, zoo_fp32=t_zoo_fp32,
                       zoo_amp=t_zoo_amp), dict(fp32=zoo_fp32, AMP=zoo_amp))
    path = osp.join(out, 'gpu_check.md')
    from paca_mm.fileio import atomic_write
    atomic_write(text, path)
    print(text)
    print(f'[gpu_check] report: {path}')


if __name__ == '__main__':
    main()
