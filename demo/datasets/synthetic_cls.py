"""A small, deterministic ImageFolder-style classification dataset for demos and tests.

Every class is one shape drawn in a class-specific colour, at a random position, size and
small colour jitter, on a dark noisy background::

    0 circle (red)     1 square (green)   2 triangle (blue)   3 cross (yellow)
    4 ring (magenta)   5 bar (cyan)       6 diamond (orange)  7 stripes (white)

(more classes cycle through the shapes with shifted colours). So a small network learns it
in a few hundred iterations, and the learned clusters have something to latch onto.
The layout written under ``root`` is the one mmpretrain's ``CustomDataset`` and
``ImageNet`` read without annotation files::

    root/
      meta.json                    # generator version + arguments (cache key)
      train/class_0/000000.png ...
      val/class_0/000000.png ...

The same arguments give identical files; an existing folder with the same ``meta.json`` is
reused. ``SyntheticClsDataset`` (registered as ``PaCaSyntheticCls`` too) generates the
folder on first use, so demo configs need no download.
"""
import json
import os
import os.path as osp
import shutil
import tempfile
from typing import List

import numpy as np

from .bad_data import BadDataErrorsMixin

GENERATOR_VERSION = 1
SHAPES = ('circle', 'square', 'triangle', 'cross', 'ring', 'bar', 'diamond', 'stripes')
# BGR colours (images are written with cv2)
_COLOURS = ((40, 40, 230), (40, 200, 40), (230, 60, 40), (40, 220, 230), (220, 40, 220),
            (220, 220, 40), (30, 140, 250), (235, 235, 235))


def class_names(num_classes: int) -> List[str]:
    """Folder / class names ``class_0 .. class_{K-1}`` (sorted order = label order)."""
    width = len(str(num_classes - 1))
    return [f'class_{k:0{width}d}' for k in range(num_classes)]


