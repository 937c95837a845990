"""Detection demo: PaCa-Tiny Mask R-CNN on synthetic shapes, trained and evaluated on CPU.

``run(work_dir)`` generates the dataset (:mod:`demo.datasets.synthetic_coco`), trains
``demo/configs/mask_rcnn_tiny_synthetic_coco.py`` through ``tools/train.py`` and evaluates the
last checkpoint through ``tools/test.py`` (both as subprocesses, like a user would), then
parses the bbox and segm AP that mmdet's ``CocoMetric`` (pycocotools) reports. With
``baseline=True`` the same evaluation also runs on the untrained (randomly initialised)
detector, for comparison. CLI: ``python -m demo.det --work-dir DIR [--iters N]``.
"""
import argparse
import glob
import json
import os
import os.path as osp
import re
from typing import Dict, Optional, Sequence

from .common import REPO_ROOT, config_iters, run_tool
from .datasets.synthetic_coco import generate_synthetic_coco

DEFAULT_CONFIG = osp.join(REPO_ROOT, 'demo', 'configs', 'mask_rcnn_tiny_synthetic_coco.py')
DEFAULT_DATA_ROOT = osp.join(REPO_ROOT, 'work_dirs', 'demo', 'data', 'det')
# The demo dataset (generate_synthetic_coco arguments): 1-3 large, high-contrast shapes on
# weakly textured backgrounds, sized for the config's 32-64 px anchors on P2/P3.
DEMO_DATA = dict(num_train=200, num_val=24, image_size=(112, 144), max_objects=3,
                 object_size=(28, 72), texture=0.3)
# CocoMetric keys (values in [0, 1]) -> our names (reported in %)
METRIC_KEYS = {f'coco/{t}_mAP{s}': f'{t}_AP{s.replace("_", "")}'
               for t in ('bbox', 'segm') for s in ('', '_50', '_75')}
# pycocotools' summary line of COCOeval.summarize() for AP@[.5:.95], all areas
_AP_LINE = re.compile(r'Average Precision\s+\(AP\) @\[ IoU=0\.50:0\.95 \| area=\s*all \| '
                      r'maxDets=\s*\d+ \] = (-?[0-9.]+)')


def parse_test_metrics(test_dir: str, log_path: Optional[str] = None) -> Dict[str, float]:
    """bbox/segm AP, AP50, AP75 (in %) of the newest test run under ``test_dir``.

    Reads the metrics JSON mmengine dumps (``<ts>/<ts>.json``, CocoMetric's ``coco/*``
    keys) and cross-checks AP against pycocotools' printed summary in the tool's log.
    """
    jsons = sorted(p for p in glob.glob(osp.join(test_dir, '*', '*.json'))
                   if osp.basename(p)[:-5] == osp.basename(osp.dirname(p)))
    if not jsons:
        raise RuntimeError(f'no test metrics JSON found under {test_dir}')
    with open(jsons[-1]) as f:
        raw = json.load(f)
    missing = [k for k in METRIC_KEYS if k not in raw]
    if missing:
        raise RuntimeError(f'{jsons[-1]} lacks {missing}: {raw}')
    metrics = {name: 100.0 * float(raw[key]) for key, name in METRIC_KEYS.items()}
    if log_path and osp.isfile(log_path):
        with open(log_path) as f:
            printed = [float(v) for v in _AP_LINE.findall(f.read())]
        # COCOeval prints bbox then segm; CocoMetric rounds to 3 decimals
        if len(printed) >= 2:
            for name, value in zip(('bbox_AP', 'segm_AP'), printed[-2:]):
                if abs(100.0 * value - metrics[name]) > 0.15:
                    raise RuntimeError(f'{name}: metrics JSON says {metrics[name]:.1f}, '
                                       f'pycocotools printed {100 * value:.1f} ({log_path})')
    return metrics


def save_untrained_checkpoint(config: str, path: str, cfg_options: Sequence[str] = (),
                              seed: int = 0) -> str:
    """Build the config's detector with its random init (no training) and save it as a
    Runner-style checkpoint ``{'state_dict': ..., 'meta': ...}``."""
    import torch
    from mmengine.config import Config, DictAction
    from mmengine.registry import init_default_scope

    import paca_mm  # noqa: F401
    from mmdet.registry import MODELS
    cfg = Config.fromfile(config)
    if cfg_options:
        parser = argparse.ArgumentParser()
        parser.add_argument('--o', nargs='+', action=DictAction)
        cfg.merge_from_dict(parser.parse_args(['--o', *cfg_options]).o)
    init_default_scope('mmdet')
    torch.manual_seed(seed)
    model = MODELS.build(cfg.model)
    model.init_weights()
    torch.save({'state_dict': model.state_dict(), 'meta': {'note': 'untrained', 'seed': seed}},
               path)
    return path


