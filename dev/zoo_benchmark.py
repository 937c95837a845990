#!/usr/bin/env python
"""Whole-model speed against published accuracy: PaCa-ViT configs next to the toolboxes' zoo.

For each config (ours, or a toolbox's zoo config written ``mmseg::segformer/....py`` /
``mmdet::swin/....py``, i.e. under that package's ``.mim/configs``), in one process:

* the model is built from the config without weights (random init, SyncBN as BN:
  :func:`paca_mm.visualization.inference.build_model`);
* inference latency (median of ``--rounds``; models and engines round-robin, each timed run
  right after ``--settle`` untimed runs of the same model and engine) in every ``--engine``
  (``eager``, ``compile``, ``onnxruntime``, as in ``dev/benchmark.py``), of
  - segmentors: image -> logits at full size (``paca_mm.deployment.SegmentorExport``:
    normalisation, ``encode_decode``), 512x512 by default;
  - detectors: backbone + neck (``extract_feat``, ``BackboneExport``) in every engine, and
    the whole ``predict`` (RPN, RoI heads, mask pasting, NMS) in eager, 800x1344 by default
    (800x1333 padded to a multiple of 32, as the data preprocessor does). With random weights
    the score threshold would keep almost no box, so ``score_thr`` is set to 0: every image
    gets ``max_per_img`` (100) detections, as a trained model on a busy COCO image;
* peak memory of one eager inference (segmentor logits / detector predict) in a fresh
  process: growth of the peak RSS (CPU), ``max_memory_allocated`` (CUDA);
* parameters and MACs (``mmengine.analysis.get_model_complexity_info`` after
  ``import paca_mm``, which adds the attention handles; detectors: backbone + neck);
* the published accuracy, read from the metafile beside the config (the entry whose
  ``Config`` names it): mIoU for segmentors, box AP (and mask AP) for detectors.

Writes ``--out`` (JSON: settings + one record per model) and the same records as CSV;
``dev/zoo_chart.py`` draws the speed-accuracy chart and the Markdown table from the JSON.

Example::

    python dev/zoo_benchmark.py --task seg --engine eager compile onnxruntime \\
        --out docs/benchmark_latest/zoo_seg.json
"""
import argparse
import csv
import importlib.util
import io
import json
import logging
import os
import os.path as osp
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

DEV = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(DEV)
sys.path[:0] = [DEV, ROOT]
import benchmark as bench  # noqa: E402  (dev/benchmark.py: engines, timing, memory)

PACA = 'configs/{}/{}_pacavit_{}_p2cconv_100_0_{}.py'
SEG = {
    'PaCa-T + PaCa head': PACA.format('paca_head', 'pacahead', 'tiny', '512x512_160k_ade20k'),
    'PaCa-S + PaCa head': PACA.format('paca_head', 'pacahead', 'small', '512x512_160k_ade20k'),
    'PaCa-S + UperNet': PACA.format('upernet', 'upernet', 'small', '512x512_160k_ade20k'),
    'SegFormer MiT-B2': 'mmseg::segformer/segformer_mit-b2_8xb2-160k_ade20k-512x512.py',
    'ConvNeXt-T + UperNet': 'mmseg::convnext/convnext-tiny_upernet_8xb2-amp-160k_ade20k-512x512.py',
    'SegNeXt MSCAN-B': 'mmseg::segnext/segnext_mscan-b_1xb16-adamw-160k_ade20k-512x512.py',
    'Swin-T + UperNet':
        'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py',
}  # mmseg 1.2 ships no PVTv2 ADE20k config (Twins-PCPVT only)
DET = {
    'PaCa-T Mask R-CNN': PACA.format('mask_rcnn', 'mask_rcnn', 'tiny', 'mstrain_480_800_1x_coco'),
    'PaCa-S Mask R-CNN': PACA.format('mask_rcnn', 'mask_rcnn', 'small',
                                     'mstrain_480_800_1x_coco'),
    'Swin-T Mask R-CNN': 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
    'R-50 Mask R-CNN': 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
    'PVTv2-B2 RetinaNet': 'mmdet::pvt/retinanet_pvtv2-b2_fpn_1x_coco.py',  # mmdet: RetinaNet only
}
SIZES = {'seg': (512, 512), 'det': (800, 1344)}
METRICS = {'seg': ('mIoU', ), 'det': ('box AP', 'mask AP')}


