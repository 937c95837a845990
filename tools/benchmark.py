#!/usr/bin/env python
"""Side-by-side backbone benchmark: PaCa-ViT vs mmdet's PVTv2 and Swin.

For every model and input size, in one process and one run (interleaved, so machine noise
hits all models alike): forward latency (median of repeated runs after warm-up),
forward+backward latency, peak forward memory (inference; each measured in a fresh
subprocess as the growth of max RSS on CPU, ``max_memory_allocated`` on CUDA), parameters
and FLOPs (fvcore-style MACs, attention products counted). Prints a table with every figure
as a ratio to PVTv2-B2 and writes CSV + Markdown (+ a PNG plot) to ``--out``.

Example::

    python tools/benchmark.py --models paca_small pvt_v2_b2 swin_t --sizes 800x1280 1024
"""
import argparse
import contextlib
import copy
import csv
import json
import os
import os.path as osp
import resource
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

MODELS = {
    'paca_tiny': dict(type='PaCaViT', arch='tiny'),
    'paca_small': dict(type='PaCaViT', arch='small'),
    'paca_base': dict(type='PaCaViT', arch='base'),
    # mmdet's PVTv2 (B1/B2 settings of the PVTv2 paper) and Swin-T.
    'pvt_v2_b1': dict(type='PyramidVisionTransformerV2', embed_dims=64,
                      num_layers=[2, 2, 2, 2]),
    'pvt_v2_b2': dict(type='PyramidVisionTransformerV2', embed_dims=64,
                      num_layers=[3, 4, 6, 3]),
    'swin_t': dict(type='SwinTransformer', embed_dims=96, depths=[2, 2, 6, 2],
                   num_heads=[3, 6, 12, 24], window_size=7),
}
REFERENCE = 'pvt_v2_b2'
# glibc: serve allocations up to 32 MB (its maximum) from the heap and never return freed
# heap memory to the OS, so re-allocated tensors reuse already-mapped pages.
MALLOC_KEEP = {'MALLOC_MMAP_THRESHOLD_': str(32 << 20), 'MALLOC_TRIM_THRESHOLD_': str(1 << 40),
               'MALLOC_TOP_PAD_': str(1 << 30)}
DEFAULT_SIZES = ['224', '512', '800x1280', '1024']


def parse_size(s):
    h, _, w = s.lower().partition('x')
    return int(h), int(w or h)


def build(name, device):
    import paca_mm  # noqa: F401  (registers PaCaViT)
    from mmdet.registry import MODELS as DET_MODELS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    model = DET_MODELS.build(dict(MODELS[name])).to(device)
    model.eval()  # (mmdet's SwinTransformer.train() returns None: don't chain)
    return model


def for_inference(model, device, fuse, copy_model=True):
    """The model the forward (inference) figures use: on the CPU, with ``fuse``, a PaCa
    model after the CPU inference pass (``paca_mm.fuse_for_cpu_inference``, in place, so
    a copy when the model is also trained for the fwd+bwd figures); else ``model``."""
    from paca_mm import fuse_for_cpu_inference
    from paca_mm.models.backbones import PaCaViT
    if not fuse or torch.device(device).type != 'cpu' or \
            not any(isinstance(m, PaCaViT) for m in model.modules()):
        return model
    return fuse_for_cpu_inference(copy.deepcopy(model) if copy_model else model)


def _sync(device):
    if device.startswith('cuda'):
        torch.cuda.synchronize(device)


def _autocast(device, amp):
    if not amp:
        return contextlib.nullcontext()
    if device.startswith('cuda'):
        return torch.autocast('cuda', dtype=torch.float16)
    return torch.autocast('cpu', dtype=torch.bfloat16)


def _minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _steal_seconds():
    """CPU seconds the hypervisor has taken from this VM's vCPUs (all of them together; the
    'steal' column of /proc/stat), or None where the system does not report it."""
    try:
        with open('/proc/stat') as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf('SC_CLK_TCK')
    except (OSError, IndexError, ValueError):
        return None


