"""End to end: the segmentation demo trains PaCa-Tiny + PaCa head on CPU through
tools/train.py, evaluates through tools/test.py, and clearly beats chance."""
import json
import os
import os.path as osp

import numpy as np
import pytest

from demo.datasets.synthetic_seg import CLASSES, generate_synthetic_seg, make_sample
from demo.seg import run


def test_synthetic_seg_is_deterministic(tmp_path):
    a = make_sample(np.random.default_rng([0, 0, 3]), (48, 64))
    b = make_sample(np.random.default_rng([0, 0, 3]), (48, 64))
    assert a[0].shape == (48, 64, 3) and a[1].shape == (48, 64)
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
    root = generate_synthetic_seg(str(tmp_path / 'd'), num_train=3, num_val=2, size=(32, 32))
    for sub in ('images/training', 'annotations/training', 'images/validation',
                'annotations/validation'):
        assert len(os.listdir(osp.join(root, sub))) == (3 if 'training' in sub else 2)
    with open(osp.join(root, 'meta.json')) as f:
        assert json.load(f)['classes'] == list(CLASSES)
    with pytest.raises(ValueError, match='num_train'):
        generate_synthetic_seg(str(tmp_path / 'e'), num_train=0)


# A smaller budget than the demo (128 px, 300 iterations): about 45 s of CPU.
# Measured (1 thread, busy 2-core box, 46 s wall): mIoU 54.2, per class 75.6 / 45.0 / 52.6 /
# 43.6, chance 18.9.
IMG_SIZE, ITERS, NUM_TRAIN, NUM_VAL = 64, 160, 96, 24
MIN_MIOU, MIN_CLASS_IOU = 40.0, 15.0


@pytest.mark.slow
def test_seg_demo_beats_chance(tmp_path):
    result = run(work_dir=str(tmp_path / 'seg'), iters=ITERS,
                 data_root=str(tmp_path / 'data'), num_train=NUM_TRAIN, num_val=NUM_VAL,
                 img_size=IMG_SIZE, timeout=600, threads=1)
    print(json.dumps({k: result[k] for k in ('metrics', 'per_class_iou', 'train_time_s',
                                             'test_time_s')}))
    metrics = result['metrics']
    assert osp.isfile(result['paths']['checkpoint'])
    assert result['iters'] == ITERS
    assert set(result['per_class_iou']) == set(CLASSES)
    # predicting the majority class (background) everywhere gives chance_mIoU (~19%)
    assert metrics['mIoU'] > MIN_MIOU > 2 * metrics['chance_mIoU']
    # every shape class is found, not just the background
    assert min(result['per_class_iou'].values()) > MIN_CLASS_IOU
