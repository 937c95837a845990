"""Cluster explainer (paper Sec. 3.3): heatmaps, Eqn. 7 masks, positive/negative groups,
figures, tools/visualize_clusters.py and PaCaClusterVisHook."""
import glob
import json
import os.path as osp

import numpy as np
import pytest
import torch

pytest.importorskip('mmpretrain')
cv2 = pytest.importorskip('cv2')

from mmengine.config import Config  # noqa: E402

import paca_mm  # noqa: E402,F401
from paca_mm.visualization import (analyze_cluster_groups, classify,  # noqa: E402
                                   cluster_heatmaps, cluster_masks, explain_image,
                                   stage_cluster_logits)
from paca_mm.visualization.inference import build_model  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CLS_CFG = osp.join(ROOT, 'demo', 'configs', 'paca_tiny_synthetic_cls.py')
SEG_CFG = osp.join(ROOT, 'demo', 'configs', 'pacahead_tiny_synthetic_seg.py')
M = 16  # clusters per stage of the demo classifier (16, 16, 16, 0)


@pytest.fixture(scope='module')
def classifier():
    torch.manual_seed(0)
    return build_model(CLS_CFG, None)


def _raw(h=64, w=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, h, w), generator=g).float()


def test_class_names_from_the_config_without_a_checkpoint(classifier):
    """No checkpoint meta: the names come from the config's dataset, through the toolbox's
    registry (the demo dataset derives them from num_classes; mmseg's from METAINFO)."""
    assert classifier.dataset_meta == dict(classes=[f'class_{k}' for k in range(4)])


def test_stage_logits_shapes_and_state(classifier):
    backbone = classifier.backbone
    classifier.train()
    for stage, hw in ((1, 16), (2, 8), (3, 4)):
        logits = stage_cluster_logits(classifier, _raw(), stage)
        assert logits.shape == (1, M, hw, hw) and logits.dtype == torch.float32
    # odd sizes follow the ceil rule; a batch works too
    assert stage_cluster_logits(classifier, _raw(50, 70)[None].repeat(2, 1, 1, 1),
                                1).shape == (2, M, 13, 18)
    assert backbone.record_clusters is False and backbone.training  # restored
    classifier.eval()
    with pytest.raises(ValueError, match='no clusters'):
        stage_cluster_logits(classifier, _raw(), 4)
    with pytest.raises(ValueError, match='1-based'):
        stage_cluster_logits(classifier, _raw(), 0)


def test_logits_are_the_assignment_before_softmax(classifier):
    """Softmax over space of the recorded logits is the assignment the next block uses."""
    raw = _raw()
    logits = stage_cluster_logits(classifier, raw, 1)
    attn = classifier.backbone.stage1[0].attn
    from paca_mm.visualization import normalize_inputs
    x = normalize_inputs(classifier, raw[None])
    with torch.no_grad():
        tokens = classifier.backbone.patch_embed(x)
        hw = tokens.shape[2:]
        t = tokens.flatten(2).transpose(1, 2)
        direct = attn.clustering(classifier.backbone.stage1[0].norm1_before(t), hw)
    torch.testing.assert_close(logits.flatten(2), direct.float(), rtol=1e-5, atol=1e-5)


def test_cluster_masks_eqn7():
    logits = torch.tensor([[[0., 1.], [2., 3.]],
                           [[5., 5.], [5., 5.]],
                           [[3., -1.], [-2., -3.]]])
    heat = cluster_heatmaps(logits)
    assert torch.all((heat > 0) & (heat < 1))
    small = cluster_masks(logits)
    assert small.dtype == torch.bool
    assert small.tolist() == [[[False, False], [True, True]],
                              [[False, False], [False, False]],  # constant: nothing > mean
                              [[True, False], [False, False]]]
    up = cluster_masks(logits, size=(4, 6))
    assert up.shape == (3, 4, 6) and up.dtype == torch.bool
    expected = np.repeat(np.repeat(small.numpy(), 2, axis=1), 3, axis=2)
    assert np.array_equal(up.numpy(), expected)
    # batched, random: sigmoid > per-cluster spatial mean of the sigmoid (not of the logits)
    lg = torch.randn(2, 5, 3, 3) * 4
    m = cluster_masks(lg, size=(9, 9))
    s = torch.sigmoid(lg)
    ref = (s > s.mean(dim=(2, 3), keepdim=True)).repeat_interleave(3, 2).repeat_interleave(3, 3)
    assert m.shape == (2, 5, 9, 9) and torch.equal(m, ref)


