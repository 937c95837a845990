#!/usr/bin/env python
"""Side-by-side backbone benchmark: PaCa-ViT vs mmdet's PVTv2 and Swin, engine by engine.

For every model and input size, in one process and one run (models and engines interleaved,
so machine noise hits all alike):

* inference forward latency in each ``--engine`` (median of repeated runs after warm-up,
  each timed run right after ``--settle`` untimed runs of the same model and engine: the
  first run after another model or engine pays for fresh allocations, PaCa-Small 151
  instead of 115 ms at 224², differently for each model; with several engines at large
  sizes also use ``--malloc-keep``, docs/benchmarks.md):
  ``eager`` (the model as built), ``compile`` (``torch.compile``, inductor with
  freezing; ``--compile-backend`` picks another backend) and ``onnxruntime`` (exported with ``torch.onnx`` at that size, run by ONNX
  Runtime on the CPU); each model's best engine;
* training: forward+backward latency of ``sum(mean(out_i))`` in train mode (eager) and the
  peak memory of one training step;
* peak inference-forward memory (eager); parameters; MACs.

Memory is measured in a fresh subprocess per model and size: the growth of the peak RSS on
the CPU, ``max_memory_allocated`` on CUDA. Every figure is also given as a ratio to PVTv2-B2
within its engine, and a second table divides each PaCa model by each peer, engine by engine
and best engine against best engine, and their training figures and MACs.
Writes CSV + Markdown (+ a PNG plot) to ``--out``.

Example::

    python dev/benchmark.py --models paca_small pvt_v2_b2 swin_t --sizes 224 800x1280 \\
        --engine eager compile onnxruntime
    python dev/benchmark.py --sizes 512:2 800x1280:1 --engine eager   # batch 2 at 512²
"""
import argparse
import contextlib
import csv
import json
import os
import os.path as osp
import resource
import statistics
import subprocess
import sys
import tempfile
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
ENGINES = ('eager', 'compile', 'onnxruntime')
# glibc: serve allocations up to 32 MB (its maximum) from the heap and never return freed
# heap memory to the OS, so re-allocated tensors reuse already-mapped pages.
MALLOC_KEEP = {'MALLOC_MMAP_THRESHOLD_': str(32 << 20), 'MALLOC_TRIM_THRESHOLD_': str(1 << 40),
               'MALLOC_TOP_PAD_': str(1 << 30)}
DEFAULT_SIZES = ['224', '512', '800x1280', '1024']


def parse_size(s):
    """'H', 'HxW' or either with ':B' (batch B, default 1) -> (H, W, B)."""
    size, _, batch = s.lower().partition(':')
    h, _, w = size.partition('x')
    return int(h), int(w or h), int(batch or 1)


def size_arg(s):
    try:
        h, w, b = parse_size(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{s!r} is not a size: use H, HxW, H:B or HxW:B '
                                         '(e.g. 224, 800x1280, 512:2)')
    if min(h, w, b) < 1:
        raise argparse.ArgumentTypeError(f'{s!r}: height, width and batch must be >= 1')
    return s


def is_paca(name):
    return MODELS[name]['type'] == 'PaCaViT'


def build(name, device):
    import paca_mm  # noqa: F401  (registers PaCaViT)
    from mmdet.registry import MODELS as DET_MODELS
    from mmdet.utils import register_all_modules
    from mmengine.registry import DefaultScope
    register_all_modules(init_default_scope=False)
    # In mmdet's scope whatever scope is current (mmpretrain has a SwinTransformer too).
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = DET_MODELS.build(dict(MODELS[name])).to(device)
    model.eval()  # (mmdet's SwinTransformer.train() returns None: don't chain)
    return model


