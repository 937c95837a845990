"""A small, deterministic semantic-segmentation dataset in the ADE20k folder layout.

Every image is a textured background (a colour gradient with stripes, a checkerboard or
smooth blobs, plus noise) with 2-5 possibly overlapping shapes. A shape's class is given by
its geometry *and* a colour family (hue jittered, brightness varied), so a network has
to use both colour and context:

=====  ============  =======================================
label  class         drawn as
=====  ============  =======================================
0      background    everything not covered by a shape
1      disc          filled circle, reddish
2      square        filled (possibly rotated) square, bluish
3      triangle      filled triangle, greenish
=====  ============  =======================================

Label convention: 0 is a **real class** (background), not "ignored" as in ADE20k's
``reduce_zero_label`` convention, so the data is read by mmseg's plain ``BaseSegDataset``
with ``metainfo=METAINFO`` and ``reduce_zero_label=False`` (see
``demo/configs/pacahead_tiny_synthetic_seg.py``; it uses ``SyntheticSegDataset``, registered
as ``PaCaSyntheticSeg`` too: a ``BaseSegDataset`` whose errors for a missing or corrupt image
or label map name the file and the dataset, see :mod:`.bad_data`). Label PNGs are
single-channel uint8.
Layout (as ADEChallengeData2016)::

    root/
      meta.json                          # generator version + arguments (cache key)
      images/training/000000.png ...     # RGB
      images/validation/000000.png ...
      annotations/training/000000.png ...   # uint8 labels 0..3
      annotations/validation/000000.png ...

The same arguments give byte-identical files; an existing folder with a matching
``meta.json`` is reused. CLI: ``python -m demo.datasets.synthetic_seg --root DIR``.
"""
import argparse
import json
import os
import os.path as osp
import shutil
from typing import Dict, Tuple

import numpy as np
from PIL import Image

from .bad_data import BadDataErrorsMixin

GENERATOR_VERSION = 1
CLASSES = ('background', 'disc', 'square', 'triangle')
PALETTE = [(120, 120, 120), (220, 20, 60), (0, 90, 255), (0, 190, 60)]
# mmseg dataset metainfo: ``dict(type='BaseSegDataset', metainfo=METAINFO, ...)``.
METAINFO = dict(classes=CLASSES, palette=PALETTE)
DEFAULT_ROOT = osp.join('work_dirs', 'demo', 'data', 'seg')
# Base RGB colour of each shape class (labels 1..3).
_SHAPE_RGB = {1: (205, 45, 45), 2: (40, 75, 210), 3: (45, 175, 60)}


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """(H, W, 3) float32 texture: gradient between two muted colours + pattern + noise."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    c0, c1 = rng.uniform(60, 200, size=(2, 3))
    angle = rng.uniform(0, np.pi)
    t = np.cos(angle) * xx + np.sin(angle) * yy
    t = (t - t.min()) / max(float(t.max() - t.min()), 1.0)
    img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    period = rng.uniform(5, 18)
    kind = rng.integers(3)
    if kind == 0:  # stripes
        a = rng.uniform(0, np.pi)
        pattern = np.sin((np.cos(a) * xx + np.sin(a) * yy) * 2 * np.pi / period)
    elif kind == 1:  # checkerboard
        pattern = ((xx // period + yy // period) % 2) * 2 - 1
    else:  # smooth blobs
        pattern = sum(np.sin(xx * rng.uniform(0.05, 0.3) + rng.uniform(0, 6)) *
                      np.cos(yy * rng.uniform(0.05, 0.3) + rng.uniform(0, 6))
                      for _ in range(3)) / 3
    img = img + rng.uniform(10, 35) * pattern[..., None]
    return img


def _shape_mask(rng: np.random.Generator, label: int, h: int, w: int) -> np.ndarray:
    """(H, W) bool mask of one random shape of class ``label``."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32) + 0.5
    s = min(h, w)
    cy, cx = rng.uniform(0.15, 0.85, size=2) * (h, w)
    r = rng.uniform(0.1, 0.24) * s
    if label == 1:
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= r ** 2
    if label == 2:
        a = rng.uniform(0, np.pi / 2)
        u = np.cos(a) * (xx - cx) + np.sin(a) * (yy - cy)
        v = -np.sin(a) * (xx - cx) + np.cos(a) * (yy - cy)
        return (np.abs(u) <= r * 0.85) & (np.abs(v) <= r * 0.85)
    # triangle: vertices on a circle of radius r*1.2, roughly equilateral
    a0 = rng.uniform(0, 2 * np.pi)
    angles = a0 + np.array([0, 2, 4]) * np.pi / 3 + rng.uniform(-0.25, 0.25, size=3)
    px, py = cx + 1.2 * r * np.cos(angles), cy + 1.2 * r * np.sin(angles)
    inside = np.ones((h, w), bool)
    sign = np.sign((px[1] - px[0]) * (py[2] - py[0]) - (py[1] - py[0]) * (px[2] - px[0]))
    for i in range(3):
        j = (i + 1) % 3
        cross = (px[j] - px[i]) * (yy - py[i]) - (py[j] - py[i]) * (xx - px[i])
        inside &= sign * cross >= 0
    return inside


