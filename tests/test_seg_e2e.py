"""End to end: the segmentation demo trains PaCa-Tiny + PaCa head on CPU through
tools/train.py, evaluates through tools/test.py, and clearly beats chance."""
import json
import os
import os.path as osp

import numpy as np
import pytest

from demo.datasets.synthetic_seg import CLASSES, generate_synthetic_seg, make_sample


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


MIN_MIOU, MIN_CLASS_IOU = 40.0, 15.0


@pytest.mark.slow
def test_seg_demo_beats_chance(demo_seg):
    """The session's ``demo_seg`` (a shortened demo, see DEMO_SEG in tests/_fixture_lane.py)."""
    result = demo_seg
    print(json.dumps({k: result[k] for k in ('metrics', 'per_class_iou', 'train_time_s',
                                             'test_time_s')}))
    metrics = result['metrics']
    assert osp.isfile(result['paths']['checkpoint'])
    assert result['iters'] == 160
    assert set(result['per_class_iou']) == set(CLASSES)
    # predicting the majority class (background) everywhere gives chance_mIoU (~19%)
    assert metrics['mIoU'] > MIN_MIOU > 2 * metrics['chance_mIoU']
    # every shape class is found, not just the background
    assert min(result['per_class_iou'].values()) > MIN_CLASS_IOU