def run(work_dir: str = osp.join('work_dirs', 'demo', 'det'), iters: Optional[int] = None,
        data_root: str = DEFAULT_DATA_ROOT, config: str = DEFAULT_CONFIG,
        num_train: Optional[int] = None, num_val: Optional[int] = None,
        data: Optional[Dict] = None, baseline: bool = True, cfg_options: Sequence[str] = (),
        timeout: Optional[float] = None, threads: Optional[int] = None) -> Dict:
    """Generate data, train, evaluate; return metrics (AP in %) and paths.

    Args:
        work_dir: output folder (``train/``, ``test/``, ``test_untrained/`` and tool logs).
        iters: training iterations (default: the config's ``max_iters``).
        data_root: dataset cache (regenerated if missing or made with other arguments).
        config: the demo config.
        num_train / num_val: dataset size (default: ``DEMO_DATA``'s).
        data: other :func:`generate_synthetic_coco` arguments overriding ``DEMO_DATA``.
        baseline: also evaluate the untrained detector (``metrics_untrained``).
        cfg_options: extra ``key=value`` overrides for both tools.
        timeout: seconds allowed per tool run (None = no limit).
        threads: CPU threads per tool run (OMP_NUM_THREADS; None = inherit).

    Returns:
        dict with ``metrics`` (bbox_AP, bbox_AP50, bbox_AP75, segm_AP, ... in %),
        ``metrics_untrained`` (if ``baseline``), ``iters``, timings, and ``paths``
        (config, checkpoint, work_dir, data_root, logs).
    """
    work_dir = osp.abspath(work_dir)
    data_root = osp.abspath(data_root)
    os.makedirs(work_dir, exist_ok=True)
    data_args = dict(DEMO_DATA, **(data or {}))
    if num_train is not None:
        data_args['num_train'] = num_train
    if num_val is not None:
        data_args['num_val'] = num_val
    generate_synthetic_coco(data_root, **data_args)
    root = data_root.rstrip('/') + '/'
    data_opts = [f'train_dataloader.dataset.data_root={root}',
                 f'test_dataloader.dataset.data_root={root}',
                 f'test_evaluator.ann_file={root}annotations/instances_val.json']
    data_opts += list(cfg_options)
    train_opts = list(data_opts)
    if iters is not None:
        if iters < 2:
            raise ValueError(f'iters must be >= 2, got {iters}')
        warmup = max(1, min(20, iters // 10))
        train_opts += [f'train_cfg.max_iters={iters}',
                       f'param_scheduler.0.end={warmup}',
                       f'param_scheduler.1.begin={warmup}',
                       f'param_scheduler.1.end={iters}',
                       f'default_hooks.checkpoint.interval={iters}']
    train_dir = osp.join(work_dir, 'train')
    logs = {k: osp.join(work_dir, f'{k}.log') for k in ('train', 'test', 'test_untrained')}
    train_time = run_tool(['tools/train.py', config, '--work-dir', train_dir,
                            '--cfg-options'] + train_opts, logs['train'], timeout, threads)
    last = osp.join(train_dir, 'last_checkpoint')
    if not osp.isfile(last):
        raise RuntimeError(f'training finished without a checkpoint ({last} missing)')
    with open(last) as f:
        checkpoint = f.read().strip()

    def evaluate(ckpt: str, name: str):
        out_dir = osp.join(work_dir, name)
        secs = run_tool(['tools/test.py', config, ckpt, '--work-dir', out_dir,
                          '--cfg-options'] + data_opts, logs[name], timeout, threads)
        return parse_test_metrics(out_dir, logs[name]), secs

    metrics, test_time = evaluate(checkpoint, 'test')
    result = dict(task='det', metrics=metrics)
    if baseline:
        untrained = save_untrained_checkpoint(
            config, osp.join(work_dir, 'untrained.pth'), data_opts)
        result['metrics_untrained'], _ = evaluate(untrained, 'test_untrained')
    else:
        logs.pop('test_untrained')
    result.update(
        iters=iters if iters is not None else config_iters(config),
        train_time_s=round(train_time, 1),
        test_time_s=round(test_time, 1),
        paths=dict(config=config, checkpoint=checkpoint, work_dir=work_dir,
                   data_root=data_root, **{f'{k}_log': v for k, v in logs.items()}))
    with open(osp.join(work_dir, 'results.json'), 'w') as f:
        json.dump(result, f, indent=1)
    return result


def main():
    parser = argparse.ArgumentParser(description='PaCa Mask R-CNN demo (CPU)')
    parser.add_argument('--work-dir', default=osp.join('work_dirs', 'demo', 'det'))
    parser.add_argument('--iters', type=int, default=None)
    parser.add_argument('--data-root', default=DEFAULT_DATA_ROOT)
    parser.add_argument('--no-baseline', action='store_true',
                        help='skip evaluating the untrained detector')
    args = parser.parse_args()
    result = run(args.work_dir, args.iters, args.data_root, baseline=not args.no_baseline)
    print(json.dumps(result, indent=1))


if __name__ == '__main__':
    main()
