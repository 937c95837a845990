"""``tools/test.py --tta`` for every config family, and the instance-mask TTA of Mask R-CNN
(:class:`paca_mm.models.test_time_augs.MaskRCNNTTAModel`)."""
import os.path as osp

import numpy as np
import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CFG = osp.join(ROOT, 'demo', 'configs', 'mask_rcnn_tiny_synthetic_coco.py')
H, W = 64, 80  # the test image


@pytest.fixture(scope='module')
def det_tta():
    """(the demo Mask R-CNN, randomly initialised, wrapped in its config's TTA model,
    a function packing one view of an image)."""
    from mmengine.config import Config
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope

    import paca_mm  # noqa: F401
    from mmdet.registry import MODELS
    cfg = Config.fromfile(DET_CFG)
    init_default_scope('mmdet')
    torch.manual_seed(0)
    tta = MODELS.build(dict(**cfg.tta_model, module=cfg.model)).eval()
    tta.module.init_weights()
    rng = np.random.default_rng(0)
    img = np.full((H, W, 3), 90, np.uint8) + rng.integers(0, 20, (H, W, 3), np.uint8)
    img[10:40, 15:35] = (230, 40, 40)  # a bright, asymmetric object left of the centre
    img[35:60, 50:75] = (40, 200, 40)

    def view(scale=(160, 88), flip=False, direction='horizontal'):
        pipe = Compose([dict(type='Resize', scale=scale, keep_ratio=True),
                        dict(type='RandomFlip', prob=float(flip), direction=direction),
                        cfg.tta_pipeline[1].transforms[-1][0]])  # PackDetInputs
        out = pipe(dict(img=img.copy(), img_id=0, img_path='x.png', img_shape=img.shape[:2],
                        ori_shape=img.shape[:2]))
        return out['inputs'], out['data_samples']

    return tta, view


def _preds(samples):
    p = samples[0].pred_instances
    return p.bboxes, p.scores, p.labels, p.masks