def time_forward(model, x, device, amp, threads=1):
    """Seconds of one inference forward; the minor page faults it caused (CPU: every large
    tensor the allocator takes fresh from the OS costs page faults + zeroing); and the share
    of the ``threads`` vCPUs' time the hypervisor stole meanwhile (None if unknown). On a
    shared VM a stolen share of s makes the forward up to 1 / (1 - s) times slower."""
    with torch.inference_mode(), _autocast(device, amp):
        _sync(device)
        faults = _minor_faults()
        steal = _steal_seconds()
        t = time.perf_counter()
        model(x)
        _sync(device)
        t = time.perf_counter() - t
        steal_end = _steal_seconds()
    share = None if steal is None or steal_end is None else min(
        1., (steal_end - steal) / (t * min(threads, os.cpu_count() or 1)))
    return t, _minor_faults() - faults, share


def time_forward_backward(model, x, device, amp):
    model.train()
    try:
        _sync(device)
        t = time.perf_counter()
        with _autocast(device, amp):
            outs = model(x)
        sum(o.float().mean() for o in outs).backward()
        _sync(device)
        return time.perf_counter() - t
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()  # noqa


def count_flops(model, shape, device):
    """fvcore-style MACs of one forward (attention products included)."""
    from paca_mm.utils.flops import count
    return count(model, (torch.randn(1, 3, *shape, device=device), ))['flops']