def resolve(config):
    """A config path; ``pkg::rel`` is ``rel`` under ``pkg``'s installed ``.mim/configs``."""
    pkg, sep, rel = config.partition('::')
    if not sep:
        path = config if osp.isabs(config) or osp.exists(config) else osp.join(ROOT, config)
    else:
        spec = importlib.util.find_spec(pkg)
        if spec is None:
            raise SystemExit(f'{config}: package {pkg!r} is not installed')
        path = osp.join(spec.submodule_search_locations[0], '.mim', 'configs', rel)
    if not osp.isfile(path):
        raise SystemExit(f'{config}: no such config file ({path})')
    return path


def published(path):
    """{metric: value} of the metafile entry beside ``path`` whose ``Config`` names it."""
    from mmengine.fileio import load
    folder, name = osp.split(path)
    metas = [osp.join(folder, f) for f in ('metafile.yml', 'metafile.yaml')
             if osp.isfile(osp.join(folder, f))]
    if not metas:
        raise ValueError(f'{path}: no metafile.yml/metafile.yaml beside the config')
    for meta in metas:
        for entry in load(meta).get('Models') or []:
            if osp.basename(entry.get('Config', '')) != name:
                continue
            results = entry.get('Results') or []
            metrics = {}
            for res in results if isinstance(results, list) else [results]:
                metrics.update(res.get('Metrics') or {})
            if not metrics:
                raise ValueError(f'{meta}: the entry of {name} has no Results Metrics')
            return {k: float(v) for k, v in metrics.items()}
    raise ValueError(f'{" / ".join(metas)}: no entry whose Config is {name}')


def build(path, device):
    """(model in eval mode, task 'seg' or 'det') from a config, randomly initialised
    (:func:`paca_mm.visualization.inference.build_model`: pretrained weights not loaded,
    SyncBN as BN)."""
    from paca_mm.visualization.inference import build_model, load_config
    cfg = load_config(path)
    scope = cfg.get('default_scope')
    if scope not in ('mmseg', 'mmdet'):
        raise ValueError(f'{path}: default_scope {scope!r}; need an mmseg or mmdet config')
    task = 'seg' if scope == 'mmseg' else 'det'
    if task == 'det':  # keep max_per_img detections whatever the (random) scores
        test_cfg = cfg.model.test_cfg
        for stage in (test_cfg.get('rcnn'), test_cfg):
            if stage is not None and 'score_thr' in stage:
                stage.score_thr = 0.
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # not init_weights()'s log line per parameter
    try:
        return build_model(cfg, device=device), task
    finally:
        logger.setLevel(level)


def det_predict(model, shape, device):
    """``img -> model.predict`` of an mmdet detector for one padded image of ``shape``."""
    from mmdet.structures import DetDataSample
    h, w = shape
    meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), batch_input_shape=(h, w),
                scale_factor=(1., 1.))

    def predict(x):
        return model.predict(model.data_preprocessor({'inputs': [x[0]]}, False)['inputs'],
                             [DetDataSample(metainfo=meta)], rescale=True)
    return predict


def runners(model, task, shape, args, folder):
    """{part: {engine: callable}} for one model."""
    from paca_mm.deployment import _with_fixed_size_pools, export_module
    kind = 'segmentor' if task == 'seg' else 'backbone'
    part = 'logits' if task == 'seg' else 'backbone+neck'
    module = export_module(model, kind)
    out = {part: {}}
    for e in args.engine:
        try:
            if e == 'onnxruntime':  # static export: fixed-grid pools written out
                fn = bench.OnnxRuntimeModel(export_module(_with_fixed_size_pools(model), kind),
                                            (1, 3) + shape, args.threads, folder,
                                            profile=bool(args.profile))
            else:
                fn = bench.engine_model(e, module, None, args, folder)
            out[part][e] = fn
        except Exception as exc:  # an engine that cannot take a model is a result, not a crash
            out[part][e] = f'{type(exc).__name__}: {str(exc).splitlines()[0][:200]}'
    if task == 'det':
        out['predict'] = {'eager': det_predict(model, shape, args.device)}
    return out