def _assert_same(a, b):
    (ba, sa, la, ma), (bb, sb, lb, mb) = a, b
    assert len(sa) > 5 and ma.shape == mb.shape and ma.dtype == torch.bool
    torch.testing.assert_close(ba, bb, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(sa, sb)
    assert torch.equal(la, lb)
    # masks pasted from the same probabilities; 0.5-thresholding may differ at float noise
    assert (ma != mb).float().mean() < 1e-3, (ma != mb).float().mean()


@torch.no_grad()
def test_one_unflipped_view_equals_the_plain_prediction(det_tta):
    """One view, resized (scale factor 88/64 = 1.375) and not flipped: the merged
    boxes are the plain ones (NMS again removes nothing), mapped into the view for the
    mask head: the same boxes, scores, labels and masks as the detector alone."""
    tta, view = det_tta
    x, s = view()
    assert s.scale_factor[0] > 1.3 and s.flip is False
    plain = _preds(tta.module.test_step(dict(inputs=[x], data_samples=[s.clone()])))
    merged = _preds(tta.test_step(dict(inputs=[[x]], data_samples=[[s.clone()]])))
    assert plain[3].shape[1:] == (H, W)
    _assert_same(merged, plain)


@torch.no_grad()
@pytest.mark.parametrize('direction,dims', [('horizontal', [-1]), ('vertical', [-2]),
                                            ('diagonal', [-2, -1])])
def test_a_flipped_view_comes_back_unflipped(det_tta, direction, dims):
    """One flipped view: TTA gives the detector's prediction on the flipped image with
    boxes and masks mirrored back into the original image."""
    from mmdet.structures.bbox import bbox_flip
    tta, view = det_tta
    x, s = view(flip=True, direction=direction)
    assert s.flip is True and s.flip_direction == direction
    b, sc, lab, m = _preds(tta.module.test_step(dict(inputs=[x], data_samples=[s.clone()])))
    expected = bbox_flip(b, (H, W), direction), sc, lab, m.flip(dims)
    merged = _preds(tta.test_step(dict(inputs=[[x]], data_samples=[[s.clone()]])))
    _assert_same(merged, expected)
    assert (merged[3] != m).float().mean() > 0.003  # the mirror image does differ (measured 0.7%)


@torch.no_grad()
def test_masks_are_the_mean_of_the_views(det_tta, monkeypatch):
    """Two views (flipped at scale 1.375, plain at 1.0): the merged boxes' mask
    probabilities are the mean over the views of the mask head on that view's features,
    flipped back for the flipped view, before thresholding."""
    tta, view = det_tta
    (x1, s1), (x2, s2) = view(flip=True), view(scale=(W, H))
    head = tta.module.roi_head.mask_head
    seen = {}
    paste = head.predict_by_feat

    def spy(mask_preds, results_list, *args, **kwargs):
        seen['probs'], seen['boxes'] = mask_preds[0].clone(), results_list[0].bboxes.clone()
        return paste(mask_preds, results_list, *args, **kwargs)

    monkeypatch.setattr(head, 'predict_by_feat', spy)
    merged = tta.test_step(dict(inputs=[[x1], [x2]], data_samples=[[s1], [s2]]))
    boxes = seen['boxes']
    assert len(boxes) > 5 and len(merged[0].pred_instances) == len(boxes)
    probs = []
    for x, s, flip in ((x1, s1, True), (x2, s2, False)):
        data = tta.module.data_preprocessor(dict(inputs=[x], data_samples=[s]), False)
        feats = tta.module.extract_feat(data['inputs'])
        b = boxes.clone()
        if flip:
            b[:, [0, 2]] = W - boxes[:, [2, 0]]
        b = b * b.new_tensor(s.scale_factor).repeat(2)
        rois = torch.cat([b.new_zeros(len(b), 1), b], 1)
        p = tta.module.roi_head._mask_forward(feats, rois)['mask_preds'].sigmoid()
        probs.append(p.flip(-1) if flip else p)
    torch.testing.assert_close(seen['probs'], (probs[0] + probs[1]) / 2)


@torch.no_grad()
def test_views_are_preprocessed_for_testing_and_no_box_is_fine(det_tta, monkeypatch):
    """Each view goes through the data preprocessor in test mode (no batch augments, no
    ground-truth padding); with every score under the threshold, the result is empty."""
    tta, view = det_tta
    pre = tta.module.data_preprocessor
    modes = []
    forward = pre.forward
    monkeypatch.setattr(pre, 'forward', lambda data, training=False: (
        modes.append(training), forward(data, training))[1])
    rcnn = tta.module.roi_head.test_cfg
    monkeypatch.setattr(rcnn, 'score_thr', 1.1)
    (x1, s1), (x2, s2) = view(flip=True), view()
    merged = tta.test_step(dict(inputs=[[x1], [x2]], data_samples=[[s1], [s2]]))
    assert modes == [False, False]
    masks = merged[0].pred_instances.masks
    assert len(merged[0].pred_instances) == 0 and tuple(masks.shape) == (0, H, W)


def _test_tool(config, checkpoint, work_dir, options, extra=(), threads=2):
    """tools/test.py --tta (demo.common.run_tool: a subprocess from the repository root)."""
    from demo.common import run_tool
    log = osp.join(work_dir + '.log')
    run_tool(['tools/test.py', config, checkpoint, '--tta', '--work-dir', work_dir,
              *extra, '--cfg-options', *options], log, timeout=600, threads=threads)
    return log


# TTA may not fall below the plain run by more than this (AP / mIoU points, 24 images).
# Measured on the 150-iteration demo detector: bbox AP 4.9 -> 5.8, segm AP 13.3 -> 15.6;
# on the 160-iteration demo segmenter: mIoU 61.3 -> 64.5 (torch 2.1 stack: 63.9 -> 65.3).
# The box and mask mapping itself is pinned exactly by the unit tests above.
TOLERANCE = 1.0


@pytest.mark.slow
def test_det_tta_end_to_end(demo_det, tmp_path):
    """tools/test.py --tta on the trained demo detector: flip x 3 scales through
    MaskRCNNTTAModel; box and mask AP not below the plain run's beyond noise."""
    from demo.det import parse_test_metrics
    root = demo_det['paths']['data_root'].rstrip('/') + '/'
    opts = [f'test_dataloader.dataset.data_root={root}',
            f'test_evaluator.ann_file={root}annotations/instances_val.json']
    log = _test_tool(DET_CFG, demo_det['paths']['checkpoint'], str(tmp_path / 'tta'), opts)
    tta, plain = parse_test_metrics(str(tmp_path / 'tta'), log), demo_det['metrics']
    print('plain', plain, '\nTTA  ', tta)
    for key in ('bbox_AP', 'segm_AP', 'bbox_AP50', 'segm_AP50'):
        assert tta[key] >= plain[key] - TOLERANCE, (key, plain, tta)


@pytest.mark.slow
def test_seg_tta_end_to_end(demo_seg, tmp_path):
    """tools/test.py --tta on the trained demo segmenter: 3 scales x flip, SegTTAModel."""
    from demo.seg import DEFAULT_CONFIG, parse_test_metrics, size_options
    opts = [f"test_dataloader.dataset.data_root={demo_seg['paths']['data_root']}"]
    opts += size_options(DEFAULT_CONFIG, demo_seg['img_size'])
    _test_tool(DEFAULT_CONFIG, demo_seg['paths']['checkpoint'], str(tmp_path / 'tta'), opts,
               threads=1)
    tta, plain = parse_test_metrics(str(tmp_path / 'tta')), demo_seg['metrics']
    print('plain mIoU', plain['mIoU'], 'TTA mIoU', tta['mIoU'])
    assert tta['mIoU'] >= plain['mIoU'] - TOLERANCE, (plain, tta)


@pytest.mark.slow
@torch.no_grad()
def test_cls_tta_end_to_end(demo_cls, tmp_path):
    """tools/test.py --tta on the trained demo classifier: each image's score is the mean
    of the classifier's scores on the image and its mirror image (AverageClsScoreTTA)."""
    from mmengine.config import Config
    from mmengine.dataset import Compose
    from mmengine.fileio import load
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS

    from paca_mm.checkpoint.loading import load_checkpoint_file
    cfg_path = osp.join(ROOT, 'demo', 'configs', 'paca_tiny_synthetic_cls.py')
    out = str(tmp_path / 'tta.pkl')
    _test_tool(cfg_path, demo_cls['checkpoint'], str(tmp_path / 'tta'), demo_cls['options'],
               extra=['--out', out])
    preds = load(out)
    cfg = Config.fromfile(cfg_path)
    init_default_scope('mmpretrain')
    model = MODELS.build(dict(cfg.model, data_preprocessor=cfg.data_preprocessor)).eval()
    model.load_state_dict(load_checkpoint_file(demo_cls['checkpoint'])['state_dict'])
    pipe = Compose(cfg.test_pipeline)
    assert len(preds) == 32
    for pred in preds[::8]:
        data = pipe(dict(img_path=pred['img_path']))
        scores = [model.test_step(dict(inputs=[x], data_samples=[data['data_samples']]))[0]
                  .pred_score for x in (data['inputs'], data['inputs'].flip(-1))]
        torch.testing.assert_close(pred['pred_score'], (scores[0] + scores[1]) / 2)
        assert not torch.allclose(scores[0], scores[1])  # the mirror image does count


@pytest.mark.parametrize('config,scope,expected', [
    ('demo/configs/mask_rcnn_tiny_synthetic_coco.py', 'mmdet', 'MaskRCNNTTAModel'),
    ('demo/configs/paca_tiny_synthetic_cls.py', 'mmpretrain', 'AverageClsScoreTTA'),
    ('demo/configs/pacahead_tiny_synthetic_seg.py', 'mmseg', 'SegTTAModel'),
    ('configs/mask_rcnn/mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py',
     'mmdet', 'MaskRCNNTTAModel'),
    ('configs/paca_vit_imagenet/pacavit_tiny_p2cconv_100_0_8xb128_in1k.py', 'mmpretrain',
     'AverageClsScoreTTA'),
    ('configs/paca_head/pacahead_pacavit_tiny_p2cconv_100_0_512x512_160k_ade20k.py', 'mmseg',
     'SegTTAModel')])
@pytest.mark.parametrize('in_config', [True, False])
def test_tta_models_resolve_in_the_config_scope(config, scope, expected, in_config):
    """``--tta`` wraps the model in a TTA model that the Runner finds from the config's
    default scope: the config's own ``tta_model`` and the fallback when the config has
    none (mmseg has no fallback); mmdet's fallback packs the flip meta keys."""
    from mmengine.config import Config
    from mmengine.registry import MODELS

    from paca_mm.engine.args import apply_tta
    from paca_mm.registry import register_toolbox_modules
    cfg = Config.fromfile(osp.join(ROOT, config))
    assert cfg.tta_model.type == expected and cfg.tta_pipeline[-1].type == 'TestTimeAug'
    if not in_config:
        if scope == 'mmseg':
            return  # mmseg's --tta requires both (tests/test_tools.py)
        cfg.pop('tta_model')
        cfg.pop('tta_pipeline')
    register_toolbox_modules(cfg)
    packing = cfg.test_dataloader.dataset.pipeline[-1].type
    if scope == 'mmdet':  # YOLO-style batch shapes would undo the views' sizes
        cfg.test_dataloader.dataset.batch_shapes_cfg = dict(type='BatchShapePolicy')
    apply_tta(cfg, scope)
    assert cfg.model.type == expected and 'backbone' in cfg.model.module
    with MODELS.switch_scope_and_registry(scope) as registry:
        assert registry.get(cfg.model.type) is not None, cfg.model.type
    pipeline = cfg.test_dataloader.dataset.pipeline
    assert pipeline[-1].type == 'TestTimeAug'
    pack = pipeline[-1].transforms[-1][0]
    assert pack.type == packing  # the test pipeline's own last (packing) step
    if not in_config:  # the fallback: one flipped view and one plain view
        assert [(t.type, t.prob) for t in pipeline[-1].transforms[0]] == [
            ('RandomFlip', 1.), ('RandomFlip', 0.)]
    if scope == 'mmdet':
        assert {'flip', 'flip_direction'} <= set(pack.meta_keys)
        assert cfg.test_dataloader.dataset.batch_shapes_cfg is None
        if not in_config:  # mmdet's tools/test.py default
            assert cfg.model.tta_cfg == dict(nms=dict(type='nms', iou_threshold=0.5),
                                             max_per_img=100)


def test_mask_tta_needs_a_mask_head():
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import paca_mm  # noqa: F401
    from mmdet.registry import MODELS
    cfg = Config.fromfile(DET_CFG)
    for key in ('mask_head', 'mask_roi_extractor'):
        cfg.model.roi_head.pop(key)
    init_default_scope('mmdet')
    with pytest.raises(ValueError, match='mask head.*DetTTAModel'):
        MODELS.build(dict(**cfg.tta_model, module=cfg.model))
    one_stage = dict(  # no RPN (and no roi_head at all)
        type='RetinaNet', data_preprocessor=cfg.model.data_preprocessor,
        backbone=cfg.model.backbone,
        neck=dict(cfg.model.neck, start_level=1, add_extra_convs='on_input'),
        bbox_head=dict(type='RetinaHead', num_classes=2, in_channels=cfg.model.neck.out_channels,
                       anchor_generator=dict(type='AnchorGenerator', octave_base_scale=4,
                                             scales_per_octave=3, ratios=[0.5, 1.0, 2.0],
                                             strides=[8, 16, 32, 64, 128]),
                       bbox_coder=dict(type='DeltaXYWHBBoxCoder')))
    with pytest.raises(ValueError, match='two-stage detector.*RetinaNet'):
        MODELS.build(dict(**cfg.tta_model, module=one_stage))