def make_sample(rng: np.random.Generator, size: Tuple[int, int] = (128, 128)):
    """One (image (H, W, 3) uint8 RGB, label (H, W) uint8 in 0..3) pair."""
    h, w = size
    img = _background(rng, h, w)
    label = np.zeros((h, w), np.uint8)
    for _ in range(rng.integers(2, 6)):
        cls = int(rng.integers(1, len(CLASSES)))
        mask = _shape_mask(rng, cls, h, w)
        colour = np.array(_SHAPE_RGB[cls], np.float32) * rng.uniform(0.75, 1.15) \
            + rng.uniform(-20, 20, size=3)
        # a little shading across the shape
        shade = 1 + 0.15 * np.sin(np.arange(w, dtype=np.float32) / rng.uniform(4, 12))
        fill = np.broadcast_to(colour[None, None] * shade[None, :, None], (h, w, 3))
        img[mask] = fill[mask]
        label[mask] = cls
    img = img + rng.normal(0, 5, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8), label


def generate_synthetic_seg(root: str = DEFAULT_ROOT, num_train: int = 160, num_val: int = 40,
                           size: Tuple[int, int] = (128, 128), seed: int = 0,
                           overwrite: bool = False) -> str:
    """Write the dataset under ``root`` (reused if ``meta.json`` matches); return ``root``.

    Args:
        root: output folder. num_train / num_val: number of images per split (>= 1).
        size: (H, W) of every image. seed: base seed (sample i of a split uses its own
            generator seeded from (seed, split, i)). overwrite: regenerate even if cached.
    """
    if num_train < 1 or num_val < 1:
        raise ValueError(f'num_train and num_val must be >= 1, got {num_train}, {num_val}')
    size = (int(size[0]), int(size[1]))
    if min(size) < 16:
        raise ValueError(f'size must be at least 16x16, got {size}')
    meta = dict(generator='paca_mm.synthetic_seg', version=GENERATOR_VERSION,
                num_train=num_train, num_val=num_val, size=list(size), seed=seed,
                classes=list(CLASSES))
    meta_path = osp.join(root, 'meta.json')
    if not overwrite and osp.isfile(meta_path):
        with open(meta_path) as f:
            if json.load(f) == meta:
                return root
    for sub in ('images', 'annotations'):
        shutil.rmtree(osp.join(root, sub), ignore_errors=True)
    for split_id, (split, count) in enumerate((('training', num_train),
                                               ('validation', num_val))):
        img_dir = osp.join(root, 'images', split)
        ann_dir = osp.join(root, 'annotations', split)
        os.makedirs(img_dir, exist_ok=True)
        os.makedirs(ann_dir, exist_ok=True)
        for i in range(count):
            rng = np.random.default_rng([seed, split_id, i])
            img, label = make_sample(rng, size)
            Image.fromarray(img).save(osp.join(img_dir, f'{i:06d}.png'))
            Image.fromarray(label).save(osp.join(ann_dir, f'{i:06d}.png'))
    with open(meta_path, 'w') as f:
        json.dump(meta, f, indent=1)
    return root


def class_frequencies(root: str, split: str = 'validation') -> Dict[str, float]:
    """Pixel fraction of every class in a generated split (for chance-level baselines)."""
    ann_dir = osp.join(root, 'annotations', split)
    counts = np.zeros(len(CLASSES), np.int64)
    for name in sorted(os.listdir(ann_dir)):
        label = np.asarray(Image.open(osp.join(ann_dir, name)))
        counts += np.bincount(label.ravel(), minlength=len(CLASSES))[:len(CLASSES)]
    return {c: float(n) / max(int(counts.sum()), 1) for c, n in zip(CLASSES, counts)}


try:
    from mmseg.datasets import BaseSegDataset
except ImportError:  # mmseg not installed: only the generator is available
    BaseSegDataset = None

if BaseSegDataset is not None:

    class SyntheticSegDataset(BadDataErrorsMixin, BaseSegDataset):
        """mmseg ``BaseSegDataset`` (same arguments) with clear errors for missing or corrupt
        images and label maps: building checks that every sample's files exist, and a sample
        that fails to load names its file (:mod:`demo.datasets.bad_data`)."""
        bad_data_hint = ('If this is generated demo data, delete {data_root} and generate it '
                         'again (python -m demo.seg --data-root {data_root} does); '
                         'otherwise replace or remove the file.')
else:  # pragma: no cover
    SyntheticSegDataset = None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--root', default=DEFAULT_ROOT)
    parser.add_argument('--num-train', type=int, default=160)
    parser.add_argument('--num-val', type=int, default=40)
    parser.add_argument('--size', type=int, nargs=2, default=(128, 128), metavar=('H', 'W'))
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--overwrite', action='store_true')
    args = parser.parse_args()
    root = generate_synthetic_seg(args.root, args.num_train, args.num_val, tuple(args.size),
                                  args.seed, args.overwrite)
    print(root, class_frequencies(root))


if __name__ == '__main__':
    main()
