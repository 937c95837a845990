#!/usr/bin/env python
"""`make demo` (python demo/run.py): train and evaluate PaCa-Tiny on generated data, on the CPU.

1. segmentation: PaCa-Tiny + PaCaHead on a small ADE20k-format dataset -> mIoU (mmseg IoUMetric);
2. detection: PaCa-Tiny Mask R-CNN on a small COCO-format dataset -> bbox/segm AP (pycocotools).

Each part generates its data, trains through tools/train.py and evaluates through
tools/test.py; checkpoints and logs go to ``--work-dir`` (default work_dirs/demo).
"""
import argparse
import os.path as osp
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'demo'))
    p.add_argument('--only', choices=['seg', 'det'], help='run one half only')
    args = p.parse_args()
    from demo import det, seg
    parts = [('segmentation', 'seg', seg), ('detection', 'det', det)]
    results = {}
    for title, key, module in parts:
        if args.only and args.only != key:
            continue
        print(f'\n===== {title} demo =====', flush=True)
        t = time.time()
        results[title] = module.run(osp.join(args.work_dir, key))
        results[title]['minutes'] = (time.time() - t) / 60
    print('\n===== summary =====')
    for title, res in results.items():
        metrics = ', '.join(f'{k} {v:.3f}' if isinstance(v, float) else f'{k} {v}'
                            for k, v in res.get('metrics', {}).items())
        print(f'{title}: {metrics}  ({res["minutes"]:.1f} min)')
        for k, v in res.get('paths', {}).items():
            print(f'    {k}: {v}')


if __name__ == '__main__':
    main()