def _draw(img: np.ndarray, label: int, rng: np.random.Generator):
    """Draw the shape of class ``label`` in place on (S, S, 3) uint8 ``img``."""
    import cv2
    s = img.shape[0]
    shape = SHAPES[label % len(SHAPES)]
    shift = 50 * (label // len(SHAPES))
    colour = np.clip(np.array(_COLOURS[label % len(_COLOURS)]) - shift +
                     rng.integers(-25, 26, size=3), 0, 255)
    colour = tuple(int(c) for c in colour)
    r = int(rng.uniform(0.18, 0.32) * s)
    cx, cy = (int(v) for v in rng.integers(r, s - r, size=2))
    t = max(1, s // 16)
    if shape == 'circle':
        cv2.circle(img, (cx, cy), r, colour, -1)
    elif shape == 'square':
        cv2.rectangle(img, (cx - r, cy - r), (cx + r, cy + r), colour, -1)
    elif shape == 'triangle':
        pts = np.array([[cx, cy - r], [cx - r, cy + r], [cx + r, cy + r]], np.int32)
        cv2.fillPoly(img, [pts], colour)
    elif shape == 'cross':
        cv2.rectangle(img, (cx - r, cy - t), (cx + r, cy + t), colour, -1)
        cv2.rectangle(img, (cx - t, cy - r), (cx + t, cy + r), colour, -1)
    elif shape == 'ring':
        cv2.circle(img, (cx, cy), r, colour, t + 1)
    elif shape == 'bar':
        cv2.rectangle(img, (cx - r, cy - t), (cx + r, cy + t), colour, -1)
    elif shape == 'diamond':
        pts = np.array([[cx, cy - r], [cx + r, cy], [cx, cy + r], [cx - r, cy]], np.int32)
        cv2.fillPoly(img, [pts], colour)
    else:  # stripes over the whole image
        period = int(rng.integers(max(4, s // 8), max(5, s // 4)))
        for x0 in range(int(rng.integers(0, period)), s, period):
            cv2.rectangle(img, (x0, 0), (x0 + max(1, period // 3), s - 1), colour, -1)


def make_image(label: int, img_size: int, rng: np.random.Generator) -> np.ndarray:
    """One (img_size, img_size, 3) uint8 BGR image of class ``label``."""
    noise = rng.normal(0, 12, size=(img_size, img_size, 3))
    base = rng.uniform(20, 70, size=3)
    img = np.clip(base[None, None] + noise, 0, 255).astype(np.uint8)
    _draw(img, label, rng)
    return img


def generate_synthetic_cls(root: str, num_classes: int = 4, train_per_class: int = 16,
                           val_per_class: int = 4, img_size: int = 64, seed: int = 0) -> str:
    """Write the dataset under ``root`` (see module docstring) unless it is already there.

    Returns ``root``. Writing goes to a temporary sibling folder that is renamed at the end,
    so an interrupted run never leaves a half-written dataset behind.
    """
    import cv2
    if num_classes < 2:
        raise ValueError(f'num_classes must be >= 2, got {num_classes}')
    if min(train_per_class, val_per_class) < 1 or img_size < 16:
        raise ValueError('train_per_class and val_per_class must be >= 1 and img_size >= 16, '
                         f'got {train_per_class}, {val_per_class}, {img_size}')
    meta = dict(version=GENERATOR_VERSION, num_classes=num_classes,
                train_per_class=train_per_class, val_per_class=val_per_class,
                img_size=img_size, seed=seed)
    meta_file = osp.join(root, 'meta.json')
    if osp.isfile(meta_file):
        with open(meta_file) as f:
            if json.load(f) == meta:
                return root
        raise FileExistsError(
            f'{root!r} holds a synthetic dataset generated with other arguments '
            f'({meta_file}); delete it or choose another data_root')
    if osp.exists(root) and os.listdir(root):
        raise FileExistsError(f'{root!r} exists and is not a synthetic classification dataset')

    parent = osp.dirname(osp.abspath(root))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix='.tmp_synthetic_cls_')
    try:
        names = class_names(num_classes)
        for split, per_class, offset in (('train', train_per_class, 0),
                                         ('val', val_per_class, 1)):
            rng = np.random.default_rng([seed, offset])
            for label, name in enumerate(names):
                folder = osp.join(tmp, split, name)
                os.makedirs(folder)
                for i in range(per_class):
                    img = make_image(label, img_size, rng)
                    if not cv2.imwrite(osp.join(folder, f'{i:06d}.png'), img):
                        raise OSError(f'cv2.imwrite failed in {folder}')
        with open(osp.join(tmp, 'meta.json'), 'w') as f:
            json.dump(meta, f, indent=1)
        if osp.isdir(root):  # an empty folder
            os.rmdir(root)
        try:
            os.rename(tmp, root)
        except OSError:
            # another process finished first: keep its copy if it is the same dataset
            if not osp.isfile(meta_file):
                raise
    finally:
        if osp.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return root


try:
    from mmpretrain.datasets import CustomDataset
except ImportError:  # mmpretrain not installed: only the generator is available
    CustomDataset = None

if CustomDataset is not None:

    class SyntheticClsDataset(BadDataErrorsMixin, CustomDataset):
        """mmpretrain ``CustomDataset`` over :func:`generate_synthetic_cls` output.

        A missing or corrupt image raises an error naming the file and the dataset
        (:mod:`demo.datasets.bad_data`).

        Args:
            data_root: dataset folder; generated there on first use.
            split: 'train' or 'val'.
            num_classes, train_per_class, val_per_class, img_size, seed: generator
                arguments (see :func:`generate_synthetic_cls`).
            **kwargs: passed to ``CustomDataset`` (``pipeline``, ``test_mode`` ...).
        """
        bad_data_hint = ('The generated data under {data_root} is damaged: delete that folder '
                         'and run again (SyntheticClsDataset generates it on first use).')
        class_names = staticmethod(class_names)  # names from num_classes (build_model)

        def __init__(self, data_root: str, split: str = 'train', num_classes: int = 4,
                     train_per_class: int = 16, val_per_class: int = 4, img_size: int = 64,
                     seed: int = 0, **kwargs):
            if split not in ('train', 'val'):
                raise ValueError(f"split must be 'train' or 'val', got {split!r}")
            generate_synthetic_cls(data_root, num_classes, train_per_class, val_per_class,
                                   img_size, seed)
            metainfo = kwargs.pop('metainfo', None) or dict(classes=class_names(num_classes))
            super().__init__(data_root=data_root, data_prefix=split, metainfo=metainfo,
                             **kwargs)
else:  # pragma: no cover
    SyntheticClsDataset = None