def ort_session(path, threads, profile_prefix=None):
    """An ONNX Runtime CPU session of the model file at ``path``: ``threads`` intra-op threads,
    all graph optimisations on; it writes a profiling trace under ``profile_prefix`` if given."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # no busy-waiting threads after a run: they would take the cores from the model
    # timed next (another model or engine) on a machine with few cores
    opts.add_session_config_entry('session.intra_op.allow_spinning', '0')
    if profile_prefix:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(path, opts, providers=['CPUExecutionProvider'])


class OnnxRuntimeModel:
    """``model`` exported with ``torch.onnx`` for one input shape, run by an
    :func:`ort_session`; with ``profile`` also ``profiled``, a second session of the same
    graph that records a profiling trace (the timed one runs without its overhead)."""

    def __init__(self, model, shape, threads, folder, profile=False):
        from paca_mm.deployment import exporter_kwargs
        path = osp.join(folder, 'model.onnx')
        with torch.no_grad():
            torch.onnx.export(model, (torch.randn(*shape), ), path, input_names=['x'],
                              opset_version=17, **exporter_kwargs())
        self.session = ort_session(path, threads)
        self.profiled = ort_session(path, threads, osp.join(folder, 'ort_profile')) \
            if profile else None
        os.remove(path)

    def __call__(self, x):
        return self.session.run(None, {'x': x.numpy()})


def engine_model(engine, model, shape, args, folder):
    """A callable running ``model`` in ``engine`` (for ``onnxruntime``: at ``shape`` only)."""
    if engine == 'eager':
        return model
    if engine == 'compile':
        # static shapes (one graph per size); inductor freezes the weights into the graph,
        # as in deployment
        if args.compile_backend == 'inductor':
            return torch.compile(model, dynamic=False, options={'freezing': True})
        return torch.compile(model, dynamic=False, backend=args.compile_backend)
    return OnnxRuntimeModel(model, shape, args.threads, folder)


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


def train_step(model, x, device, amp):
    """One training forward+backward of ``sum(mean(out_i))``; gradients are dropped after."""
    model.train()
    try:
        with _autocast(device, amp):
            outs = model(x)
        sum(o.float().mean() for o in outs).backward()
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()  # noqa


def time_forward_backward(model, x, device, amp):
    _sync(device)
    t = time.perf_counter()
    train_step(model, x, device, amp)
    _sync(device)
    return time.perf_counter() - t


def count_flops(model, shape, device):
    """fvcore-style MACs of one forward (attention products included)."""
    from paca_mm.flops import count
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


def memory_worker(name, size, mode, device, amp):
    """Run in a fresh process: peak memory growth in MB of one inference forward
    (``mode='inference'``) or one training forward+backward (``mode='train'``)."""
    torch.set_num_threads(int(os.environ.get('BENCH_THREADS', '2')))
    model = build(name, device)
    h, w, b = parse_size(size)
    x = torch.randn(b, 3, h, w, device=device)

    def step():
        if mode == 'train':
            train_step(model, x, device, amp)
        else:
            with torch.inference_mode(), _autocast(device, amp):
                model(x)

    if device.startswith('cuda'):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    before = _peak_rss_mb()
    step()
    return _peak_rss_mb() - before


def measure_memory(name, size, mode, args):
    cmd = [sys.executable, osp.abspath(__file__), '--memory-worker', name, size, mode,
           '--device', args.device] + (['--amp'] if args.amp else [])
    env = dict(os.environ, BENCH_THREADS=str(args.threads))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        print(f'  {mode} memory run failed for {name} {size}: {res.stderr.strip()[-500:]}')
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])['mem_mb']


def run(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models = {n: build(n, args.device) for n in args.models}
    compiled = {}
    rows = []
    folder = tempfile.mkdtemp(prefix='paca_bench_onnx_')
    for size in args.sizes:
        h, w, b = parse_size(size)
        x = torch.randn(b, 3, h, w, device=args.device)
        runners = {}
        for n, m in models.items():
            for e in args.engine:
                if e == 'compile':  # one compiled module per model, a graph per size
                    if n not in compiled:
                        compiled[n] = engine_model(e, m, x.shape, args, folder)
                    runners[n, e] = compiled[n]
                else:
                    t = time.perf_counter()
                    runners[n, e] = engine_model(e, m, x.shape, args, folder)
                    if e == 'onnxruntime':
                        print(f'{n:>11} {size:>9}: exported to ONNX in '
                              f'{time.perf_counter() - t:.1f} s', flush=True)
        for (n, e), fn in runners.items():  # warm-up (compiles)
            t = time.perf_counter()
            for _ in range(max(1, args.warmup) if e == 'compile' else args.warmup):
                time_forward(fn, x, args.device, args.amp)
            if e == 'compile':
                print(f'{n:>11} {size:>9}: compiled + first forward in '
                      f'{time.perf_counter() - t:.1f} s', flush=True)
        fwd = {k: [] for k in runners}
        faults = {k: [] for k in runners}
        steal = {n: [] for n in models}
        for _ in range(args.repeats):  # interleaved
            for (n, e), fn in runners.items():
                for _ in range(args.settle):  # this engine's steady state (see --settle)
                    time_forward(fn, x, args.device, args.amp)
                t, f, s = time_forward(fn, x, args.device, args.amp, args.threads)
                fwd[n, e].append(t)
                faults[n, e].append(f)
                if s is not None:
                    steal[n].append(s)
        fb = {n: [] for n in models}
        if not args.skip_backward:
            for n, m in models.items():
                time_forward_backward(m, x, args.device, args.amp)
            for _ in range(max(1, args.repeats // 2)):
                for n, m in models.items():
                    for _ in range(args.settle):
                        time_forward_backward(m, x, args.device, args.amp)
                    fb[n].append(time_forward_backward(m, x, args.device, args.amp))
        for n, m in models.items():
            row = dict(model=n, size=f'{h}x{w}', batch=b, pixels=h * w)
            for e in args.engine:
                row[f'fwd_ms_{e}'] = 1000 * statistics.median(fwd[n, e])
            best = min(args.engine, key=lambda e: row[f'fwd_ms_{e}'])
            row.update(best_engine=best, best_fwd_ms=row[f'fwd_ms_{best}'],
                       fwd_faults_k=statistics.median(faults[n, args.engine[0]]) / 1e3,
                       fwd_steal_pct=100 * statistics.median(steal[n]) if steal[n] else None,
                       fwd_bwd_ms=1000 * statistics.median(fb[n]) if fb[n] else None,
                       train_mem_mb=None if args.skip_memory else
                       measure_memory(n, size, 'train', args),
                       mem_mb=None if args.skip_memory else
                       measure_memory(n, size, 'inference', args),
                       params_m=sum(p.numel() for p in m.parameters()) / 1e6, gmacs=None)
            if args.flops:
                macs = count_flops(m, (h, w), args.device)
                row['gmacs'] = None if macs is None else b * macs / 1e9
            rows.append(row)
            print(f"{n:>11} {size:>9}: fwd "
                  + ', '.join(f"{e} {row[f'fwd_ms_{e}']:.1f}" for e in args.engine) + ' ms'
                  + (f" ({row['fwd_steal_pct']:.0f}% stolen)"
                     if row['fwd_steal_pct'] is not None else '')
                  + (f"; fwd+bwd {row['fwd_bwd_ms']:.1f} ms" if row['fwd_bwd_ms'] else '')
                  + (f"; train mem {row['train_mem_mb']:.0f} MB, inference mem "
                     f"{row['mem_mb']:.0f} MB" if row['mem_mb'] is not None and
                     row['train_mem_mb'] is not None else ''), flush=True)
    os.rmdir(folder)
    return rows


def figure_keys(rows):
    return [k for k in rows[0] if k.startswith('fwd_ms_') or k in (
        'best_fwd_ms', 'fwd_bwd_ms', 'train_mem_mb', 'mem_mb', 'params_m', 'gmacs')]


def add_ratios(rows, reference):
    """Each figure divided by ``reference``'s at the same size (so within the same engine)."""
    ref = {r['size']: r for r in rows if r['model'] == reference}
    for key in figure_keys(rows):
        for r in rows:
            base = ref.get(r['size'])
            ok = base and r[key] is not None and base[key]
            r[key + '_ratio'] = r[key] / base[key] if ok else None
    return rows