def test_group_split_consistent_with_predictions(classifier):
    raw = _raw(seed=3)
    probs0 = classify(classifier, raw[None])[0]
    g = analyze_cluster_groups(classifier, raw, stage=2)
    assert g.label == int(probs0.argmax()) and not g.label_given
    assert g.base_prob == pytest.approx(float(probs0[g.label]), abs=1e-6)
    assert sorted(g.positive + g.negative) == list(range(M))
    assert all(int(g.preds[m]) == g.label for m in g.positive)
    assert all(int(g.preds[m]) != g.label for m in g.negative)
    for group in (g.positive, g.negative):
        p = [float(g.probs[m]) for m in group]
        assert p == sorted(p, reverse=True)
    assert g.masks.shape == (M, 64, 64) and g.masks.dtype == torch.bool
    assert torch.equal(g.masks, cluster_masks(g.logits, size=(64, 64)))
    # every masked-image probability is the classifier's on I * M^m
    for m in (0, 7, M - 1):
        pm = classify(classifier, (raw * g.masks[m])[None])[0]
        assert float(g.probs[m]) == pytest.approx(float(pm[g.label]), abs=1e-5)
        assert int(g.preds[m]) == int(pm.argmax())
    # a given label: the positive group is exactly the clusters predicting it
    other = (g.label + 1) % 4
    g2 = analyze_cluster_groups(classifier, raw, stage=2, label=other)
    assert g2.label == other and g2.label_given
    assert set(g2.positive) == {m for m in range(M) if int(g.preds[m]) == other}
    torch.testing.assert_close(g2.probs, classify(
        classifier, raw[None] * g.masks[:, None].float())[:, other])
    with pytest.raises(ValueError, match='out of range'):
        analyze_cluster_groups(classifier, raw, stage=2, label=4)


def test_explainer_defaults_chunks_labels_and_errors(classifier, monkeypatch):
    """Stage 3 by default (the paper's); the stages with clusters named in the error;
    classify() in chunks (the first included) and on the last of a tuple of logits; label 0
    accepted; one (3, H, W) image only; class names only in range."""
    from types import SimpleNamespace

    from paca_mm.visualization import check_stage
    raw = _raw(seed=5)
    assert torch.equal(stage_cluster_logits(classifier, raw),
                       stage_cluster_logits(classifier, raw, 3))
    backbone = classifier.backbone
    assert [check_stage(backbone, s) for s in (1, 2, 3)] == [0, 1, 2]
    with pytest.raises(ValueError, match=r'stages with clusters: \[1, 2, 3\]'):
        check_stage(backbone, 4)
    for bad in (5, 1.0):
        with pytest.raises(ValueError, match=r'1\.\.4'):
            check_stage(backbone, bad)
    with pytest.raises(ValueError, match=r'stages with clusters: \[1, 2, 4\]'):  # M = 1 too
        check_stage(SimpleNamespace(num_clusters=(1, 2, 0, 3)), 3)
    batch = torch.stack([_raw(seed=i) for i in range(5)])  # not 3, the channel count
    whole = classify(classifier, batch)
    torch.testing.assert_close(classify(classifier, batch, batch_size=2), whole)
    torch.testing.assert_close(torch.cat([classify(classifier, b[None]) for b in batch]), whole)
    forward = type(classifier).forward
    monkeypatch.setattr(type(classifier), 'forward', lambda self, x, mode='tensor': (
        torch.zeros(len(x), 4), torch.zeros(len(x), 4), forward(self, x, mode)))
    torch.testing.assert_close(classify(classifier, batch), whole)
    monkeypatch.undo()
    g = analyze_cluster_groups(classifier, raw, stage=2, label=0)
    assert g.label == 0 and g.label_given
    assert torch.equal(analyze_cluster_groups(classifier, raw).logits,
                       stage_cluster_logits(classifier, raw)[0])  # stage 3 by default
    with pytest.raises(ValueError, match=r'one \(3, H, W\) raw image'):
        analyze_cluster_groups(classifier, _raw()[:1])
    g.class_names = ['a', 'b']
    assert [g.class_name(c) for c in (0, 1, 2, -1)] == ['a', 'b', '2', '-1']


