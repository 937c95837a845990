"""End-to-end detection: the CPU demo (tools/train.py + tools/test.py on generated COCO data)
beats the untrained detector, and a stock mmdet Mask R-CNN config with only the backbone,
``neck.in_channels`` and ``custom_imports`` changed trains on generated data."""
import json
import os.path as osp

import numpy as np
import pytest

from demo.datasets.synthetic_coco import (CLASSES, decode_rle, encode_rle,
                                             generate_synthetic_coco)


def test_synthetic_coco_is_deterministic_and_valid(tmp_path):
    a = generate_synthetic_coco(str(tmp_path / 'a'), num_train=6, num_val=2, seed=3)
    b = generate_synthetic_coco(str(tmp_path / 'b'), num_train=6, num_val=2, seed=3)
    c = generate_synthetic_coco(str(tmp_path / 'c'), num_train=6, num_val=2, seed=4)
    read = lambda d, k: open(osp.join(d['data_root'], d[k]), 'rb').read()  # noqa: E731
    assert read(a, 'train_ann') == read(b, 'train_ann')
    assert read(a, 'train_ann') != read(c, 'train_ann')
    coco = json.loads(read(a, 'train_ann'))
    assert [c['name'] for c in coco['categories']] == list(CLASSES)
    assert len(coco['images']) == 6 and len(coco['annotations']) >= 6
    kinds = set()
    for ann in coco['annotations']:
        img = coco['images'][ann['image_id'] - 1]
        x, y, w, h = ann['bbox']
        assert w > 0 and h > 0 and x + w <= img['width'] and y + h <= img['height']
        seg = ann['segmentation']
        kinds.add('rle' if isinstance(seg, dict) else 'polygon')
        if isinstance(seg, dict):  # exact: area and bbox of the RLE mask
            mask = decode_rle(seg)
            ys, xs = np.nonzero(mask)
            assert mask.sum() == ann['area']
            assert [xs.min(), ys.min(), xs.max() + 1 - xs.min(), ys.max() + 1 - ys.min()] == \
                ann['bbox']
    assert kinds == {'rle', 'polygon'}
    # a second call with the same arguments reuses the folder
    meta = osp.join(a['data_root'], 'meta.json')
    mtime = osp.getmtime(meta)
    generate_synthetic_coco(str(tmp_path / 'a'), num_train=6, num_val=2, seed=3)
    assert osp.getmtime(meta) == mtime
    with pytest.raises(ValueError, match='object_size'):
        generate_synthetic_coco(str(tmp_path / 'd'), image_size=(32, 48), object_size=(20, 40))


def test_rle_roundtrip_matches_pycocotools():
    from pycocotools import mask as mask_utils
    rng = np.random.default_rng(0)
    mask = rng.random((13, 17)) > 0.6
    mask[0, 0] = True  # starts with a foreground run
    rle = encode_rle(mask)
    assert np.array_equal(decode_rle(rle), mask)
    compressed = mask_utils.frPyObjects(rle, *rle['size'])
    assert np.array_equal(mask_utils.decode(compressed).astype(bool), mask)


