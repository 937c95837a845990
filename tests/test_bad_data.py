"""A corrupt or missing file in the demo datasets gives an error that names the file and the
dataset (demo/datasets/bad_data.py), built from the demo configs as a user would.

Before: mmcv raised ``AssertionError: failed to load image: PATH`` or ``FileNotFoundError``
without the dataset, and a corrupt label map ``cannot identify image file <_io.BytesIO ...>``
without any path.
"""
import importlib
import os
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

import paca_mm  # noqa: F401  (registers the demo datasets)
from demo.datasets.bad_data import BadDataError, CorruptDataFileError, MissingDataFileError

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'demo', 'configs')
# kind -> (toolbox scope, demo config, dataset class name)
KINDS = {
    'cls': ('mmpretrain', 'paca_tiny_synthetic_cls.py', 'SyntheticClsDataset'),
    'det': ('mmdet', 'mask_rcnn_tiny_synthetic_coco.py', 'SyntheticCocoDataset'),
    'seg': ('mmseg', 'pacahead_tiny_synthetic_seg.py', 'SyntheticSegDataset'),
}
CLS_ARGS = dict(num_classes=2, train_per_class=2, val_per_class=1, img_size=16, seed=0)


def _generate(kind, root):
    """The tiny demo data under ``root``; returns the files of sample 0 (role -> path)."""
    if kind == 'cls':
        from demo.datasets.synthetic_cls import generate_synthetic_cls
        generate_synthetic_cls(root, **CLS_ARGS)
        return dict(img=osp.join(root, 'train', 'class_0', '000000.png'))
    if kind == 'det':
        from demo.datasets.synthetic_coco import generate_synthetic_coco
        generate_synthetic_coco(root, num_train=2, num_val=1, image_size=(48, 48),
                                object_size=(12, 24))
        return dict(img=osp.join(root, 'train', '000000.png'))
    from demo.datasets.synthetic_seg import generate_synthetic_seg
    generate_synthetic_seg(root, num_train=2, num_val=1, size=(32, 32))
    return dict(img=osp.join(root, 'images', 'training', '000000.png'),
                seg=osp.join(root, 'annotations', 'training', '000000.png'))


def _build(kind, root):
    """The demo config's train dataset over ``root``, built through the toolbox registry."""
    scope, config, _ = KINDS[kind]
    ds_cfg = Config.fromfile(osp.join(DEMO, config)).train_dataloader.dataset
    ds_cfg.data_root = root
    if kind == 'cls':
        ds_cfg.update(CLS_ARGS)
    init_default_scope(scope)
    return importlib.import_module(f'{scope}.registry').DATASETS.build(ds_cfg)


def _check_message(err, kind, path, root):
    msg = str(err)
    assert path in msg, msg
    assert KINDS[kind][2] in msg and repr(root) in msg, msg  # class and data_root
    assert 'delete' in msg, msg  # says what to do
    assert isinstance(err, BadDataError) and err.path == path
    assert err.dataset == KINDS[kind][2]
    if kind == 'det':
        assert 'instances_train.json' in msg  # the ann_file


def _damage(path, how):
    if how == 'corrupt':
        with open(path, 'wb') as f:
            f.write(b'this is not a PNG file')
    else:
        os.remove(path)


@pytest.mark.parametrize('how', ['corrupt', 'missing'])
@pytest.mark.parametrize('kind,role', [('cls', 'img'), ('det', 'img'), ('seg', 'img'),
                                       ('seg', 'seg')])
def test_bad_file_in_a_sample_names_file_and_dataset(tmp_path, kind, role, how):
    """The file goes bad after the dataset was built (e.g. during a long training)."""
    root = str(tmp_path / kind)
    path = _generate(kind, root)[role]
    ds = _build(kind, root)
    assert type(ds).__name__ == KINDS[kind][2]
    info = ds.get_data_info(0)
    assert info['img_path' if role == 'img' else 'seg_map_path'] == path
    ds[0]  # loads fine
    _damage(path, how)
    expected = CorruptDataFileError if how == 'corrupt' else MissingDataFileError
    with pytest.raises(expected) as exc:
        ds[0]
    _check_message(exc.value, kind, path, root)
    assert 'sample 0' in str(exc.value)
    assert exc.value.__cause__ is not None  # the original error is kept
    if how == 'missing':  # still catchable as the original type
        assert isinstance(exc.value, FileNotFoundError)
        assert isinstance(exc.value.__cause__, FileNotFoundError)
        assert 'not found' in str(exc.value)
    else:
        assert isinstance(exc.value, OSError) and 'not a readable image' in str(exc.value)


@pytest.mark.parametrize('kind,role', [('det', 'img'), ('seg', 'seg')])
def test_annotation_pointing_at_missing_file_fails_at_build(tmp_path, kind, role):
    """The annotation file (det) or the image list (seg: its label map) names a file that is
    not there: building the dataset already says so, listing the file."""
    root = str(tmp_path / kind)
    path = _generate(kind, root)[role]
    os.remove(path)
    with pytest.raises(MissingDataFileError) as exc:
        _build(kind, root)
    _check_message(exc.value, kind, path, root)
    assert '1 file(s) that its samples point at do not exist' in str(exc.value)


def test_other_pipeline_errors_are_not_blamed_on_the_data(tmp_path):
    """Only a missing or unreadable file becomes a BadDataError: with good files, a failing
    transform raises its own error, unchanged."""
    root = str(tmp_path / 'seg')
    path = _generate('seg', root)['seg']
    ds = _build('seg', root)

    def broken_transform(results):
        raise KeyError('a bug in a transform')

    pipeline, ds.pipeline = ds.pipeline, broken_transform
    with pytest.raises(KeyError, match='a bug in a transform') as exc:
        ds[0]
    assert not isinstance(exc.value, BadDataError)
    ds.pipeline = pipeline
    _damage(path, 'corrupt')
    with pytest.raises(CorruptDataFileError) as exc:
        ds[0]
    _check_message(exc.value, 'seg', path, root)


def test_train_tool_reports_corrupt_image(tmp_path, load_tool):
    """Through tools/train.py with the seg demo config: the error crosses the DataLoader
    worker process and still names the file and the dataset."""
    root = str(tmp_path / 'seg')
    path = _generate('seg', root)['img']
    _damage(path, 'corrupt')
    opts = [f'train_dataloader.dataset.data_root={root}',
            f'test_dataloader.dataset.data_root={root}',
            'train_dataloader.batch_size=2', 'train_dataloader.num_workers=1',
            'train_cfg.max_iters=2', 'model.backbone.arch=tiny',
            'model.backbone.num_clusters=[4,4,4,0]']
    with pytest.raises(CorruptDataFileError) as exc:
        load_tool('train').main([osp.join(DEMO, KINDS['seg'][1]), '--work-dir',
                            str(tmp_path / 'work'), '--cfg-options'] + opts)
    msg = str(exc.value)
    assert 'DataLoader worker' in msg  # re-raised by torch in the main process
    assert path in msg and 'SyntheticSegDataset' in msg and repr(root) in msg, msg