def complexity(model, task, shape, device):
    """(params M of the whole model, GMACs of the timed graph) via mmengine's counter."""
    from mmengine.analysis import get_model_complexity_info

    from paca_mm.deployment import export_module
    params = sum(p.numel() for p in model.parameters()) / 1e6
    module = export_module(model, 'segmentor' if task == 'seg' else 'backbone')
    try:
        info = get_model_complexity_info(module, inputs=(torch.rand(1, 3, *shape, device=device),),
                                         show_table=False, show_arch=False)
        return params, info['flops'] / 1e9
    except Exception as exc:
        print(f'  FLOPs not counted: {type(exc).__name__}: {exc}', flush=True)
        return params, None


def op_profile(fn, x, device, amp, top):
    """Op types of one eager inference by self time (torch.profiler's ``key_averages``):
    {'ms': the self times' sum, 'ops': the ``top`` as [op, self ms, share of ms]}."""
    from torch.profiler import ProfilerActivity, profile
    cuda = device.startswith('cuda')
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                 ) as prof:
        bench.time_forward(fn, x, device, amp)
    attr = 'self_cuda_time_total' if cuda else 'self_cpu_time_total'
    times = {e.key: getattr(e, attr) / 1e3 for e in prof.key_averages()}
    return top_ops(times, sum(times.values()), top)


def ort_op_profile(session, x, top):
    """Op types of one ONNX Runtime inference by time, from the trace of ``session`` (made
    with ``enable_profiling``; ended here): the node events' ``dur`` summed by
    ``args.op_name`` within the last of three runs (two warm up). {'ms': the run's
    time (its ``model_run`` event), 'ops': the ``top`` as [op, ms, share of ms]}."""
    for _ in range(3):
        session.run(None, {'x': x.numpy()})
    path = session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    run = [e for e in events if e.get('cat') == 'Session' and e['name'] == 'model_run'][-1]
    times = {}
    for e in events:
        if e.get('cat') == 'Node' and e['name'].endswith('_kernel_time') and \
                run['ts'] <= e['ts'] <= run['ts'] + run['dur']:
            op = e['args']['op_name']
            times[op] = times.get(op, 0.) + e['dur'] / 1e3
    return top_ops(times, run['dur'] / 1e3, top)


def top_ops(times, total, top):
    """{'ms': total, 'ops': the ``top`` {op: ms} ``times`` as [op, ms, share of total]}."""
    ops = sorted(times.items(), key=lambda kv: kv[1], reverse=True)[:top]
    return dict(ms=total, ops=[[op, ms, ms / (total or 1)] for op, ms in ops])


def memory_worker(path, shape, device, amp):
    """In a fresh process: MB of peak memory growth of one eager inference."""
    torch.set_num_threads(int(os.environ.get('BENCH_THREADS', '2')))
    from paca_mm.deployment import export_module
    model, task = build(path, device)
    fn = det_predict(model, shape, device) if task == 'det' else \
        export_module(model, 'segmentor')
    x = torch.rand(1, 3, *shape, device=device) * 255
    return peak_growth(lambda: bench.time_forward(fn, x, device, amp), device)


def peak_growth(step, device):
    """MB of peak memory growth while ``step()`` runs: ``max_memory_allocated`` on CUDA,
    the peak RSS on the CPU (meaningful in a fresh process)."""
    if device.startswith('cuda'):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    before = bench._peak_rss_mb()
    step()
    return bench._peak_rss_mb() - before


