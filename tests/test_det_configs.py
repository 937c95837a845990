"""Detection configs: every Mask R-CNN config loads, follows the official recipe (fp16 AMP
as the official runs were launched), its optimizer wrapper builds the way the Runner builds it
after our tools' CPU adaptation, and its detector builds and runs (tensor mode; loss mode for
three of them) on a tiny CPU input."""
import copy
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import AmpOptimWrapper, build_optim_wrapper

import paca_mm  # noqa: F401
from paca_mm.models.backbones.paca_vit import PRESETS, resolve_preset
from paca_mm.engine.args import apply_train_args
from paca_mm.engine.cpu import CPUAmpOptimWrapper, adapt_cfg_to_device

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', 'mask_rcnn', '*.py')))
DEMO_CONFIG = osp.join(ROOT, 'demo', 'configs', 'mask_rcnn_tiny_synthetic_coco.py')
# the models of paper Tables 2 and 4
EXPECTED = {
    'pacavit_tiny_p2cconv_100_0', 'pacavit_small_p2cconv_100_0', 'pacavit_base_p2cconv_100_0',
    'pacavit_small_p2cmlp_100_0', 'pacavit_convmixer_small_100', 'pacavit_convmixer_base_100',
    'pacavit_small_p2cconv_2_0', 'pacavit_small_p2cconv_49_0', 'pacavit_small_p2cconv_49_100',
    'pacavit_small_p2cconv_100_49', 'pacavit_small_p2cconv_100',
    'pacavit_small_p2cconv_100_blockwise'}
# in the official repository but not in the paper (no released weights)
OFFICIAL_ONLY = {'pacavit_convmixer_tiny_100'}


def _name(path):
    return osp.basename(path)[len('mask_rcnn_'):-len('_mstrain_480_800_1x_coco.py')]


