"""Every segmentation config loads, builds and runs; ADE20k recipes match the official ones,
fp16 AMP included (as the official runs were launched), and their optimizer wrappers build the
way the Runner builds them after our tools' CPU adaptation."""
import copy
import glob
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.optim import AmpOptimWrapper, build_optim_wrapper
from mmengine.registry import init_default_scope
from mmseg.registry import MODELS

import paca_mm  # noqa: F401
from paca_mm.engine.cpu import CPUAmpOptimWrapper, adapt_cfg_to_device

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PACA_HEAD = sorted(glob.glob(osp.join(REPO, 'configs', 'paca_head', '*.py')))
UPERNET = sorted(glob.glob(osp.join(REPO, 'configs', 'upernet', '*.py')))
DEMO = sorted(glob.glob(osp.join(REPO, 'demo', 'configs', '*seg*.py')))
ADE = PACA_HEAD + UPERNET

# Exact parameter counts (backbone with ADE20k clusters + heads), from the official code.
PARAMS = {
    'pacahead_pacavit_tiny_p2cconv_100_0': 13_326_764,
    # official repository only (not in the paper): convmixer tiny backbone with [200]*4
    # clusters = 12,483,672 - 385,000 (ImageNet head) + 99,600 (to_clusters 100 -> 200)
    'pacahead_pacavit_convmixer_tiny_100': 12_198_272 + 1_450_284,
    'pacahead_pacavit_small_p2cconv_100_0': 21_713_504 + 1_450_284,
    'pacahead_pacavit_base_p2cconv_100_0': 46_465_504 + 1_499_436,
    'pacahead_pacavit_small_p2cmlp_100_0': 22_495_768 + 1_450_284,
    'pacahead_pacavit_convmixer_small_100': 20_789_664 + 1_450_284,
    'pacahead_pacavit_convmixer_base_100': 47_264_992 + 1_499_436,
    'pacahead_pacavit_small_p2cconv_2_0': 21_713_504 + 1_450_284,
    'pacahead_pacavit_small_p2cconv_49_0': 21_713_504 + 1_450_284,
    'pacahead_pacavit_small_p2cconv_49_100': 21_959_648 + 1_450_284,
    'pacahead_pacavit_small_p2cconv_100_49': 21_959_648 + 1_450_284,
    'pacahead_pacavit_small_p2cconv_100': 21_959_648 + 1_450_284,
    'pacahead_pacavit_small_p2cconv_100_blockwise': 24_328_544 + 1_450_284,
    'upernet_pacavit_tiny_p2cconv_100_0': 41_561_516,
    'upernet_pacavit_small_p2cconv_100_0': 51_398_540,
    'upernet_pacavit_base_p2cconv_100_0': 77_182_732,
}
# ADE20k cluster override (official configs): [200]*4 for these, [200, 200, 200, 0] for the others
CLUSTERS_200X4 = {
    'pacahead_pacavit_convmixer_tiny_100', 'pacahead_pacavit_convmixer_small_100', 'pacahead_pacavit_convmixer_base_100',
    'pacahead_pacavit_small_p2cconv_49_100', 'pacahead_pacavit_small_p2cconv_100_49',
    'pacahead_pacavit_small_p2cconv_100', 'pacahead_pacavit_small_p2cconv_100_blockwise'}
# drop path of the official configs: 0.5 for base conv and base teacher with the PaCa
# head; 0.1 for all with UperNet
BASE_DROP_PATH = {'pacahead_pacavit_base_p2cconv_100_0', 'pacahead_pacavit_convmixer_base_100'}


def short(path):
    return osp.basename(path)[:-len('.py')].replace('_512x512_160k_ade20k', '')


def build(cfg):
    """Build cfg.model on CPU: no checkpoint file (removed), SyncBN -> BN, no weights init."""
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.backbone.pop('init_cfg', None)
    return revert_sync_batchnorm(MODELS.build(model_cfg))


def test_config_inventory():
    names = {short(p) for p in ADE}
    assert names == set(PARAMS), names ^ set(PARAMS)
    assert DEMO, 'no demo segmentation config found'


@pytest.mark.parametrize('path', ADE + DEMO, ids=lambda p: osp.basename(p))
def test_config_builds_and_runs(path):
    cfg = Config.fromfile(path)
    assert cfg.default_scope == 'mmseg'
    imports = ['paca_mm', 'demo.datasets'] if path in DEMO else ['paca_mm']
    assert cfg.custom_imports == dict(imports=imports, allow_failed_imports=False)
    assert cfg.model.backbone.type == 'PaCaViT'
    model = build(cfg)
    model.eval()
    num_classes = cfg.model.decode_head.num_classes
    with torch.no_grad():
        logits = model(torch.randn(1, 3, 64, 64), mode='tensor')
    assert logits.shape[:2] == (1, num_classes)
    assert logits.shape[2:] == (16, 16)  # both heads predict at stride 4
    assert torch.isfinite(logits).all()
    name = short(path)
    if name in PARAMS:
        assert sum(p.numel() for p in model.parameters()) == PARAMS[name]
        check_ade_recipe(cfg, name)
        check_optimizer_groups(cfg, model, name)


