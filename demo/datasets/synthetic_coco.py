"""A small, deterministic COCO-format instance-segmentation dataset for demos and tests.

Images are backgrounds (a smooth colour gradient plus, scaled by ``texture``, stripes, a
checkerboard or blobs, plus noise) with a few non-overlapping flat-coloured shapes whose colour
differs clearly from the background under them. Every shape is one instance of one
of three categories:

* ``circle``  - mask stored as uncompressed RLE (``{'size': [H, W], 'counts': [...]}``);
* ``square``  - mask stored as a 4-vertex polygon (axis-aligned or rotated);
* ``triangle`` - mask stored as a 3-vertex polygon.

So both COCO mask encodings go through mmdet's ``LoadAnnotations`` and pycocotools'
``COCOeval``. The layout written under ``root`` is::

    root/
      meta.json                          # generator version + arguments (cache key)
      annotations/instances_train.json   # COCO instances (bbox in xywh, area = mask area)
      annotations/instances_val.json
      train/000000.png ...
      val/000000.png ...

The same arguments always give byte-identical files; an existing folder with matching
``meta.json`` is reused (see :func:`generate_synthetic_coco`). ``SyntheticCocoDataset``
(registered in mmdet as ``PaCaSyntheticCoco`` too) is mmdet's ``CocoDataset`` whose errors
for a missing or corrupt image name the file and the dataset (:mod:`.bad_data`).
"""
import json
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .bad_data import BadDataErrorsMixin

GENERATOR_VERSION = 2
CATEGORIES = ({'id': 1, 'name': 'circle', 'supercategory': 'shape'},
              {'id': 2, 'name': 'square', 'supercategory': 'shape'},
              {'id': 3, 'name': 'triangle', 'supercategory': 'shape'})
CLASSES = tuple(c['name'] for c in CATEGORIES)
# The dataset metainfo for mmdet's CocoDataset (``metainfo=dict(classes=..., palette=...)``).
METAINFO = dict(classes=CLASSES, palette=[(220, 20, 60), (0, 128, 255), (0, 200, 0)])