def pair_ratios(rows, engines):
    """One row per (PaCa model, peer, size): the PaCa model's forward time divided by the
    peer's in each engine, best engine by best engine, and the training figures (fwd+bwd
    time, training peak memory) and MACs divided likewise (None where not measured)."""
    out = []
    by = {(r['model'], r['size']): r for r in rows}
    for r in rows:
        if not is_paca(r['model']):
            continue
        for peer in dict.fromkeys(q['model'] for q in rows if not is_paca(q['model'])):
            q = by.get((peer, r['size']))
            if q is None:
                continue
            pair = dict(model=r['model'], peer=peer, size=r['size'])
            for e in engines:
                pair[e] = r[f'fwd_ms_{e}'] / q[f'fwd_ms_{e}']
            pair['best'] = r['best_fwd_ms'] / q['best_fwd_ms']
            pair['best_engines'] = f"{r['best_engine']} / {q['best_engine']}"
            for key in ('fwd_bwd_ms', 'train_mem_mb', 'gmacs'):
                pair[key] = r[key] / q[key] if r[key] and q[key] else None
            out.append(pair)
    return out


def _fmt(v, ratio):
    if v is None:
        return '–'
    return f'{v:.1f} ({ratio:.2f}×)' if ratio is not None else f'{v:.1f}'