def measure_memory(path, shape, args):
    cmd = [sys.executable, osp.abspath(__file__), '--memory-worker', path, '--size',
           f'{shape[0]}x{shape[1]}', '--device', args.device] + (['--amp'] if args.amp else [])
    res = subprocess.run(cmd, capture_output=True, text=True,
                         env=dict(os.environ, BENCH_THREADS=str(args.threads)))
    if res.returncode:
        print(f'  memory run failed: {res.stderr.strip()[-500:]}', flush=True)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])['mem_mb']


def run(models, args):
    """One record per model: latencies per part and engine, memory, params, MACs, accuracy."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    folder = tempfile.mkdtemp(prefix='paca_zoo_onnx_')
    records, fns = [], {}
    for label, config in models.items():
        path = resolve(config)
        t = time.perf_counter()
        model, task = build(path, args.device)
        shape = args.size or SIZES[task]
        rec = dict(model=label, config=config, task=task, size=f'{shape[0]}x{shape[1]}',
                   published=published(path), ms={}, errors={})
        rec['params_m'], rec['gmacs'] = complexity(model, task, shape, args.device)
        for part, engines in runners(model, task, shape, args, folder).items():
            rec['ms'][part] = {}
            for e, fn in engines.items():
                if isinstance(fn, str):
                    rec['errors'][f'{part} {e}'] = fn
                else:
                    fns[len(records), part, e] = fn
        print(f'{label}: built, counted and exported in {time.perf_counter() - t:.0f} s',
              flush=True)
        records.append(rec)
        rec['_x'] = torch.rand(1, 3, *shape, device=args.device) * 255
        rec['_path'] = path
    times = {k: [] for k in fns}
    for k, fn in list(fns.items()):  # warm-up (compiles); a failing engine is recorded
        rec = records[k[0]]
        t = time.perf_counter()
        try:
            for _ in range(max(1, args.warmup)):
                bench.time_forward(fn, rec['_x'], args.device, args.amp)
        except Exception as exc:
            rec['errors'][f'{k[1]} {k[2]}'] = f'{type(exc).__name__}: ' \
                f'{str(exc).splitlines()[0][:200] if str(exc) else ""}'
            del fns[k], times[k]
            continue
        print(f'{rec["model"]} {k[1]} {k[2]}: warm-up {time.perf_counter() - t:.1f} s',
              flush=True)
    for r in range(args.rounds):  # round-robin over models and engines
        for (i, part, e), fn in fns.items():
            x = records[i]['_x']
            for _ in range(args.settle):
                bench.time_forward(fn, x, args.device, args.amp)
            times[i, part, e].append(bench.time_forward(fn, x, args.device, args.amp,
                                                        args.threads)[0])
        print(f'round {r + 1}/{args.rounds} done', flush=True)
    for (i, part, e), ts in times.items():
        records[i]['ms'][part][e] = 1000 * statistics.median(ts)
        if args.profile and e in ('eager', 'onnxruntime'):
            fn, x = fns[i, part, e], records[i]['_x']
            records[i].setdefault('profile', {}).setdefault(part, {})[e] = \
                op_profile(fn, x, args.device, args.amp, args.profile) if e == 'eager' else \
                ort_op_profile(fn.profiled, x, args.profile)
    for rec in records:
        shape = tuple(int(v) for v in rec['size'].split('x'))
        rec['mem_mb'] = None if args.skip_memory else measure_memory(rec.pop('_path'), shape,
                                                                     args)
        rec.pop('_x')
        rec.pop('_path', None)
        print(f"{rec['model']}: {json.dumps(rec['ms'])}; mem {rec['mem_mb']} MB; "
              f"{rec['params_m']:.1f} M params; {rec['gmacs']} GMACs; {rec['published']}"
              + (f"; errors {rec['errors']}" if rec['errors'] else ''), flush=True)
    shutil.rmtree(folder, ignore_errors=True)  # (the trace of a failed profiled session)
    return records


OFFICIAL_SIZES = ('512:2', '800x1280:1')


def official_pair(path):
    """{'paca_mm': ours, 'official': theirs}: PaCa-Small backbones (ADE20k clusters
    200/200/200/0) from paca_mm and from the official code at ``path`` (iVMCL/PaCaViT, needs
    timm and einops), the official one loaded with our weights (same key layout, strict)."""
    from paca_mm.models.backbones import PaCaViT
    sys.path.insert(0, osp.abspath(path))
    try:
        from models import paca_vit as official
    except ImportError as exc:
        raise SystemExit(f'--official {path}: cannot import models/paca_vit.py ({exc}); it '
                         'needs a checkout of iVMCL/PaCaViT and timm + einops installed')
    ours = PaCaViT(arch='pacavit_small_p2cconv_100_0', num_clusters=(200, 200, 200, 0))
    theirs = official.pacavit_small_p2cconv_100_0_downstream(
        drop_path_rate=0., layer_scale=None, pretrained=None,
        downstream_cluster_num=[200, 200, 200, 0])
    theirs.load_state_dict(ours.state_dict(), strict=True)
    return {'paca_mm': ours.eval(), 'official': theirs.eval()}


def official_worker(path, name, size, device):
    """In a fresh process: MB of peak memory growth of one training step."""
    torch.set_num_threads(int(os.environ.get('BENCH_THREADS', '2')))
    model = official_pair(path)[name].to(device)
    h, w, b = bench.parse_size(size)
    x = torch.randn(b, 3, h, w, device=device)
    return peak_growth(lambda: bench.train_step(model, x, device, False), device)


def run_official(path, args):
    """paca_mm against the official PaCa-Small, same weights: inference forward, training
    step (eager) and training peak memory, at 512x512 batch 2 and 800x1280 batch 1."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    pair = {n: m.to(args.device) for n, m in official_pair(path).items()}
    rows = []
    for size in OFFICIAL_SIZES:
        h, w, b = bench.parse_size(size)
        x = torch.randn(b, 3, h, w, device=args.device)
        with torch.inference_mode():
            outs = [pair[n](x) for n in pair]
        diff = max(float((a - c).abs().max()) for a, c in zip(*outs))
        fwd, step = {n: [] for n in pair}, {n: [] for n in pair}
        for _ in range(args.rounds):  # interleaved
            for n, m in pair.items():
                for _ in range(args.settle):
                    bench.time_forward(m, x, args.device, args.amp)
                fwd[n].append(bench.time_forward(m, x, args.device, args.amp)[0])
                for _ in range(args.settle):
                    bench.time_forward_backward(m, x, args.device, args.amp)
                step[n].append(bench.time_forward_backward(m, x, args.device, args.amp))
        row = dict(size=f'{h}x{w}', batch=b, max_abs_diff=diff)
        for n in pair:
            row[f'{n}_fwd_ms'] = 1000 * statistics.median(fwd[n])
            row[f'{n}_train_step_ms'] = 1000 * statistics.median(step[n])
            res = subprocess.run(
                [sys.executable, osp.abspath(__file__), '--official', path,
                 '--official-worker', n, size, '--device', args.device],
                capture_output=True, text=True, env=dict(os.environ, BENCH_THREADS=str(
                    args.threads)))
            row[f'{n}_train_peak_mb'] = None if res.returncode else json.loads(
                res.stdout.strip().splitlines()[-1])['mem_mb']
        for k in ('fwd_ms', 'train_step_ms', 'train_peak_mb'):
            a, c = row[f'paca_mm_{k}'], row[f'official_{k}']
            row[f'ratio_{k}'] = a / c if a and c else None
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def settings(args):
    dev = torch.cuda.get_device_name(args.device) if args.device.startswith('cuda') else \
        f'CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores), ' \
        f'{args.threads} threads'
    return dict(device=dev, torch=torch.__version__, amp=args.amp, engines=args.engine,
                rounds=args.rounds, settle=args.settle, batch=1,
                compile_backend=args.compile_backend,
                date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()))