def test_demo_roi_features_do_not_depend_on_memory_format():
    """PaCaViT returns channels_last maps (so does the FPN on top); mmcv's own RoIAlign op
    reads them as if NCHW-contiguous and returns wrong RoI features. The demo config's RoI
    extractors must give the same features for both layouts."""
    import torch
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import paca_mm  # noqa: F401
    from mmdet.registry import MODELS
    cfg = Config.fromfile(osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))),
                                   'demo', 'configs', 'mask_rcnn_tiny_synthetic_coco.py'))
    init_default_scope('mmdet')
    torch.manual_seed(0)
    width = cfg.model.neck.out_channels
    feats = tuple(torch.randn(1, width, 32 // 2**i, 32 // 2**i) for i in range(4))
    rois = torch.tensor([[0., 3., 5., 60., 50.], [0., 10., 12., 110., 120.]])
    for name in ('bbox_roi_extractor', 'mask_roi_extractor'):
        extractor = MODELS.build(cfg.model.roi_head[name])
        ref = extractor(feats, rois)
        out = extractor(tuple(f.contiguous(memory_format=torch.channels_last) for f in feats),
                        rois)
        torch.testing.assert_close(out, ref, msg=name)


@pytest.mark.slow
def test_demo_trains_and_beats_untrained(demo_det):
    """A shortened `make demo` detection run (tools/train.py + tools/test.py, ~2 min on
    1 core; the session's ``demo_det``) gives COCO bbox and segm AP clearly above the
    untrained detector's, and box + mask AP50 above a floor set from the spread of healthy
    runs.

    Training is chaotic: float-level differences (seed, thread count, a numerically equivalent
    rewrite of the backbone) move the result a lot, while a fixed seed and thread count give the
    same numbers run after run. This recipe with 1 thread (the fixture's), seeds 0-2, with
    the current code and with an older commit whose backbone computes the same function with
    other kernels (one training step: same losses to 1e-6, same gradients to 0.3%), gave
    bbox_AP50 11.7-15.9 (bbox AP 3.0-5.8), segm_AP50 13.9-19.6 (segm AP 8.2-13.3), and bbox_AP50
    + segm_AP50 25.6-35.0 (mean 31.8, sd 3.2); neither code was worse. The full demo (400
    iterations, seed 0) moved as much between the older commit and a later one with the current
    training code: bbox / segm AP 18.8 / 27.3, then 12.2 / 16.2. AP alone is too noisy here to
    catch a real drop of that size (-35% box, -40% mask AP) without failing healthy runs; the
    AP50 sum's floor of 22 is 14% under the lowest healthy run and above what such a drop leaves
    of the mean (about 19.7)."""
    res = demo_det
    trained, untrained = res['metrics'], res['metrics_untrained']
    print('trained', trained, '\nuntrained', untrained, '\ntimes', res['train_time_s'],
          res['test_time_s'])
    assert osp.isfile(res['paths']['checkpoint'])
    assert res['iters'] == 150
    for key in ('bbox_AP', 'bbox_AP50', 'segm_AP', 'segm_AP50'):
        assert 0.0 <= trained[key] <= 100.0 and 0.0 <= untrained[key] <= 100.0
    # clearly better than the randomly initialised detector, boxes and masks
    assert trained['bbox_AP50'] >= untrained['bbox_AP50'] + 8.0, (trained, untrained)
    assert trained['segm_AP50'] >= untrained['segm_AP50'] + 8.0, (trained, untrained)
    assert trained['bbox_AP'] >= untrained['bbox_AP'] + 2.0, (trained, untrained)
    assert trained['segm_AP'] >= untrained['segm_AP'] + 2.0, (trained, untrained)
    # a real drop in how well the detector learns (see the docstring for the measured spread)
    assert trained['bbox_AP50'] + trained['segm_AP50'] >= 22.0, trained


@pytest.mark.slow
def test_stock_mmdet_config_with_paca_backbone_trains(tmp_path):
    """docs/mmdet_integration.md: change backbone, neck.in_channels, custom_imports only."""
    import torch
    from mmengine.config import Config
    from mmengine.runner import Runner
    data = generate_synthetic_coco(str(tmp_path / 'data'), num_train=4, num_val=1,
                                   image_size=(96, 112), object_size=(24, 48))
    cfg_file = tmp_path / 'mask-rcnn_paca-tiny_fpn_1x_coco.py'
    cfg_file.write_text(
        "_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'\n"
        "custom_imports = dict(imports=['paca_mm'], allow_failed_imports=False)\n"
        "model = dict(\n"
        "    backbone=dict(_delete_=True, type='PaCaViT', arch='pacavit_tiny_p2cconv_100_0',\n"
        "                  drop_path_rate=0.1, out_indices=(0, 1, 2, 3)),\n"
        "    neck=dict(in_channels=[96, 192, 320, 384]))\n")
    cfg = Config.fromfile(str(cfg_file))
    assert cfg.model.type == 'MaskRCNN' and cfg.model.roi_head.bbox_head.num_classes == 80
    assert cfg.model.backbone == dict(type='PaCaViT', arch='pacavit_tiny_p2cconv_100_0',
                                      drop_path_rate=0.1, out_indices=(0, 1, 2, 3))
    # point the stock data pipeline at the generated data, small images, 2 iterations
    ds = cfg.train_dataloader.dataset
    ds.data_root = data['data_root'] + '/'
    ds.ann_file, ds.data_prefix = data['train_ann'], dict(img=data['train_img'])
    ds.metainfo = dict(classes=CLASSES)
    ds.filter_cfg = dict(filter_empty_gt=True, min_size=8)
    assert ds.pipeline[2].type == 'Resize'
    ds.pipeline[2].scale = (128, 96)
    cfg.train_dataloader.update(num_workers=0, persistent_workers=False)
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1, val_interval=100)
    cfg.val_dataloader = cfg.val_evaluator = cfg.val_cfg = None
    cfg.test_dataloader = cfg.test_evaluator = cfg.test_cfg = None
    cfg.optim_wrapper.optimizer.lr = 0.002
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.checkpoint = None
    cfg.work_dir = str(tmp_path / 'work')
    cfg.log_level = 'WARNING'
    runner = Runner.from_cfg(cfg)
    backbone = runner.model.backbone
    assert type(backbone).__name__ == 'PaCaViT'
    before = backbone.stage3[0].attn.clustering.clustering[4].weight.detach().clone()
    losses = []

    from mmengine.hooks import Hook

    class Record(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            losses.append({k: float(v) for k, v in outputs.items()})

    runner.register_hook(Record())
    runner.train()
    assert len(losses) == 2  # 4 images, batch 2, 1 epoch
    for out in losses:
        assert np.isfinite(out['loss']) and out['loss_mask'] > 0 and out['loss_rpn_cls'] > 0
    after = backbone.stage3[0].attn.clustering.clustering[4].weight
    assert not torch.equal(before, after)  # the clustering layers are trained