def _peak_rss_mb():
    """This process's peak RSS. VmHWM belongs to the current address space; ru_maxrss would
    also carry the parent's peak across fork + exec on Linux."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_worker(name, size, device, amp, fuse):
    """Run in a fresh process: peak forward memory growth in MB (inference)."""
    torch.set_num_threads(int(os.environ.get('BENCH_THREADS', '2')))
    model = for_inference(build(name, device), device, fuse, copy_model=False)
    x = torch.randn(1, 3, *parse_size(size), device=device)
    if device.startswith('cuda'):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        with torch.inference_mode(), _autocast(device, amp):
            model(x)
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    before = _peak_rss_mb()
    with torch.inference_mode(), _autocast(device, amp):
        model(x)
    return _peak_rss_mb() - before


def measure_memory(name, size, args):
    cmd = [sys.executable, osp.abspath(__file__), '--memory-worker', name, size,
           '--device', args.device] + (['--amp'] if args.amp else []) + \
        (['--no-fuse'] if args.no_fuse else [])
    env = dict(os.environ, BENCH_THREADS=str(args.threads))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        print(f'  memory run failed for {name} {size}: {res.stderr.strip()[-500:]}')
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])['mem_mb']


def run(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models = {n: build(n, args.device) for n in args.models}
    infer = {n: for_inference(m, args.device, not args.no_fuse) for n, m in models.items()}
    fused = [n for n in models if infer[n] is not models[n]]
    print(f'forward figures with the CPU inference pass: {", ".join(fused) or "none"}'
          + (' (--no-fuse)' if args.no_fuse else ''), flush=True)
    rows = []
    for size in args.sizes:
        shape = parse_size(size)
        x = torch.randn(1, 3, *shape, device=args.device)
        fwd = {n: [] for n in models}
        faults = {n: [] for n in models}
        steal = {n: [] for n in models}
        fb = {n: [] for n in models}
        for n, m in infer.items():  # warm-up
            for _ in range(args.warmup):
                time_forward(m, x, args.device, args.amp)
        for _ in range(args.repeats):  # interleaved
            for n, m in infer.items():
                t, f, s = time_forward(m, x, args.device, args.amp, args.threads)
                fwd[n].append(t)
                faults[n].append(f)
                if s is not None:
                    steal[n].append(s)
        if not args.skip_backward:
            for n, m in models.items():
                time_forward_backward(m, x, args.device, args.amp)
            for _ in range(max(1, args.repeats // 2)):
                for n, m in models.items():
                    fb[n].append(time_forward_backward(m, x, args.device, args.amp))
        for n, m in models.items():
            row = dict(model=n, size=f'{shape[0]}x{shape[1]}', pixels=shape[0] * shape[1],
                       fwd_ms=1000 * statistics.median(fwd[n]),
                       fwd_bwd_ms=1000 * statistics.median(fb[n]) if fb[n] else None,
                       fwd_faults_k=statistics.median(faults[n]) / 1e3,
                       fwd_steal_pct=100 * statistics.median(steal[n]) if steal[n] else None,
                       mem_mb=None if args.skip_memory else measure_memory(n, size, args),
                       params_m=sum(p.numel() for p in m.parameters()) / 1e6,
                       gmacs=None)
            if args.flops:
                macs = count_flops(m, shape, args.device)
                row['gmacs'] = None if macs is None else macs / 1e9
            rows.append(row)
            print(f"{n:>11} {row['size']:>9}: fwd {row['fwd_ms']:8.1f} ms "
                  f"({row['fwd_faults_k']:.0f}k page faults"
                  + (f", {row['fwd_steal_pct']:.0f}% stolen" if row['fwd_steal_pct'] is not None
                     else '') + ')'
                  + (f", fwd+bwd {row['fwd_bwd_ms']:8.1f} ms" if row['fwd_bwd_ms'] else '')
                  + (f", mem {row['mem_mb']:7.1f} MB" if row['mem_mb'] is not None else ''),
                  flush=True)
    return rows


def add_ratios(rows, reference):
    ref = {r['size']: r for r in rows if r['model'] == reference}
    for r in rows:
        base = ref.get(r['size'])
        for key in ('fwd_ms', 'fwd_bwd_ms', 'fwd_faults_k', 'mem_mb', 'params_m', 'gmacs'):
            ok = base and r[key] is not None and base[key]
            r[key + '_ratio'] = r[key] / base[key] if ok else None
    return rows


def _fmt(v, ratio):
    if v is None:
        return '–'
    return f'{v:.1f} ({ratio:.2f}×)' if ratio is not None else f'{v:.1f}'


def to_markdown(rows, args):
    head = ('| model | input | fwd ms | fwd page faults (k) | fwd steal % | fwd+bwd ms '
            '| peak fwd mem MB | params M | GMACs |\n|---|---|---|---|---|---|---|---|---|\n')
    lines = [f"| {r['model']} | {r['size']} | {_fmt(r['fwd_ms'], r['fwd_ms_ratio'])} | "
             f"{r['fwd_faults_k']:.0f} | "
             f"{'–' if r['fwd_steal_pct'] is None else format(r['fwd_steal_pct'], '.0f')} | "
             f"{_fmt(r['fwd_bwd_ms'], r['fwd_bwd_ms_ratio'])} | "
             f"{_fmt(r['mem_mb'], r['mem_mb_ratio'])} | "
             f"{_fmt(r['params_m'], r['params_m_ratio'])} | "
             f"{_fmt(r['gmacs'], r['gmacs_ratio'])} |" for r in rows]
    dev = torch.cuda.get_device_name(args.device) if args.device.startswith('cuda') else \
        f'CPU, {args.threads} threads'
    malloc = 'freed memory kept in the heap (--malloc-keep)' if args.malloc_keep else \
        'default glibc malloc'
    fuse = 'CPU inference pass off (--no-fuse)' if args.no_fuse or \
        not args.device.startswith('cpu') else 'PaCa forwards after the CPU inference pass'
    return (f'Device: {dev}; torch {torch.__version__}; amp={args.amp}; {malloc}; {fuse}; '
            f'ratios to {REFERENCE} in parentheses; batch 1; median of '
            f'{args.repeats} interleaved runs; fwd steal %: median share of the vCPU time '
            'that the hypervisor took during a forward (/proc/stat; a share s slows that forward by up to 1 / (1 - s))'
            '.\n\n' + head + '\n'.join(lines) + '\n')


def plot(rows, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r['model'] for r in rows):
        rs = sorted((r for r in rows if r['model'] == name), key=lambda r: r['pixels'])
        px = [r['pixels'] / 1e6 for r in rs]
        axes[0].plot(px, [r['fwd_ms'] for r in rs], 'o-', label=name)
        if all(r['mem_mb'] is not None for r in rs):
            axes[1].plot(px, [r['mem_mb'] for r in rs], 'o-', label=name)
    axes[0].set(xlabel='megapixels', ylabel='forward latency (ms)', title='latency')
    axes[1].set(xlabel='megapixels', ylabel='peak forward memory (MB)', title='memory')
    for ax in axes:
        ax.grid(alpha=.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--models', nargs='+', default=list(MODELS), choices=list(MODELS))
    p.add_argument('--sizes', nargs='+', default=DEFAULT_SIZES,
                   help='H or HxW, e.g. 224 800x1280')
    p.add_argument('--device', default='cpu')
    p.add_argument('--amp', action='store_true', help='fp16 on CUDA, bf16 on CPU')
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--no-fuse', action='store_true',
                   help='CPU forward figures without the CPU inference pass '
                   '(paca_mm.fuse_for_cpu_inference, applied to PaCa models by default)')
    p.add_argument('--skip-backward', action='store_true')
    p.add_argument('--skip-memory', action='store_true')
    p.add_argument('--flops', action='store_true', help='also count MACs')
    p.add_argument('--malloc-keep', action='store_true',
                   help='re-run under glibc settings that keep freed memory in the heap '
                        '(no page faults when large tensors are re-allocated): shows the '
                        'figures without the allocator cost that default settings impose')
    p.add_argument('--out', default='work_dirs/benchmark')
    p.add_argument('--memory-worker', nargs=2, metavar=('MODEL', 'SIZE'),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        p.error(f'--device {args.device!r} is not a torch device ({e}); use cpu or cuda[:N]')
    if device.type == 'cuda' and not torch.cuda.is_available():
        p.error(f'--device {args.device}: no CUDA device is usable here '
                '(torch.cuda.is_available() is False); run on a GPU machine or use --device cpu')
    if device.type not in ('cpu', 'cuda'):
        p.error(f'--device {args.device}: only cpu and cuda are supported')
    if device.type == 'cuda' and device.index is not None:
        if device.index >= torch.cuda.device_count():
            p.error(f'--device {args.device}: this machine has {torch.cuda.device_count()} CUDA '
                    f'device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}')
        torch.cuda.set_device(device)  # allocations without an explicit index go there too
    if args.malloc_keep and any(os.environ.get(k) != v for k, v in MALLOC_KEEP.items()):
        # glibc reads these once at start-up: re-execute this command with them set
        argv = sys.argv[1:] if argv is None else list(argv)
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, osp.abspath(__file__)] + argv,
                  dict(os.environ, **MALLOC_KEEP))
    if args.memory_worker:
        mem = memory_worker(*args.memory_worker, args.device, args.amp, not args.no_fuse)
        print(json.dumps({'mem_mb': mem}))
        return
    if REFERENCE not in args.models:
        args.models.append(REFERENCE)
    rows = add_ratios(run(args), REFERENCE)
    os.makedirs(args.out, exist_ok=True)
    with open(osp.join(args.out, 'benchmark.csv'), 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    md = to_markdown(rows, args)
    with open(osp.join(args.out, 'benchmark.md'), 'w') as f:
        f.write(md)
    try:
        plot(rows, osp.join(args.out, 'benchmark.png'))
    except Exception as e:  # plotting is optional
        print(f'plot skipped: {e}')
    print('\n' + md)
    print(f'written to {args.out}/benchmark.{{csv,md,png}}')


if __name__ == '__main__':
    main()