def to_markdown(rows, args):
    engines = list(args.engine)
    head = ('| model | input, batch | ' + ' | '.join(f'fwd ms {e}' for e in engines)
            + ' | best engine | fwd page faults (k) | fwd steal % | fwd+bwd ms '
            '| train peak MB | inference peak MB | params M | GMACs |\n'
            + '|---' * (len(engines) + 10) + '|\n')
    lines = [f"| {r['model']} | {r['size']}, {r['batch']} | "
             + ' | '.join(_fmt(r[f'fwd_ms_{e}'], r[f'fwd_ms_{e}_ratio']) for e in engines)
             + f" | {r['best_engine']} | {r['fwd_faults_k']:.0f} | "
             f"{'–' if r['fwd_steal_pct'] is None else format(r['fwd_steal_pct'], '.0f')} | "
             f"{_fmt(r['fwd_bwd_ms'], r['fwd_bwd_ms_ratio'])} | "
             f"{_fmt(r['train_mem_mb'], r['train_mem_mb_ratio'])} | "
             f"{_fmt(r['mem_mb'], r['mem_mb_ratio'])} | "
             f"{_fmt(r['params_m'], r['params_m_ratio'])} | "
             f"{_fmt(r['gmacs'], r['gmacs_ratio'])} |" for r in rows]
    dev = torch.cuda.get_device_name(args.device) if args.device.startswith('cuda') else \
        f'CPU, {args.threads} threads'
    malloc = 'freed memory kept in the heap (--malloc-keep)' if args.malloc_keep else \
        'default glibc malloc'
    md = (f'Device: {dev}; torch {torch.__version__}; amp={args.amp}; {malloc}; engines: '
          f'{", ".join(engines)}; ratios to {REFERENCE} (same engine) in parentheses; '
          f'median of {args.repeats} interleaved runs (fwd+bwd: {max(1, args.repeats // 2)}), '
          f'each after {args.settle} untimed run(s) of the same model and engine (--settle); '
          f'page faults: {engines[0]} forwards; '
          'fwd steal %: median share of the vCPU time that the hypervisor took during a '
          'forward (/proc/stat; a share s slows that forward by up to 1 / (1 - s)); '
          'fwd+bwd and train peak: eager, train mode.\n\n' + head + '\n'.join(lines) + '\n')
    pairs = pair_ratios(rows, engines)
    if pairs:
        def cell(v):
            return '–' if v is None else f'{v:.2f}'

        md += ('\nEach PaCa model divided by each peer: forward time in the same engine, best '
               'engine against best engine, then training (eager fwd+bwd time, training peak '
               'memory) and MACs:\n\n| model | peer | input | '
               + ' | '.join(engines) + ' | best / best | best engines | fwd+bwd | train peak '
               '| MACs |\n' + '|---' * (len(engines) + 8) + '|\n'
               + '\n'.join(f"| {p['model']} | {p['peer']} | {p['size']} | "
                           + ' | '.join(cell(p[e]) for e in engines)
                           + f" | {cell(p['best'])} | {p['best_engines']} | "
                           + ' | '.join(cell(p[k]) for k in ('fwd_bwd_ms', 'train_mem_mb',
                                                            'gmacs')) + ' |' for p in pairs)
               + '\n')
    return md