def check_ade_recipe(cfg, name):
    arch = cfg.model.backbone.arch
    assert name.endswith(arch), (name, arch)
    ckpt = cfg.model.backbone.init_cfg
    assert ckpt.type == 'Pretrained'  # which file: tests/test_weights_by_url.py
    four = name in CLUSTERS_200X4
    assert tuple(cfg.model.backbone.num_clusters) == ((200,) * 4 if four else (200, 200, 200, 0))
    dp = 0.5 if name in BASE_DROP_PATH else 0.1
    assert cfg.model.backbone.drop_path_rate == dp
    assert cfg.model.decode_head.num_classes == 150
    assert cfg.train_dataloader.batch_size == 2
    assert cfg.train_dataloader.dataset.type == 'ADE20KDataset'
    assert cfg.crop_size == (512, 512) and cfg.model.data_preprocessor.size == (512, 512)
    assert cfg.train_cfg.max_iters == 160_000 and cfg.train_cfg.val_interval == 16_000
    # fp16 AMP with a dynamic loss scale, as the official runs (train_mmseg.sh --amp)
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.loss_scale == 'dynamic' and cfg.optim_wrapper.get('dtype') is None
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.lr, opt.weight_decay, tuple(opt.betas)) == \
        ('AdamW', 6e-5, 0.01, (0.9, 0.999))
    warm, poly = cfg.param_scheduler
    assert (warm.type, warm.start_factor, warm.end) == ('LinearLR', 1e-6, 1500)
    assert (poly.type, poly.power, poly.begin, poly.end) == ('PolyLR', 1.0, 1500, 160_000)
    assert cfg.val_evaluator.iou_metrics == ['mIoU']


def check_optimizer_groups(cfg, model, name):
    """lr/decay per parameter, as mmengine's constructor resolves the custom keys, in the
    optimizer wrapper the Runner builds on this CPU machine after tools/train.py's adaptation
    (AmpOptimWrapper asserts CUDA; the tools turn it into bf16 autocast)."""
    cpu_cfg = copy.deepcopy(cfg)
    notes = adapt_cfg_to_device(cpu_cfg, cuda=False)
    assert any('CPUAmpOptimWrapper' in n for n in notes), notes
    wrapper = build_optim_wrapper(model, cpu_cfg.optim_wrapper)
    assert type(wrapper) is CPUAmpOptimWrapper and wrapper.cast_dtype == torch.bfloat16
    with wrapper.optim_context(model):  # the forward runs under bf16 autocast
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    setting = {}
    by_id = {id(p): n for n, p in model.named_parameters()}
    for group in wrapper.optimizer.param_groups:
        for p in group['params']:
            setting[by_id[id(p)]] = (group['lr'] / 6e-5, group['weight_decay'] / 0.01)
    assert len(setting) == len(by_id)
    x10 = {n for n, (lr, _) in setting.items() if abs(lr - 10) < 1e-6}
    for n, (lr, wd) in setting.items():
        assert abs(lr - 1) < 1e-6 or abs(lr - 10) < 1e-6, (n, lr)
        if 'norm' in n:  # backbone LayerNorms: no decay
            assert wd == 0, n
    if name.startswith('upernet'):
        assert not x10  # the released UperNet recipe has no multipliers
        return
    head = {n for n in setting if n.startswith('decode_head.')}
    assert head <= x10
    for n in head:
        is_norm = '.bn.' in n or n.startswith(('decode_head.k.2', 'decode_head.v.2'))
        assert setting[n][1] == (0 if is_norm else 1), n
    cluster_layers = {n for n in x10 if not n.startswith('decode_head.')}
    arch = cfg.model.backbone.arch
    if 'convmixer' in arch:
        expected = {n for n in setting if '.to_clusters' in n}
        assert len(expected) == 8  # weight + bias of 4 stages
    elif 'p2cmlp' in arch:
        expected = {n for n in setting if n.endswith(('clustering.clustering.2.weight',
                                                      'clustering.clustering.2.bias'))}
        assert len(expected) == 6
    else:
        expected = {n for n in setting if n.endswith('clustering.clustering.4.weight')}
        # the conv variant's middle PWConv is 'clustering.clustering.2' and keeps lr x1
        assert not any('clustering.clustering.2' in n for n in cluster_layers)
        # one per clustering block: the first block of each stage with clusters, or all
        # blocks for block-wise sharing
        assert len(expected) == (3 + 3 + 10 + 3 if 'blockwise' in arch else
                                 sum(m > 0 for m in cfg.model.backbone.num_clusters))
    assert cluster_layers == expected


def test_demo_config_is_cpu_friendly():
    cfg = Config.fromfile(DEMO[0])
    assert cfg.model.backbone.arch == 'pacavit_tiny_p2cconv_100_0'  # the real tiny arch
    assert cfg.model.decode_head.type == 'PaCaHead'
    assert cfg.model.decode_head.norm_cfg.type == 'BN'
    assert cfg.model.decode_head.num_classes == len(cfg.classes) == 4
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    assert cfg.train_dataloader.dataset.reduce_zero_label is False
    assert cfg.optim_wrapper.type == 'OptimWrapper'  # the CPU demo stays fp32