def test_build_model_and_weights_for_inference(tmp_path):
    """SyncBN as BN, the model's own data_preprocessor before the config's; an official
    backbone file loads strictly into a segmentor's backbone; a full-model file missing a
    tensor loads non-strictly; a file sharing no key is an error; a pickled object is
    refused unless trusted (the default)."""
    from mmengine.config import Config

    from paca_mm.checkpoint import CheckpointError
    from paca_mm.visualization.inference import load_image, load_model_weights
    seg_cfg = osp.join(ROOT, 'demo', 'configs', 'pacahead_tiny_synthetic_seg.py')
    sync = {'model.decode_head.norm_cfg': dict(type='SyncBN', requires_grad=True),
            'data_preprocessor': dict(type='SegDataPreProcessor', mean=[0., 0., 0.],
                                      std=[1., 1., 1.])}
    torch.manual_seed(0)
    model = build_model(seg_cfg, None, cfg_options=sync)
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
    assert model.data_preprocessor.mean.flatten().tolist() != [0., 0., 0.]
    official = str(tmp_path / 'official.pth')
    torch.save(model.backbone.state_dict(), official)
    fresh = build_model(seg_cfg, None)
    head = {k: v.clone() for k, v in fresh.decode_head.state_dict().items()}
    load_model_weights(fresh, official, 'mmseg')
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(fresh.backbone.state_dict()[k], v), k
    assert all(torch.equal(fresh.decode_head.state_dict()[k], v) for k, v in head.items())
    partial = dict(model.backbone.state_dict())
    partial.pop('norm4.weight')
    torch.save(partial, official)
    with pytest.raises(Exception, match='norm4.weight'):  # strict for the backbone
        load_model_weights(fresh, official, 'mmseg')
    full = dict(model.state_dict())
    full.pop('decode_head.conv_seg.bias')
    torch.save(dict(state_dict=full), str(tmp_path / 'full.pth'))
    load_model_weights(fresh, str(tmp_path / 'full.pth'), 'mmseg')  # not strict
    torch.save(dict(state_dict={'foo': torch.zeros(1)}), str(tmp_path / 'other.pth'))
    with pytest.raises(ValueError, match='shares no key'):
        load_model_weights(fresh, str(tmp_path / 'other.pth'), 'mmseg')
    torch.save(dict(state_dict=full, meta=dict(lr=__import__('fractions').Fraction(1, 3))),
               str(tmp_path / 'pickled.pth'))
    with pytest.raises(CheckpointError, match='fractions.Fraction'):
        load_model_weights(fresh, str(tmp_path / 'pickled.pth'), 'mmseg')
    from paca_mm.visualization.inference import unwrap
    lin = torch.nn.Linear(2, 2)
    wrapper = torch.nn.Module()
    wrapper.module = model
    assert unwrap(lin) is lin and unwrap(wrapper) is model and unwrap(model) is model
    # arrays: (H, W, 3) only; size=(H, W)
    cfg = Config.fromfile(seg_cfg)
    assert load_image(cfg, np.zeros((20, 30, 3), np.uint8), size=(8, 12)).shape == (3, 8, 12)
    for bad in (np.zeros((20, 30)), np.zeros((20, 30, 4))):
        with pytest.raises(ValueError, match=r'expected an \(H, W, 3\) BGR image'):
            load_image(cfg, bad, size=(8, 12))


def _check_png(path, shape=None):
    assert osp.isfile(path) and osp.getsize(path) > 100
    img = cv2.imread(path)
    assert img is not None and img.ndim == 3
    if shape is not None:
        assert img.shape[:2] == shape
    return img


def test_explain_image_defaults(classifier, tmp_path):
    """Stage 3 (the paper's), tiles of 128: M + 1 = 17 tiles in 5 columns."""
    out = explain_image(classifier, _raw(), str(tmp_path), per_cluster=False)
    assert osp.basename(out['heatmaps']) == 'stage3_heatmaps.png'
    _check_png(out['heatmaps'], (4 * 130 + 2, 5 * 130 + 2))


def test_explain_image_writes_figures(classifier, tmp_path):
    out = explain_image(classifier, _raw(), str(tmp_path), stage=1, groups=True, topk=3,
                        tile=64, class_names=['a', 'b', 'c', 'd'])
    # input + 16 overlays -> 5 columns x 4 rows of 64 px tiles, 2 px padding
    _check_png(out['heatmaps'], (4 * 66 + 2, 5 * 66 + 2))
    assert len(out['clusters']) == M
    for p in out['clusters'][:3]:
        _check_png(p, (64, 64))
    fig = _check_png(out['groups'])
    assert fig.shape[1] == 3 * 66 + 2
    summary = json.load(open(out['summary']))
    assert len(summary['positive']) + len(summary['negative']) == M
    assert summary['label'] == out['result'].label
    assert summary['label_name'] == 'abcd'[out['result'].label]