def plot(rows, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r['model'] for r in rows):
        rs = sorted((r for r in rows if r['model'] == name), key=lambda r: r['pixels'])
        px = [r['pixels'] / 1e6 for r in rs]
        axes[0].plot(px, [r['best_fwd_ms'] for r in rs], 'o-', label=name)
        if all(r['mem_mb'] is not None for r in rs):
            axes[1].plot(px, [r['mem_mb'] for r in rs], 'o-', label=name)
    axes[0].set(xlabel='megapixels', ylabel='forward latency, best engine (ms)',
                title='latency')
    axes[1].set(xlabel='megapixels', ylabel='peak forward memory (MB)', title='memory')
    for ax in axes:
        ax.grid(alpha=.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--models', nargs='+', default=list(MODELS), choices=list(MODELS))
    p.add_argument('--sizes', nargs='+', default=DEFAULT_SIZES, type=size_arg,
                   help='H, HxW, optionally :B for batch B, e.g. 224 800x1280 512:2')
    p.add_argument('--engine', nargs='+', choices=ENGINES, default=None,
                   help='inference engines to time (default: eager)')
    p.add_argument('--compile-backend', default='inductor',
                   help="torch.compile backend of the compile engine (e.g. 'aot_eager' to "
                   'check the harness quickly; the figures are inductor\'s)')
    p.add_argument('--device', default='cpu')
    p.add_argument('--amp', action='store_true', help='fp16 on CUDA, bf16 on CPU')
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--settle', type=int, default=1,
                   help='untimed forwards (fwd+bwd: training steps) of the same model and '
                   'engine right before each timed one, so that it measures that engine\'s '
                   'steady state, not the switch from the model or engine before it (fresh '
                   'allocations: page faults; cold caches), which cost one model more than '
                   'another (0: time the first run)')
    p.add_argument('--skip-backward', action='store_true')
    p.add_argument('--skip-memory', action='store_true')
    p.add_argument('--flops', action='store_true', help='also count MACs')
    p.add_argument('--malloc-keep', action='store_true',
                   help='re-run under glibc settings that keep freed memory in the heap '
                        '(no page faults when large tensors are re-allocated): shows the '
                        'figures without the allocator cost that default settings impose')
    p.add_argument('--out', default='work_dirs/benchmark')
    p.add_argument('--memory-worker', nargs=3, metavar=('MODEL', 'SIZE', 'MODE'),
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
    args.engine = list(dict.fromkeys(args.engine or ['eager']))
    if args.repeats < 1 or args.settle < 0 or args.warmup < 0:
        p.error(f'--repeats must be >= 1 and --settle, --warmup >= 0 (got {args.repeats}, '
                f'{args.settle}, {args.warmup})')
    if device.type == 'cuda' and 'onnxruntime' in args.engine:
        p.error('--engine onnxruntime: a CPU-only engine (ONNX Runtime on its CPU provider); '
                'with --device cuda use eager and compile')
    if 'onnxruntime' in args.engine and args.amp:
        p.error('--engine onnxruntime runs the float32 export: drop --amp or the engine')
    if 'onnxruntime' in args.engine:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            p.error('--engine onnxruntime needs onnx and onnxruntime: '
                    'pip install -r requirements/deploy.txt (or paca_mm[deploy])')
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
        name, size, mode = args.memory_worker
        mem = memory_worker(name, size, mode, args.device, args.amp)
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
