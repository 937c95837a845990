#!/usr/bin/env python
"""`make smoke-demo` (python demo/smoke.py): build PaCa-Tiny, run a 224x224 and an 800x1280
image on the CPU and print output shapes, parameter count and forward time."""
import argparse
import os.path as osp
import sys
import time

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from paca_mm.models.backbones import PaCaViT  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument('--arch', default='tiny')
    p.add_argument('--sizes', nargs='+', default=['224x224', '800x1280'])
    args = p.parse_args()
    model = PaCaViT(arch=args.arch).eval()
    params = sum(p.numel() for p in model.parameters())
    print(f'PaCaViT arch={args.arch}: {params / 1e6:.3f} M parameters, clusters '
          f'{model.num_clusters}, clustering={model.clustering}')
    for size in args.sizes:
        h, w = map(int, size.lower().split('x'))
        x = torch.randn(1, 3, h, w)
        with torch.inference_mode():
            model(x)  # warm-up
            t = time.perf_counter()
            outs = model(x)
            dt = time.perf_counter() - t
        shapes = ', '.join(str(tuple(o.shape)) for o in outs)
        print(f'  input {h}x{w}: {dt * 1000:.0f} ms forward; outputs {shapes}')


if __name__ == '__main__':
    main()