def test_visualize_clusters_tool(classifier, tmp_path, load_tool):
    ckpt = str(tmp_path / 'model.pth')
    torch.save({'state_dict': classifier.state_dict(),
                'meta': {'dataset_meta': {'classes': ['c0', 'c1', 'c2', 'c3']}}}, ckpt)
    img = str(tmp_path / 'img.png')
    cv2.imwrite(img, _raw(64, 64, 5).permute(1, 2, 0).numpy().astype(np.uint8))
    tool = load_tool('visualize_clusters')
    out_dir = str(tmp_path / 'vis')
    out = tool.main([CLS_CFG, ckpt, img, '--stage', '3', '--out', out_dir, '--groups',
                     '--topk', '2', '--label', '1', '--tile', '48'])
    assert out['logits'].shape == (M, 4, 4)
    _check_png(osp.join(out_dir, 'stage3_heatmaps.png'))
    _check_png(osp.join(out_dir, 'stage3_clusters', 'cluster_015.png'), (64, 64))
    _check_png(osp.join(out_dir, 'stage3_groups.png'))
    summary = json.load(open(osp.join(out_dir, 'stage3_groups.json')))
    assert summary['label'] == 1 and summary['label_given'] and summary['label_name'] == 'c1'
    # the loaded weights are the checkpoint's: same logits as the in-memory model
    ref = stage_cluster_logits(classifier, _raw(64, 64, 5), 3)[0]
    torch.testing.assert_close(out['logits'], ref)


def test_heatmaps_for_segmentor(tmp_path, load_tool):
    pytest.importorskip('mmseg')
    model = build_model(SEG_CFG, None)
    from paca_mm.visualization.inference import load_image
    img = str(tmp_path / 'img.png')
    cv2.imwrite(img, _raw(96, 160, 1).permute(1, 2, 0).numpy().astype(np.uint8))
    raw = load_image(model.cfg, img)  # test pipeline: Resize to fit 128x128, keep ratio
    assert raw.shape == (3, 77, 128)
    out = explain_image(model, raw, str(tmp_path / 'seg'), stage=3, per_cluster=False,
                        tile=32)
    assert out['logits'].shape == (100, 5, 8)
    _check_png(out['heatmaps'])
    tool = load_tool('visualize_clusters')
    with pytest.raises(SystemExit, match='classification'):
        tool.main([SEG_CFG, 'none', img, '--groups'])


def test_heatmaps_for_detector(tmp_path):
    pytest.importorskip('mmdet')
    from paca_mm.visualization.inference import load_image
    model = build_model(osp.join(ROOT, 'tests', 'data', 'image_demo_tiny_mask_rcnn.py'), None)
    img = str(tmp_path / 'img.png')
    cv2.imwrite(img, _raw(64, 96, 4).permute(1, 2, 0).numpy().astype(np.uint8))
    raw = load_image(model.cfg, img)  # mmdet Resize(128, 128, keep_ratio): 85x128
    assert raw.shape == (3, 85, 128)
    out = explain_image(model, raw, str(tmp_path / 'det'), stage=2, per_cluster=False,
                        tile=32)
    assert out['logits'].shape == (8, 11, 16)
    _check_png(out['heatmaps'], (3 * 34 + 2, 3 * 34 + 2))  # input + 8 maps: 3 x 3 grid