def _build(cfg, init=False):
    """The config's detector without its checkpoint, with few proposals (fast on a CPU)."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.backbone.pop('init_cfg', None)  # no checkpoint download in tests
    model_cfg.train_cfg.rpn_proposal.update(nms_pre=64, max_per_img=16)
    model_cfg.train_cfg.rcnn.sampler.num = 8
    model_cfg.test_cfg.rpn.update(nms_pre=32, max_per_img=1)
    torch.manual_seed(0)
    model = MODELS.build(model_cfg)
    if init:
        model.init_weights()
    return model


def test_every_table_model_has_a_config():
    assert {_name(p) for p in DET_CONFIGS} == EXPECTED | OFFICIAL_ONLY


@pytest.mark.parametrize('path', DET_CONFIGS, ids=_name)
def test_recipe(path):
    cfg = Config.fromfile(path)
    name = _name(path)
    assert name in PRESETS
    assert cfg.default_scope == 'mmdet'
    assert cfg.custom_imports == dict(imports=['paca_mm'], allow_failed_imports=False)
    bb = cfg.model.backbone
    assert bb.type == 'PaCaViT' and bb.arch == name
    assert bb.drop_path_rate == 0.1  # 0.1 for every model, base included
    assert 'num_clusters' not in bb  # ImageNet cluster counts kept
    assert bb.init_cfg.type == 'Pretrained'  # which file: tests/test_weights_by_url.py
    assert list(cfg.model.neck.in_channels) == list(resolve_preset(name)['embed_dims'])
    assert cfg.model.roi_head.bbox_head.num_classes == 80
    # schedule: AdamW 1e-4 / 0.05, no decay on norms, 12 epochs, steps at 8 and 11
    opt = cfg.optim_wrapper
    # fp16 AMP with a dynamic loss scale, as the official runs (train_mmdet.sh --amp)
    assert opt.type == 'AmpOptimWrapper' and opt.loss_scale == 'dynamic'
    assert opt.get('dtype') is None  # AmpOptimWrapper's default: float16 autocast
    assert opt.optimizer == dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05)
    assert opt.paramwise_cfg.custom_keys == {'norm': dict(decay_mult=0.)}
    assert cfg.train_cfg.max_epochs == 12
    assert cfg.param_scheduler[1].milestones == [8, 11]
    assert cfg.auto_scale_lr.base_batch_size == 16
    # data: batch 2 per GPU, DETR-style multi-scale 480-800, COCO bbox + segm
    assert cfg.train_dataloader.batch_size == 2
    pipeline = cfg.train_dataloader.dataset.pipeline
    choice = [t for t in pipeline if t.type == 'RandomChoice'][0]
    branch_a, branch_b = choice.transforms
    short_sides = [s[0] for s in branch_a[0].scales]
    assert short_sides == list(range(480, 801, 32))
    assert [t.type for t in branch_b] == ['RandomChoiceResize', 'RandomCrop',
                                         'RandomChoiceResize']
    assert branch_b[1].crop_size == (384, 600)
    assert cfg.train_dataloader.dataset.ann_file.endswith('instances_train2017.json')
    assert cfg.val_dataloader.dataset.ann_file.endswith('instances_val2017.json')
    assert cfg.val_evaluator.type == 'CocoMetric'
    assert cfg.val_evaluator.metric == ['bbox', 'segm']


def _demo_inputs(model, size=64, num_items=2, num_classes=80):
    from mmdet.testing import demo_mm_inputs
    packed = demo_mm_inputs(2, [[3, size, size]] * 2, num_items=[num_items] * 2,
                            with_mask=True, num_classes=num_classes)
    return model.data_preprocessor(packed, True)


@pytest.mark.parametrize('path', DET_CONFIGS, ids=_name)
def test_build_and_forward(path, monkeypatch):
    cfg = Config.fromfile(path)
    model = _build(cfg)
    dims = resolve_preset(_name(path))['embed_dims']
    assert model.backbone.embed_dims == list(dims)
    model.eval()
    data = _demo_inputs(model, size=32)
    with torch.no_grad():
        feats = model.extract_feat(data['inputs'])
        out = model(**data, mode='tensor')
    assert [f.shape[1] for f in feats] == [256] * 5
    assert [f.shape[-1] for f in feats] == [8, 4, 2, 1, 1]
    cls_score, bbox_pred, mask_pred = out[-1]
    num_rois = cls_score.shape[0]
    assert num_rois == 2 and cls_score.shape == (num_rois, 81)  # 1 proposal per image
    assert bbox_pred.shape == (num_rois, 320)
    assert mask_pred.shape == (min(num_rois, 100), 80, 28, 28)
    assert all(torch.isfinite(t).all() for t in (cls_score, bbox_pred, mask_pred))
    check_optim_wrappers(cfg, model, monkeypatch)


def check_optim_wrappers(cfg, model, monkeypatch):
    """Build cfg.optim_wrapper as the Runner does (mmengine.optim.build_optim_wrapper)."""
    # unadapted, mmengine's own AmpOptimWrapper: it asserts CUDA, so on this machine the
    # config only builds with CUDA reported present (its GradScaler then disables itself)
    import mmengine.optim.optimizer.amp_optimizer_wrapper as amp_module
    from torch.cuda.amp import GradScaler
    if not torch.cuda.is_available():
        with pytest.raises(AssertionError, match='only available training on gpu'):
            build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    with monkeypatch.context() as m:
        m.setattr(amp_module, 'is_cuda_available', lambda: True)
        gpu = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    assert type(gpu) is AmpOptimWrapper
    assert isinstance(gpu.loss_scaler, GradScaler) and gpu._scale_update_param is None
    assert gpu.cast_dtype is None  # float16 autocast on the GPU
    # what tools/train.py builds on a machine without CUDA
    cpu_cfg = copy.deepcopy(cfg)
    notes = adapt_cfg_to_device(cpu_cfg, cuda=False)
    assert any('CPUAmpOptimWrapper' in n for n in notes), notes
    cpu = build_optim_wrapper(model, cpu_cfg.optim_wrapper)
    assert type(cpu) is CPUAmpOptimWrapper and cpu.cast_dtype == torch.bfloat16
    assert gpu.optimizer.defaults == cpu.optimizer.defaults
    assert [(g['lr'], g['weight_decay']) for g in gpu.optimizer.param_groups] == \
        [(g['lr'], g['weight_decay']) for g in cpu.optimizer.param_groups]
    with cpu.optim_context(model):  # the forward runs under bf16 autocast
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16


def test_amp_flag_still_accepted():
    """tools/train.py --amp on a config that already trains with AMP: accepted, unchanged."""
    path = osp.join(ROOT, 'configs', 'mask_rcnn',
                    'mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py')
    cfg = Config.fromfile(path)
    before = copy.deepcopy(cfg.optim_wrapper)
    notes = apply_train_args(cfg, amp=True)
    assert notes == ['AMP training is already enabled in the config.']
    assert cfg.optim_wrapper == before


@pytest.mark.parametrize('name', ['pacavit_tiny_p2cconv_100_0', 'pacavit_convmixer_small_100',
                                  'pacavit_convmixer_tiny_100'])
def test_loss_and_backward(name):
    path = osp.join(ROOT, 'configs', 'mask_rcnn', f'mask_rcnn_{name}_mstrain_480_800_1x_coco.py')
    model = _build(Config.fromfile(path), init=True)
    model.train()
    data = _demo_inputs(model, size=64, num_items=1)
    losses = model(**data, mode='loss')
    for key in ('loss_rpn_cls', 'loss_rpn_bbox', 'loss_cls', 'loss_bbox', 'loss_mask'):
        assert key in losses, sorted(losses)
    total, _ = model.parse_losses(losses)
    assert torch.isfinite(total)
    total.backward()
    grad = model.backbone.stage1[0].attn.q.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_demo_config():
    from demo.datasets.synthetic_coco import CLASSES
    cfg = Config.fromfile(DEMO_CONFIG)
    assert tuple(cfg.classes) == CLASSES
    assert cfg.model.backbone.arch == 'pacavit_tiny_p2cconv_100_0'
    assert 'init_cfg' not in cfg.model.backbone  # trained from scratch
    assert cfg.optim_wrapper.type == 'OptimWrapper'  # the CPU demo stays fp32
    assert cfg.model.roi_head.bbox_head.num_classes == len(CLASSES)
    assert cfg.model.roi_head.mask_head.num_classes == len(CLASSES)
    assert cfg.test_evaluator.metric == ['bbox', 'segm']
    model = _build(cfg).eval()
    data = _demo_inputs(model, num_classes=len(CLASSES))
    with torch.no_grad():
        preds = model(**data, mode='predict')
    assert len(preds) == 2 and hasattr(preds[0].pred_instances, 'masks')


def test_pretrained_checkpoint_is_loaded_in_init_weights(tmp_path):
    """The backbone's init_cfg checkpoint survives the detector's init_weights."""
    from paca_mm.models.backbones import PaCaViT
    path = osp.join(ROOT, 'configs', 'mask_rcnn',
                    'mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py')
    cfg = Config.fromfile(path)
    torch.manual_seed(1)
    ref = PaCaViT('pacavit_tiny_p2cconv_100_0')
    ref.init_weights()
    ckpt = tmp_path / 'IMNET_224_pacavit_tiny_p2cconv_100_0.pth'
    torch.save(ref.state_dict(), ckpt)  # the official release layout
    cfg.model.backbone.init_cfg.checkpoint = str(ckpt)
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    model.init_weights()
    for key, value in ref.state_dict().items():
        assert torch.equal(model.backbone.state_dict()[key], value), key