def write(records, args):
    from paca_mm.fileio import atomic_write
    text = json.dumps(dict(settings=settings(args), records=records), indent=1)
    atomic_write(text, args.out)
    parts = sorted({(p, e) for r in records for p in r['ms'] for e in r['ms'][p]})
    fields = ['model', 'task', 'size', 'params_m', 'gmacs', 'mem_mb', 'accuracy'] + \
        [f'ms_{p}_{e}' for p, e in parts]
    rows = [dict(model=r['model'], task=r['task'], size=r['size'], params_m=r['params_m'],
                 gmacs=r['gmacs'], mem_mb=r['mem_mb'],
                 accuracy=r['published'][METRICS[r['task']][0]],
                 **{f'ms_{p}_{e}': r['ms'].get(p, {}).get(e) for p, e in parts})
            for r in records]
    csv_path = osp.splitext(args.out)[0] + '.csv'
    table = io.StringIO(newline='')
    writer = csv.DictWriter(table, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(table.getvalue(), csv_path)


def size_arg(s):
    h, w, b = bench.parse_size(bench.size_arg(s))
    if b != 1:
        raise argparse.ArgumentTypeError('batch 1 only')
    return h, w


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('configs', nargs='*',
                   help='config files (pkg::rel for a toolbox zoo config); default: the '
                   '--task zoo (labels in this file)')
    p.add_argument('--task', choices=['seg', 'det', 'all'], default='all')
    p.add_argument('--engine', nargs='+', choices=bench.ENGINES, default=['eager'])
    p.add_argument('--compile-backend', default='inductor')
    p.add_argument('--device', default='cpu')
    p.add_argument('--amp', action='store_true', help='fp16 on CUDA, bf16 on the CPU')
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--settle', type=int, default=1)
    p.add_argument('--size', type=size_arg, default=None,
                   help='HxW for every model (default 512x512 seg, 800x1344 det)')
    p.add_argument('--skip-memory', action='store_true')
    p.add_argument('--profile', type=int, default=0, metavar='TOP',
                   help='also profile one inference per model, part and engine: its TOP op '
                   'types by time (eager: torch.profiler self time; onnxruntime: its '
                   'profiling trace)')
    p.add_argument('--out', default='work_dirs/zoo_benchmark/zoo.json')
    p.add_argument('--official', metavar='PATH',
                   help='instead: paca_mm against the official PaCa-Small at PATH (a checkout '
                   'of iVMCL/PaCaViT; run with a Python that has timm and einops)')
    p.add_argument('--memory-worker', help=argparse.SUPPRESS)
    p.add_argument('--official-worker', nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        p.error(f'--device {args.device}: torch.cuda.is_available() is False here')
    if 'onnxruntime' in args.engine and (args.amp or not args.device.startswith('cpu')):
        p.error('--engine onnxruntime runs the float32 export on the CPU: use --device cpu '
                'without --amp, or drop the engine')
    if args.rounds < 1 or args.settle < 0 or args.warmup < 0:
        p.error('--rounds must be >= 1, --settle and --warmup >= 0')
    if args.memory_worker:
        print(json.dumps({'mem_mb': memory_worker(args.memory_worker, args.size, args.device,
                                                  args.amp)}))
        return None
    if args.official_worker:
        print(json.dumps({'mem_mb': official_worker(args.official, *args.official_worker,
                                                    args.device)}))
        return None
    if args.official:
        rows = run_official(args.official, args)
        from paca_mm.fileio import atomic_write
        atomic_write(json.dumps(dict(settings=settings(args), official=rows), indent=1),
                     args.out)
        print(f'written to {args.out}')
        return rows
    if args.configs:
        models = {osp.splitext(osp.basename(c))[0]: c for c in args.configs}
    else:
        models = dict(**(SEG if args.task in ('seg', 'all') else {}),
                      **(DET if args.task in ('det', 'all') else {}))
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    records = run(models, args)
    write(records, args)
    print(f'written to {args.out} (+ .csv)')
    return records


if __name__ == '__main__':
    main()
