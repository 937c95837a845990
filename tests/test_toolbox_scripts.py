"""PaCa-ViT through the toolboxes' OWN scripts and APIs, the way OpenMMLab users work.

Nothing of paca_mm's tools/ is used here: the demo configs (whose only link to paca_mm is
``custom_imports=dict(imports=['paca_mm'])``) run through the ``tools/train.py`` and
``tools/test.py`` that the mmseg and mmdet wheels ship under ``<package>/.mim/tools``, through
``mim test`` (openmim finds mmseg's script), and through the toolboxes' Python APIs
(``mmseg.apis.init_model`` / ``inference_model``, ``mmdet.apis.init_detector`` /
``inference_detector``, ``mmpretrain.ImageClassificationInferencer``).

Per toolbox: train 2 iterations on tiny generated data, ``--resume`` to 4 (mmdet: 3), test
the last checkpoint (metric line parsed, predictions dumped), then load that checkpoint
in-process and check the API predicts what the shipped test script predicted. The runs are
shortened with ``--cfg-options`` only (64x64 images, 2 val images, no data workers).
"""
import glob
import importlib
import json
import os
import os.path as osp
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmengine.config import Config

import paca_mm  # noqa: F401

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'demo', 'configs', 'pacahead_tiny_synthetic_seg.py')
DET_CFG = osp.join(ROOT, 'demo', 'configs', 'mask_rcnn_tiny_synthetic_coco.py')
CLS_CFG = osp.join(ROOT, 'demo', 'configs', 'paca_tiny_synthetic_cls.py')
IMG = 64
SEG_CLASSES = ('background', 'disc', 'square', 'triangle')
DET_CLASSES = ('circle', 'square', 'triangle')
SEG_METRICS = ('aAcc', 'mIoU', 'mAcc')
DET_METRICS = tuple(f'coco/{t}_mAP{s}' for t in ('bbox', 'segm')
                    for s in ('', '_50', '_75', '_s', '_m', '_l'))
_NUM = r'-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?'


# ----------------------------------------------------------------------------- helpers
def toolbox_script(package, name):
    """``<package>/.mim/tools/<name>`` of an installed toolbox wheel."""
    mod = importlib.import_module(package)
    path = osp.join(osp.dirname(mod.__file__), '.mim', 'tools', name)
    assert osp.isfile(path), f'{package} ships no tools/{name} (looked at {path})'
    return path