def test_cluster_vis_hook_in_a_short_run(tmp_path):
    from mmengine.runner import Runner
    img = str(tmp_path / 'img.png')
    cv2.imwrite(img, _raw(80, 72, 2).permute(1, 2, 0).numpy().astype(np.uint8))
    cfg = Config.fromfile(CLS_CFG)
    cfg.work_dir = str(tmp_path / 'work')
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[key].dataset.data_root = str(tmp_path / 'data')
        cfg[key].dataset.train_per_class = 4
        cfg[key].dataset.val_per_class = 1
        cfg[key].batch_size = 8
    cfg.train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=1)
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=100)
    cfg.custom_hooks = [dict(type='PaCaClusterVisHook', interval=1, stage=2, image=img,
                             tile=32)]
    cfg.experiment_name = f'vis_hook_{osp.basename(str(tmp_path))}'
    runner = Runner.from_cfg(cfg)
    runner.train()
    hook = [h for h in runner.hooks if type(h).__name__ == 'PaCaClusterVisHook'][0]
    # 16 images / batch 8 = 2 iterations, drawn after each
    assert [osp.basename(p) for p in hook.written] == ['iter_000001_stage2.png',
                                                       'iter_000002_stage2.png']
    for p in hook.written:
        _check_png(p)
        assert osp.dirname(p) == osp.join(cfg.work_dir, 'cluster_vis')
    vis_files = sorted(glob.glob(osp.join(cfg.work_dir, '*', 'vis_data', 'vis_image',
                                          '*.png')))
    assert [osp.basename(f) for f in vis_files] == ['cluster_heatmaps_stage2_1.png',
                                                    'cluster_heatmaps_stage2_2.png']


def test_cluster_vis_hook_arguments_first_val_image_and_draw(tmp_path, classifier):
    """The documented defaults, interval checks, the first validation sample (its first
    view under TTA; a clear error without one), draw() on its own, add_to_visualizer."""
    from types import SimpleNamespace

    from paca_mm.hooks import PaCaClusterVisHook
    hook = PaCaClusterVisHook()
    assert (hook.interval, hook.stage, hook.tile, hook.add_to_visualizer) == (500, 3, 96, True)
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match='interval must be a positive int'):
            PaCaClusterVisHook(interval=bad)

    def val(*samples):
        return SimpleNamespace(dataloader=SimpleNamespace(dataset=list(samples)))
    first, second = _raw(40, 48, 1), _raw(40, 48, 2)
    take = PaCaClusterVisHook._first_val_image
    assert torch.equal(take(SimpleNamespace(val_loop=val({'inputs': first},
                                                         {'inputs': second}))), first)
    assert torch.equal(take(SimpleNamespace(val_loop=val({'inputs': [first, second]}))), first)
    for bad in (first.numpy(), first[0]):
        with pytest.raises(ValueError, match=r'no \(3, H, W\)'):
            take(SimpleNamespace(val_loop=val({'inputs': bad})))
    with pytest.raises(ValueError, match='no val_dataloader'):
        take(SimpleNamespace(val_loop=None))
    added = []
    runner = SimpleNamespace(model=classifier, cfg=classifier.cfg, work_dir=str(tmp_path),
                             val_loop=val({'inputs': first}),
                             visualizer=SimpleNamespace(add_image=lambda name, image, step:
                                                        added.append((name, image, step))))
    hook = PaCaClusterVisHook(stage=2, tile=64, add_to_visualizer=False)
    path = hook.draw(runner, 7)  # prepares itself (no before_train yet)
    assert path == osp.join(str(tmp_path), 'cluster_vis', 'iter_000007_stage2.png')
    _check_png(path)
    assert added == []
    hook.add_to_visualizer = True
    path = hook.draw(runner, 8)
    ((name, image, step), ) = added
    assert (name, step) == ('cluster_heatmaps_stage2', 8)
    assert np.array_equal(image, cv2.imread(path)[..., ::-1])  # the visualizer takes RGB


@pytest.mark.parametrize('cfg', [CLS_CFG, osp.join(ROOT, 'tests', 'data',
                                                    'image_demo_tiny_mask_rcnn.py')],
                         ids=['mmpretrain', 'mmdet'])
def test_normalize_inputs_matches_the_data_preprocessor(cfg):
    from paca_mm.visualization import normalize_inputs
    model = build_model(cfg, None)
    raw = _raw(40, 56, 7)
    ours = normalize_inputs(model, raw[None])
    theirs = model.data_preprocessor(dict(inputs=[raw.to(torch.uint8)], data_samples=None),
                                     False)['inputs']
    # mmdet pads to a multiple of 32: compare the image area
    torch.testing.assert_close(ours, theirs[..., :40, :56])
    assert not torch.allclose(ours, raw[None])  # something was done
    model.data_preprocessor._channel_conversion = False  # a BGR model: no channel swap
    ours = normalize_inputs(model, raw[None])
    theirs = model.data_preprocessor(dict(inputs=[raw.to(torch.uint8)], data_samples=None),
                                     False)['inputs']
    torch.testing.assert_close(ours, theirs[..., :40, :56])