@pytest.mark.parametrize('name', ['paca_head/pacahead_pacavit_tiny_p2cconv_100_0',
                                  'upernet/upernet_pacavit_tiny_p2cconv_100_0'])
def test_unadapted_config_builds_fp16_amp_wrapper(name, monkeypatch):
    """Without our tools' adaptation the config gives mmengine's AmpOptimWrapper: on this
    machine it refuses to build (no CUDA); reported CUDA present, it is the fp16 wrapper
    with a dynamic GradScaler and the same parameter groups as the CPU one."""
    import mmengine.optim.optimizer.amp_optimizer_wrapper as amp_module
    from torch.cuda.amp import GradScaler
    cfg = Config.fromfile(osp.join(REPO, 'configs', f'{name}_512x512_160k_ade20k.py'))
    model = build(cfg)
    if not torch.cuda.is_available():
        with pytest.raises(AssertionError, match='only available training on gpu'):
            build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    with monkeypatch.context() as m:
        m.setattr(amp_module, 'is_cuda_available', lambda: True)
        gpu = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    assert type(gpu) is AmpOptimWrapper and gpu.cast_dtype is None  # float16 autocast
    assert isinstance(gpu.loss_scaler, GradScaler) and gpu._scale_update_param is None
    adapt_cfg_to_device(cfg, cuda=False)
    cpu = build_optim_wrapper(model, cfg.optim_wrapper)
    assert [(g['lr'], g['weight_decay'], len(g['params'])) for g in gpu.optimizer.param_groups] \
        == [(g['lr'], g['weight_decay'], len(g['params'])) for g in cpu.optimizer.param_groups]


def _lr_wd(model, optim_cfg):
    """{parameter name: (lr, weight decay)} of the wrapper mmengine builds from optim_cfg."""
    wrapper = build_optim_wrapper(model, copy.deepcopy(optim_cfg))
    by_id = {id(p): n for n, p in model.named_parameters()}
    return {by_id[id(p)]: (g['lr'], g['weight_decay'])
            for g in wrapper.optimizer.param_groups for p in g['params']}


# The optimizer rules of the official configs : substring keys only.
OFFICIAL_PARAMWISE = {
    'pacahead': dict(custom_keys={'norm': dict(decay_mult=0.), 'clustering.4': dict(lr_mult=10.),
                                  'head': dict(lr_mult=10.)}),
    'upernet': dict(custom_keys={'norm': dict(decay_mult=0.)}),
}


@pytest.mark.parametrize('name', [
    'paca_head/pacahead_pacavit_tiny_p2cconv_100_0', 'paca_head/pacahead_pacavit_small_p2cmlp_100_0',
    'paca_head/pacahead_pacavit_convmixer_tiny_100', 'upernet/upernet_pacavit_tiny_p2cconv_100_0'])
def test_deliberate_differences_from_the_official_optimizer(name):
    """Per parameter, our (lr, wd) differ from the official rules exactly where
    docs/differences.md says (items 4-8), and nowhere else."""
    from torch.nn.modules.batchnorm import _BatchNorm
    cfg = Config.fromfile(osp.join(REPO, 'configs', f'{name}_512x512_160k_ade20k.py'))
    model = build(cfg)
    adapt_cfg_to_device(cfg, cuda=False)
    ours = _lr_wd(model, cfg.optim_wrapper)
    official_cfg = copy.deepcopy(cfg.optim_wrapper)
    official_cfg.paramwise_cfg = OFFICIAL_PARAMWISE[osp.basename(name).split('_')[0]]
    official = _lr_wd(model, official_cfg)
    lr, wd = 6e-5, 0.01
    bn_params = {f'{m}.{p}' for m, mod in model.named_modules() if isinstance(mod, _BatchNorm)
                 for p, _ in mod.named_parameters(recurse=False)}
    expected = {}
    for n in ours:
        if n in bn_params and n.startswith(('decode_head.', 'auxiliary_head.')):
            head_lr = lr * 10 if name.startswith('paca_head') else lr
            expected[n] = ((head_lr, wd), (head_lr, 0.))  # items 4, 5
        elif n in bn_params and '.paca_teacher.' in n:
            expected[n] = ((lr, wd), (lr, 0.))  # item 6
        elif '.paca_teacher.to_clusters' in n or ('p2cmlp' in name and
                                                  '.clustering.clustering.2.' in n):
            expected[n] = ((lr, wd), (lr * 10, wd))  # items 7, 8
    differ = {n: (official[n], ours[n]) for n in ours
              if official[n] != pytest.approx(ours[n], rel=1e-9)}
    assert set(differ) == set(expected), set(differ) ^ set(expected)
    for n, (off, our) in differ.items():
        assert off == pytest.approx(expected[n][0]) and our == pytest.approx(expected[n][1]), n
    assert expected, 'every one of these configs differs somewhere'