def _env():
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='')
    env['PYTHONPATH'] = os.pathsep.join(
        [ROOT] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    return env


def _run(args, cwd, timeout=300):
    """``python ARGS`` (this interpreter); returns stdout + stderr, fails with its tail."""
    cmd = [sys.executable] + [str(a) for a in args]
    proc = subprocess.run(cmd, cwd=str(cwd), env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=timeout)
    out = proc.stdout
    assert proc.returncode == 0, f'{cmd} failed (exit {proc.returncode}):\n{out[-8000:]}'
    return out


def _fmt(value):
    return value if isinstance(value, str) else repr(value).replace(' ', '')


def _cli(opts):
    """The ``--cfg-options`` of a dict of dotted keys (what ``_cfg`` merges in-process)."""
    return ['--cfg-options'] + [f'{k}={_fmt(v)}' for k, v in opts.items()]


def _cfg(path, opts):
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(dict(opts))
    return cfg


def _pipeline_opts(cfg, split, sizes):
    """Override keys ``{split}_dataloader.dataset.pipeline.<i>.<key>`` by transform type."""
    opts = {}
    for i, t in enumerate(cfg[f'{split}_dataloader'].dataset.pipeline):
        if t['type'] in sizes:
            key, value = sizes[t['type']]
            opts[f'{split}_dataloader.dataset.pipeline.{i}.{key}'] = value
    return opts


def _train_iters(out):
    """[(iter, max_iters, lr)] of the ``Iter(train) [i/N] ... lr: x`` log lines."""
    return [(int(i), int(n), float(lr)) for i, n, lr in re.findall(
        rf'Iter\(train\) \[\s*(\d+)/(\d+)\]\s+base_lr: {_NUM}\s+lr: ({_NUM})', out)]


def _test_metrics(out, num_images):
    """``key: value`` pairs of the last ``Iter(test) [n/n]`` line (the metrics line)."""
    lines = re.findall(rf'Iter\(test\) \[\s*{num_images}/{num_images}\]\s+(.*)', out)
    assert lines, f'no Iter(test) [{num_images}/{num_images}] metrics line:\n{out[-4000:]}'
    return {k: float(v) for k, v in re.findall(rf'(\S+): ({_NUM})(?=\s|$)', lines[-1])}


def _metrics_json(test_dir):
    """The metrics JSON mmengine dumps at the end of a test run: ``<ts>/<ts>.json``."""
    found = [p for p in glob.glob(osp.join(str(test_dir), '*', '*.json'))
             if osp.basename(p)[:-5] == osp.basename(osp.dirname(p))]
    assert len(found) == 1, found
    with open(found[0]) as f:
        return json.load(f)


def _load(path):
    # a file these tests wrote themselves: full unpickling is fine
    try:
        return torch.load(str(path), map_location='cpu', weights_only=False)
    except TypeError:  # torch without the weights_only argument
        return torch.load(str(path), map_location='cpu')


def _assert_weights_loaded(model, ckpt_path):
    state = _load(ckpt_path)['state_dict']
    own = model.state_dict()
    assert set(state) <= set(own), sorted(set(state) - set(own))[:5]
    assert len(state) > 100  # a whole model, not a stray part
    for k, v in state.items():
        assert torch.equal(own[k].cpu(), v), f'{k} differs from {ckpt_path}'


def _check_resume(first, resumed, work, start, stop):
    """``--resume`` of a run that stopped at ``start``: auto-found the last checkpoint,
    continued with iteration ``start + 1`` and the learning-rate schedule where it was."""
    assert re.search(r'Auto resumed from the latest checkpoint \S*'
                     rf'iter_{start}\.pth', resumed), resumed[-4000:]
    assert f'resumed epoch: 0, iter: {start}' in resumed
    before = _train_iters(first)
    after = _train_iters(resumed)
    assert [(i, n) for i, n, _ in before] == [(i, start) for i in range(1, start + 1)]
    assert [(i, n) for i, n, _ in after] == [(i, stop) for i in range(start + 1, stop + 1)]
    # both demo configs warm up linearly over 20 iterations: the resumed run continues the
    # ramp (a fresh scheduler would start again at the first iteration's lr)
    (_, _, lr_a), (_, _, lr_b) = before[-2:]
    assert lr_b > lr_a
    assert after[0][2] == pytest.approx(2 * lr_b - lr_a, rel=2e-3), (before, after)
    assert (work / f'iter_{stop}.pth').is_file()
    with open(str(work / 'last_checkpoint')) as f:
        assert f.read().strip().endswith(f'iter_{stop}.pth')
    meta = _load(work / f'iter_{stop}.pth')['meta']
    assert meta['iter'] == stop


@pytest.fixture
def one_thread():
    """In-process inference with the scripts' thread count (OMP_NUM_THREADS=1), so that it
    reproduces their results."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- mmseg
@pytest.fixture(scope='module')
def seg_setup(tmp_path_factory):
    from demo.datasets.synthetic_seg import generate_synthetic_seg
    base = tmp_path_factory.mktemp('toolbox_seg')
    data = generate_synthetic_seg(str(base / 'data'), num_train=4, num_val=2,
                                  size=(IMG, IMG), seed=0)
    cfg = Config.fromfile(SEG_CFG)
    size = (IMG, IMG)
    opts = {'train_dataloader.dataset.data_root': data,
            'test_dataloader.dataset.data_root': data,
            'model.data_preprocessor.size': size}
    opts.update(_pipeline_opts(cfg, 'train', {'RandomResize': ('scale', size),
                                              'RandomCrop': ('crop_size', size)}))
    opts.update(_pipeline_opts(cfg, 'test', {'Resize': ('scale', size)}))
    assert len(opts) == 6, opts  # the demo config still has the transforms resized here
    for split in ('train', 'test'):
        opts[f'{split}_dataloader.num_workers'] = 0
        opts[f'{split}_dataloader.persistent_workers'] = False
    train_opts = dict(opts, **{'train_dataloader.batch_size': 2,
                               'default_hooks.logger.interval': 1,
                               'default_hooks.checkpoint.interval': 2})
    return dict(base=base, data=data, opts=opts, train_opts=train_opts)


@pytest.fixture(scope='module')
def seg_train(seg_setup):
    base, work = seg_setup['base'], seg_setup['base'] / 'work'
    out = _run([toolbox_script('mmseg', 'train.py'), SEG_CFG, '--work-dir', work]
               + _cli(dict(seg_setup['train_opts'], **{'train_cfg.max_iters': 2})), cwd=base)
    return dict(seg_setup, work=work, train_out=out)


@pytest.fixture(scope='module')
def seg_resumed(seg_train):
    out = _run([toolbox_script('mmseg', 'train.py'), SEG_CFG, '--work-dir', seg_train['work'],
                '--resume'] + _cli(dict(seg_train['train_opts'], **{'train_cfg.max_iters': 4})),
               cwd=seg_train['base'])
    return dict(seg_train, resume_out=out, ckpt=seg_train['work'] / 'iter_4.pth')


@pytest.fixture(scope='module')
def seg_tested(seg_resumed):
    base = seg_resumed['base']
    test_dir, preds = base / 'test', base / 'preds'
    out = _run([toolbox_script('mmseg', 'test.py'), SEG_CFG, seg_resumed['ckpt'],
                '--work-dir', test_dir, '--out', preds] + _cli(seg_resumed['opts']), cwd=base)
    return dict(seg_resumed, test_out=out, test_dir=test_dir, preds=preds)


@pytest.mark.slow
def test_mmseg_train_script(seg_train):
    out, work = seg_train['train_out'], seg_train['work']
    # the config's custom_imports brought PaCaViT + PaCaHead into mmseg's registries
    assert "type='PaCaViT'" in out and "type='PaCaHead'" in out
    iters = _train_iters(out)
    assert [i for i, _, _ in iters] == [1, 2], out[-4000:]
    losses = [float(v) for v in re.findall(rf'Iter\(train\) .* loss: ({_NUM})', out)]
    assert len(losses) == 2 and all(np.isfinite(losses)), losses
    assert (work / 'iter_2.pth').is_file() and not (work / 'iter_4.pth').exists()
    ckpt = _load(work / 'iter_2.pth')
    assert ckpt['meta']['iter'] == 2
    assert tuple(ckpt['meta']['dataset_meta']['classes']) == SEG_CLASSES
    assert any(k.startswith('backbone.') for k in ckpt['state_dict'])


@pytest.mark.slow
def test_mmseg_train_script_resume(seg_train, seg_resumed):
    _check_resume(seg_train['train_out'], seg_resumed['resume_out'], seg_resumed['work'], 2, 4)


@pytest.mark.slow
def test_mmseg_test_script(seg_tested):
    out = seg_tested['test_out']
    assert re.search(r'Load checkpoint from \S*iter_4\.pth', out), out[-4000:]
    metrics = _test_metrics(out, 2)
    for key in SEG_METRICS:
        assert key in metrics, (key, metrics)
        assert 0.0 <= metrics[key] <= 100.0, (key, metrics)
    # the per-class table and the dumped metrics agree with the printed line
    for name in SEG_CLASSES:
        assert re.search(rf'\|\s*{name}\s*\|\s*(?:{_NUM}|nan)\s*\|', out), name
    dumped = _metrics_json(seg_tested['test_dir'])
    for key in SEG_METRICS:
        assert float(dumped[key]) == pytest.approx(metrics[key], abs=1e-3)
    # --out: one prediction map per validation image
    assert sorted(os.listdir(str(seg_tested['preds']))) == ['000000.png', '000001.png']


@pytest.mark.slow
def test_mmseg_apis_load_script_checkpoint(seg_tested, one_thread):
    from PIL import Image

    from mmseg.apis import inference_model, init_model
    opts = dict(seg_tested['opts'])
    opts.update({f'test_pipeline.{k.split(".pipeline.")[1]}': v for k, v in opts.items()
                 if k.startswith('test_dataloader.dataset.pipeline.')})
    cfg = _cfg(SEG_CFG, opts)
    assert cfg.test_pipeline == cfg.test_dataloader.dataset.pipeline
    ckpt = str(seg_tested['ckpt'])
    model = init_model(cfg, ckpt, device='cpu')
    _assert_weights_loaded(model, ckpt)
    assert tuple(model.dataset_meta['classes']) == SEG_CLASSES

    img = osp.join(seg_tested['data'], 'images', 'validation', '000000.png')
    result = inference_model(model, img)
    pred = result.pred_sem_seg.data
    assert tuple(pred.shape) == (1, IMG, IMG)
    assert 0 <= int(pred.min()) and int(pred.max()) < len(SEG_CLASSES)
    assert tuple(result.seg_logits.data.shape) == (len(SEG_CLASSES), IMG, IMG)
    # the API predicts what mmseg's tools/test.py --out wrote for this image
    saved = np.asarray(Image.open(str(seg_tested['preds'] / '000000.png')))
    agree = float((saved == pred[0].numpy()).mean())
    assert agree >= 0.99, agree


@pytest.mark.slow
def test_mim_test_finds_mmseg_script(seg_tested):
    pytest.importorskip('mim', reason='openmim is a test extra (requirements/tests.txt)')
    base = seg_tested['base']
    out = _run(['-m', 'mim', 'test', 'mmseg', SEG_CFG, '--checkpoint', seg_tested['ckpt'],
                '--work-dir', base / 'mim_test'] + _cli(seg_tested['opts']), cwd=base)
    script = toolbox_script('mmseg', 'test.py')
    assert re.search(rf'Testing command is .*{re.escape(script)} ', out), out[:3000]
    assert 'Testing finished successfully' in out
    metrics = _test_metrics(out, 2)
    expected = _test_metrics(seg_tested['test_out'], 2)
    for key in SEG_METRICS:
        assert key in metrics, (key, metrics)
        # the same script on the same checkpoint and images: the same numbers
        assert metrics[key] == pytest.approx(expected[key], abs=1e-3), (metrics, expected)


# ----------------------------------------------------------------------------- mmdet
@pytest.fixture(scope='module')
def det_setup(tmp_path_factory):
    from demo.datasets.synthetic_coco import generate_synthetic_coco
    base = tmp_path_factory.mktemp('toolbox_det')
    data = generate_synthetic_coco(str(base / 'data'), num_train=4, num_val=2,
                                   image_size=(IMG, IMG + 16), max_objects=2,
                                   object_size=(20, 40), seed=0)
    root = data['data_root'].rstrip('/') + '/'
    cfg = Config.fromfile(DET_CFG)
    opts = {'train_dataloader.dataset.data_root': root,
            'test_dataloader.dataset.data_root': root,
            'test_evaluator.ann_file': root + data['val_ann'],
            # a barely trained detector: keep every box, so both AP evaluations have input
            'model.test_cfg.rcnn.score_thr': 0.0}
    opts.update(_pipeline_opts(cfg, 'train', {'RandomChoiceResize': ('scales', [(96, IMG)])}))
    opts.update(_pipeline_opts(cfg, 'test', {'Resize': ('scale', (96, IMG))}))
    assert len(opts) == 6, opts
    for split in ('train', 'test'):
        opts[f'{split}_dataloader.num_workers'] = 0
        opts[f'{split}_dataloader.persistent_workers'] = False
    train_opts = dict(opts, **{'default_hooks.logger.interval': 1,
                               'default_hooks.checkpoint.interval': 2})
    return dict(base=base, data=data, opts=opts, train_opts=train_opts)


@pytest.fixture(scope='module')
def det_train(det_setup):
    base, work = det_setup['base'], det_setup['base'] / 'work'
    out = _run([toolbox_script('mmdet', 'train.py'), DET_CFG, '--work-dir', work]
               + _cli(dict(det_setup['train_opts'], **{'train_cfg.max_iters': 2})), cwd=base)
    return dict(det_setup, work=work, train_out=out)


@pytest.fixture(scope='module')
def det_resumed(det_train):
    out = _run([toolbox_script('mmdet', 'train.py'), DET_CFG, '--work-dir', det_train['work'],
                '--resume'] + _cli(dict(det_train['train_opts'], **{'train_cfg.max_iters': 3})),
               cwd=det_train['base'])
    return dict(det_train, resume_out=out, ckpt=det_train['work'] / 'iter_3.pth')


@pytest.fixture(scope='module')
def det_tested(det_resumed):
    base = det_resumed['base']
    test_dir, pkl = base / 'test', base / 'results.pkl'
    out = _run([toolbox_script('mmdet', 'test.py'), DET_CFG, det_resumed['ckpt'],
                '--work-dir', test_dir, '--out', pkl] + _cli(det_resumed['opts']), cwd=base)
    return dict(det_resumed, test_out=out, test_dir=test_dir, pkl=pkl)


@pytest.mark.slow
def test_mmdet_train_script_and_resume(det_train, det_resumed):
    out, work = det_train['train_out'], det_train['work']
    assert "type='PaCaViT'" in out and "type='MaskRCNN'" in out
    losses = re.findall(rf'Iter\(train\) .* loss_rpn_cls: ({_NUM}) .* loss_mask: ({_NUM})', out)
    assert len(losses) == 2 and all(np.isfinite(float(v)) for pair in losses for v in pair)
    ckpt = _load(work / 'iter_2.pth')
    assert ckpt['meta']['iter'] == 2
    assert tuple(ckpt['meta']['dataset_meta']['classes']) == DET_CLASSES
    _check_resume(out, det_resumed['resume_out'], work, 2, 3)


@pytest.mark.slow
def test_mmdet_test_script(det_tested):
    out = det_tested['test_out']
    assert re.search(r'Load checkpoint from \S*iter_3\.pth', out), out[-4000:]
    metrics = _test_metrics(out, 2)
    for key in DET_METRICS:
        assert key in metrics, (key, metrics)
        assert -1.0 <= metrics[key] <= 1.0, (key, metrics)
    for key in ('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP', 'coco/segm_mAP_50'):
        assert 0.0 <= metrics[key] <= 1.0, (key, metrics)  # -1 = nothing evaluated
    # pycocotools' summaries, bbox then segm, match the metrics line
    for kind in ('bbox', 'segm'):
        m = re.search(rf'{kind}_mAP_copypaste: ({_NUM}) ({_NUM}) ({_NUM})', out)
        assert m, kind
        assert [float(v) for v in m.groups()] == pytest.approx(
            [metrics[f'coco/{kind}_mAP{s}'] for s in ('', '_50', '_75')], abs=1e-3)
    dumped = _metrics_json(det_tested['test_dir'])
    for key in DET_METRICS:
        assert float(dumped[key]) == pytest.approx(metrics[key], abs=1e-3)
    with open(str(det_tested['pkl']), 'rb') as f:
        results = pickle.load(f)
    assert len(results) == 2
    assert all(len(r['pred_instances']['scores']) > 0 for r in results)


@pytest.mark.slow
def test_mmdet_apis_load_script_checkpoint(det_tested, one_thread):
    import cv2

    from mmdet.apis import inference_detector, init_detector
    cfg = _cfg(DET_CFG, det_tested['opts'])
    ckpt = str(det_tested['ckpt'])
    model = init_detector(cfg, ckpt, device='cpu')
    _assert_weights_loaded(model, ckpt)
    assert tuple(model.dataset_meta['classes']) == DET_CLASSES

    with open(str(det_tested['pkl']), 'rb') as f:
        saved = {osp.basename(r['img_path']): r['pred_instances'] for r in pickle.load(f)}
    name = sorted(saved)[0]
    img = osp.join(det_tested['data']['data_root'], det_tested['data']['val_img'], name)
    h, w = (int(v) for v in cv2.imread(img).shape[:2])
    inst = inference_detector(model, img).pred_instances
    n = len(inst)
    assert n > 0
    assert int(inst.labels.max()) < len(DET_CLASSES)
    assert float(inst.bboxes[:, 2].max()) <= w + 1e-3
    assert float(inst.bboxes[:, 3].max()) <= h + 1e-3
    assert tuple(inst.masks.shape) == (n, h, w)
    # the API predicts what mmdet's tools/test.py --out dumped for this image
    ref = saved[name]
    assert len(ref['scores']) == n
    torch.testing.assert_close(inst.scores, torch.as_tensor(ref['scores']), atol=1e-4, rtol=0)
    torch.testing.assert_close(inst.bboxes, torch.as_tensor(ref['bboxes']), atol=0.05, rtol=0)
    assert torch.equal(inst.labels, torch.as_tensor(ref['labels']))


# ----------------------------------------------------------------------------- mmpretrain
def test_mmpretrain_image_classification_inferencer(tmp_path, one_thread):
    """A demo-config checkpoint (random weights, head bias set) through mmpretrain's
    ImageClassificationInferencer: the weights and class names come from the file."""
    import cv2
    from mmengine.dataset import Compose, pseudo_collate
    from mmengine.registry import DefaultScope, init_default_scope

    from mmpretrain import ImageClassificationInferencer, get_model
    from demo.datasets.synthetic_cls import make_image
    classes = ('c0', 'c1', 'c2', 'c3')
    torch.manual_seed(0)
    model = get_model(CLS_CFG, pretrained=False)
    assert type(model.backbone).__name__ == 'PaCaViT'
    with torch.no_grad():  # an unmistakable prediction, only if the weights are loaded
        model.head.fc.bias.copy_(torch.tensor([0., 0., 8., 0.]))
    ckpt = str(tmp_path / 'cls.pth')
    torch.save({'state_dict': model.state_dict(),
                'meta': {'dataset_meta': {'classes': classes}}}, ckpt)
    img = str(tmp_path / 'img.png')
    assert cv2.imwrite(img, make_image(1, IMG, np.random.default_rng(0)))

    # the mmseg/mmdet API tests of this module leave their default scope behind, under
    # which mmpretrain's inferencer looks its transforms up in the wrong registry (a fresh
    # user process has no such scope); a user mixing toolboxes in one process does the same
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        inferencer = ImageClassificationInferencer(CLS_CFG, pretrained=ckpt, device='cpu')
        (result, ) = inferencer(img)
    assert result['pred_label'] == 2 and result['pred_class'] == 'c2'
    scores = np.asarray(result['pred_scores'])
    assert scores.shape == (4, ) and abs(float(scores.sum()) - 1.0) < 1e-5
    assert result['pred_score'] == pytest.approx(float(scores[2]))

    # the saved model on the config's own test pipeline gives the same scores
    init_default_scope('mmpretrain')
    pipeline = Compose(model._config.test_dataloader.dataset.pipeline)
    with torch.no_grad():
        (ref, ) = model.test_step(pseudo_collate([pipeline(dict(img_path=img))]))
    np.testing.assert_allclose(scores, ref.pred_score.numpy(), rtol=1e-4, atol=1e-7)


# ----------------------------------------------------------------------------- mmpretrain
CLS_SIZE = 32


@pytest.fixture(scope='module')
def cls_runs(tmp_path_factory):
    """``mim train mmpretrain`` for one epoch (mim finds mmpretrain's shipped train.py), that
    script's ``--resume`` to two epochs, and its shipped test.py on the last checkpoint."""
    base = tmp_path_factory.mktemp('toolbox_cls')
    work = base / 'work'
    data = str(base / 'data')
    opts = {}
    for split in ('train', 'val', 'test'):
        opts.update({f'{split}_dataloader.dataset.data_root': data,
                     f'{split}_dataloader.dataset.train_per_class': 2,
                     f'{split}_dataloader.dataset.val_per_class': 1,
                     f'{split}_dataloader.dataset.img_size': CLS_SIZE,
                     f'{split}_dataloader.batch_size': 4})
    opts.update({'train_dataloader.dataset.pipeline.1.scale': CLS_SIZE,
                 'default_hooks.logger.interval': 1, 'default_hooks.checkpoint.interval': 1,
                 'train_cfg.val_interval': 10, 'custom_hooks': []})
    first = _run(['-m', 'mim', 'train', 'mmpretrain', CLS_CFG, '--gpus', '0', '--work-dir',
                  work] + _cli(dict(opts, **{'train_cfg.max_epochs': 1})), cwd=base)
    resumed = _run([toolbox_script('mmpretrain', 'train.py'), CLS_CFG, '--work-dir', work,
                    '--resume'] + _cli(dict(opts, **{'train_cfg.max_epochs': 2})), cwd=base)
    tested = _run([toolbox_script('mmpretrain', 'test.py'), CLS_CFG,
                   str(work / 'epoch_2.pth'), '--work-dir', base / 'test'] + _cli(opts),
                  cwd=base)
    return dict(work=work, first=first, resumed=resumed, tested=tested)


def test_mim_train_and_mmpretrain_scripts(cls_runs):
    first, resumed, tested = cls_runs['first'], cls_runs['resumed'], cls_runs['tested']
    assert re.search(r'Training command is .*mmpretrain[/\\]\.mim[/\\]tools[/\\]train\.py',
                     first), first[-3000:]
    assert re.search(r'Epoch\(train\) \[1\]\[2/2\]', first), first[-3000:]
    assert re.search(r'Auto resumed from the latest checkpoint \S*epoch_1\.pth', resumed)
    assert 'resumed epoch: 1' in resumed
    assert re.search(r'Epoch\(train\) \[2\]\[2/2\]', resumed)
    assert not re.search(r'Epoch\(train\) \[1\]', resumed)  # epoch 1 was not run again
    assert 'Load checkpoint from' in tested and 'epoch_2.pth' in tested
    line = re.findall(r'Epoch\(test\) \[1/1\]\s+(.*)', tested)  # by-epoch test log
    assert line, tested[-3000:]
    metrics = {k: float(v) for k, v in re.findall(rf'(\S+): ({_NUM})(?=\s|$)', line[-1])}
    assert set(metrics) >= {'accuracy/top1', 'accuracy/top2'}, metrics
    assert all(0 <= metrics[k] <= 100 for k in ('accuracy/top1', 'accuracy/top2'))
    # 4 val images, 4 classes: accuracies are multiples of 25 %
    assert metrics['accuracy/top1'] % 25 == 0