def _background(rng: np.random.Generator, h: int, w: int, texture: float = 1.0) -> np.ndarray:
    """(H, W, 3) uint8 background: gradient + ``texture`` x (stripes/checkerboard/blobs) +
    noise (std 6 x ``texture``, at least 2)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    c0, c1 = rng.uniform(40, 215, size=(2, 3))
    angle = rng.uniform(0, np.pi)
    t = (np.cos(angle) * xx + np.sin(angle) * yy)
    t = (t - t.min()) / max(float(np.ptp(t)), 1.0)
    img = c0[None, None] * (1 - t[..., None]) + c1[None, None] * t[..., None]
    kind = rng.integers(3)
    period = rng.uniform(6, 20)
    if kind == 0:  # stripes
        a = rng.uniform(0, np.pi)
        pattern = np.sin((np.cos(a) * xx + np.sin(a) * yy) * 2 * np.pi / period)
    elif kind == 1:  # checkerboard
        pattern = ((xx // period + yy // period) % 2) * 2 - 1
    else:  # blobs: a few random low-frequency sinusoids
        pattern = sum(np.sin(xx * rng.uniform(0.05, 0.3) + rng.uniform(0, 6)) *
                      np.cos(yy * rng.uniform(0.05, 0.3) + rng.uniform(0, 6)) for _ in range(3)) / 3
    img = img + texture * rng.uniform(10, 30) * pattern[..., None]
    img = img + rng.normal(0, max(6 * texture, 2.0), size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _polygon_mask(poly: np.ndarray, h: int, w: int) -> np.ndarray:
    """(H, W) bool mask of the pixels whose centre lies inside the polygon (K, 2) (x, y)."""
    yy, xx = np.mgrid[0:h, 0:w]
    px, py = xx + 0.5, yy + 0.5
    inside = np.zeros((h, w), dtype=bool)
    k = len(poly)
    for i in range(k):  # even-odd ray casting
        x0, y0 = poly[i]
        x1, y1 = poly[(i + 1) % k]
        cond = (y0 > py) != (y1 > py)
        with np.errstate(divide='ignore', invalid='ignore'):
            xcross = (x1 - x0) * (py - y0) / (y1 - y0) + x0
        inside ^= cond & (px < xcross)
    return inside


def encode_rle(mask: np.ndarray) -> Dict:
    """COCO uncompressed RLE of an (H, W) bool mask (column-major runs, starting with 0s)."""
    h, w = mask.shape
    flat = mask.T.reshape(-1).astype(np.uint8)  # Fortran order
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    runs = np.diff(bounds).tolist()
    if flat[0] == 1:
        runs = [0] + runs
    return {'size': [int(h), int(w)], 'counts': [int(r) for r in runs]}


def decode_rle(rle: Dict) -> np.ndarray:
    """Inverse of :func:`encode_rle` (uncompressed RLE -> (H, W) bool mask)."""
    h, w = rle['size']
    flat = np.zeros(h * w, dtype=bool)
    pos, val = 0, False
    for r in rle['counts']:
        flat[pos:pos + r] = val
        pos += r
        val = not val
    return flat.reshape(w, h).T


def _sample_shape(rng: np.random.Generator, h: int, w: int, min_size: int,
                  max_size: int) -> Tuple[int, np.ndarray, object]:
    """Returns (category_id, (H, W) bool mask, segmentation in COCO form)."""
    cat = int(rng.integers(1, len(CATEGORIES) + 1))
    size = rng.uniform(min_size, max_size)
    cx = rng.uniform(size / 2, w - size / 2)
    cy = rng.uniform(size / 2, h - size / 2)
    if cat == 1:  # circle, as RLE
        yy, xx = np.mgrid[0:h, 0:w]
        mask = (xx + 0.5 - cx) ** 2 + (yy + 0.5 - cy) ** 2 <= (size / 2) ** 2
        return cat, mask, encode_rle(mask)
    if cat == 2:  # square, possibly rotated, as polygon
        a = rng.uniform(0, np.pi / 2) if rng.random() < 0.5 else 0.
        half = size / 2 / (abs(np.cos(a)) + abs(np.sin(a)))  # stay inside the box `size`
        corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], dtype=np.float64) * half
        rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        poly = corners @ rot.T + [cx, cy]
    else:  # triangle (roughly equilateral, random rotation), as polygon
        a0 = rng.uniform(0, 2 * np.pi)
        angles = a0 + np.array([0, 2 * np.pi / 3, 4 * np.pi / 3]) + rng.uniform(-0.3, 0.3, 3)
        poly = np.stack([cx + size / 2 * np.cos(angles), cy + size / 2 * np.sin(angles)], 1)
    poly = np.clip(poly, 0, [w, h])
    mask = _polygon_mask(poly, h, w)
    return cat, mask, [[round(float(v), 2) for v in poly.reshape(-1)]]


def _make_split(rng: np.random.Generator, num_images: int, img_dir: str, image_size: Tuple,
                max_objects: int, min_size: int, max_size: int, texture: float) -> Dict:
    from PIL import Image
    images, annotations = [], []
    ann_id = 1
    for img_id in range(1, num_images + 1):
        h = int(rng.integers(image_size[0], image_size[1] + 1))
        w = int(rng.integers(image_size[0], image_size[1] + 1))
        img = _background(rng, h, w, texture)
        occupied = np.zeros((h, w), dtype=bool)
        n_obj = int(rng.integers(1, max_objects + 1))
        placed = 0
        for _ in range(n_obj * 10):  # rejection sampling: no overlapping instances
            if placed == n_obj:
                break
            cat, mask, seg = _sample_shape(rng, h, w, min_size, max_size)
            area = int(mask.sum())
            if area < 16 or (occupied & _dilate(mask)).any():
                continue
            occupied |= mask
            # a flat colour far enough from the local background
            bg_mean = img[mask].mean(0)
            color = rng.uniform(0, 255, 3)
            for _ in range(10):
                if np.abs(color - bg_mean).sum() > 150:
                    break
                color = rng.uniform(0, 255, 3)
            shade = color[None] + rng.normal(0, 4, size=(area, 3))
            img[mask] = np.clip(shade, 0, 255).astype(np.uint8)
            ys, xs = np.nonzero(mask)
            x0, y0, x1, y1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
            annotations.append(dict(
                id=ann_id, image_id=img_id, category_id=cat, segmentation=seg, area=area,
                bbox=[int(x0), int(y0), int(x1 - x0), int(y1 - y0)], iscrowd=0))
            ann_id += 1
            placed += 1
        file_name = f'{img_id - 1:06d}.png'
        Image.fromarray(img).save(osp.join(img_dir, file_name))
        images.append(dict(id=img_id, file_name=file_name, height=h, width=w))
    return dict(images=images, annotations=annotations, categories=list(CATEGORIES),
                info=dict(description='paca_mm synthetic shapes', version=GENERATOR_VERSION))


def _dilate(mask: np.ndarray, r: int = 2) -> np.ndarray:
    out = mask.copy()
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            out |= np.roll(np.roll(mask, dy, 0), dx, 1)
    return out


def generate_synthetic_coco(root: str, num_train: int = 64, num_val: int = 16,
                            image_size: Sequence[int] = (96, 144), max_objects: int = 4,
                            object_size: Sequence[int] = (20, 64), seed: int = 0,
                            force: bool = False, texture: float = 1.0) -> Dict[str, str]:
    """Write (or reuse) the synthetic dataset under ``root``.

    Args:
        root: output folder (created). A folder whose ``meta.json`` records the same
            arguments is reused unless ``force``.
        num_train / num_val: number of images per split.
        image_size: (min, max) side length in pixels; H and W are drawn independently.
        max_objects: 1..max_objects instances per image (fewer if they do not fit).
        object_size: (min, max) diameter of a shape in pixels.
        seed: the only source of randomness (train and val use independent streams).
        force: regenerate even if a matching dataset exists.
        texture: background texture / noise amplitude (1 = strong stripes, checkerboards
            and blobs; 0 = a smooth gradient with weak noise).

    Returns:
        dict with ``data_root``, ``train_ann``, ``val_ann`` (relative to data_root),
        ``train_img``, ``val_img`` (prefixes relative to data_root), and ``classes``.
    """
    if num_train < 1 or num_val < 1:
        raise ValueError(f'need at least one image per split, got num_train={num_train}, '
                         f'num_val={num_val}')
    lo, hi = int(image_size[0]), int(image_size[1])
    smin, smax = int(object_size[0]), int(object_size[1])
    if not 0 < lo <= hi:
        raise ValueError(f'image_size must be (min, max) with 0 < min <= max, got {image_size}')
    if not 0 < smin <= smax < lo:
        raise ValueError(f'object_size {object_size} must satisfy 0 < min <= max < the '
                         f'smallest image side {lo}')
    if not 0 <= texture:
        raise ValueError(f'texture must be >= 0, got {texture}')
    args = dict(version=GENERATOR_VERSION, num_train=num_train, num_val=num_val,
                image_size=[lo, hi], max_objects=max_objects, object_size=[smin, smax],
                seed=seed, texture=float(texture))
    out = dict(data_root=root, train_ann='annotations/instances_train.json',
               val_ann='annotations/instances_val.json', train_img='train/',
               val_img='val/', classes=CLASSES)
    meta_file = osp.join(root, 'meta.json')
    if not force and osp.isfile(meta_file):
        with open(meta_file) as f:
            if json.load(f) == args and all(
                    osp.isfile(osp.join(root, out[k])) for k in ('train_ann', 'val_ann')):
                return out
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    for split, num, stream in (('train', num_train, 0), ('val', num_val, 1)):
        img_dir = osp.join(root, split)
        os.makedirs(img_dir, exist_ok=True)
        rng = np.random.default_rng([seed, stream])
        coco = _make_split(rng, num, img_dir, (lo, hi), max_objects, smin, smax, texture)
        with open(osp.join(root, out[f'{split}_ann']), 'w') as f:
            json.dump(coco, f)
    with open(meta_file, 'w') as f:  # written last: marks a complete dataset
        json.dump(args, f)
    return out


try:
    from mmdet.datasets import CocoDataset
except ImportError:  # mmdet not installed: only the generator is available
    CocoDataset = None

if CocoDataset is not None:

    class SyntheticCocoDataset(BadDataErrorsMixin, CocoDataset):
        """mmdet ``CocoDataset`` (same arguments) with clear errors for missing or corrupt
        images: building checks that the images the annotation file points at exist, and a
        sample that fails to load names its file (:mod:`demo.datasets.bad_data`)."""
        bad_data_hint = ('If this is generated demo data, delete {data_root} and generate it '
                         'again (python -m demo.det --data-root {data_root} does); '
                         'otherwise fix the file or its entry in {ann_file}.')
else:  # pragma: no cover
    SyntheticCocoDataset = None


def main(argv: Optional[List[str]] = None):
    import argparse
    p = argparse.ArgumentParser(description='Write the paca_mm synthetic COCO dataset.')
    p.add_argument('root')
    p.add_argument('--num-train', type=int, default=64)
    p.add_argument('--num-val', type=int, default=16)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--force', action='store_true')
    a = p.parse_args(argv)
    print(generate_synthetic_coco(a.root, a.num_train, a.num_val, seed=a.seed, force=a.force))


if __name__ == '__main__':
    main()
