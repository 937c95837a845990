"""ImageNet classification configs, official checkpoint loading, the synthetic dataset and an
end-to-end train/test run through tools/train.py and tools/test.py."""
import glob
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip('mmpretrain')

from mmengine.config import Config  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

import paca_mm  # noqa: E402,F401
from paca_mm.checkpoint import convert_official_to_classifier  # noqa: E402
from demo.datasets.synthetic_cls import (SyntheticClsDataset,  # noqa: E402
                                            class_names, generate_synthetic_cls)
from paca_mm.models.backbones import PaCaViT  # noqa: E402
from paca_mm.engine.cpu import CPUAmpOptimWrapper, adapt_cfg_to_device  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
IMNET_DIR = osp.join(ROOT, 'configs', 'paca_vit_imagenet')
DEMO_CFG = osp.join(ROOT, 'demo', 'configs', 'paca_tiny_synthetic_cls.py')

# parameters with the 1000-class head (exact integers, official code), drop path of the recipe
EXPECTED = {
    'pacavit_tiny_p2cconv_100_0': (12_200_680, 0.1, False),
    'pacavit_small_p2cconv_100_0': (22_037_704, 0.1, False),
    'pacavit_base_p2cconv_100_0': (46_911_304, 0.5, True),
    'pacavit_small_p2cmlp_100_0': (22_637_268, 0.1, False),
    'pacavit_small_p2cconv_2_0': (21_978_120, 0.1, False),
    'pacavit_small_p2cconv_49_0': (22_006_696, 0.1, False),
    'pacavit_small_p2cconv_49_100': (22_227_560, 0.1, False),
    'pacavit_small_p2cconv_100_49': (22_210_696, 0.1, False),
    'pacavit_small_p2cconv_100': (22_245_448, 0.1, False),
    'pacavit_small_p2cconv_100_blockwise': (24_191_944, 0.1, False),
    'pacavit_convmixer_tiny_100': (12_483_672, 0.1, False),
    'pacavit_convmixer_small_100': (21_075_064, 0.1, False),
    'pacavit_convmixer_base_100': (47_659_192, 0.1, True),
}


def _config_files():
    return sorted(glob.glob(osp.join(IMNET_DIR, '*.py')))


def _build(cfg):
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    model_cfg = cfg.model.copy()
    model_cfg.setdefault('data_preprocessor', cfg.get('data_preprocessor'))
    return MODELS.build(model_cfg)


def test_every_preset_has_a_config():
    names = {osp.basename(f)[:-len('_8xb128_in1k.py')] for f in _config_files()}
    assert names == set(EXPECTED)


@pytest.mark.parametrize('path', _config_files(), ids=osp.basename)
def test_imagenet_config_recipe_and_build(path):
    name = osp.basename(path)[:-len('_8xb128_in1k.py')]
    params, drop_path, clip = EXPECTED[name]
    cfg = Config.fromfile(path)
    assert cfg.default_scope == 'mmpretrain'
    assert cfg.custom_imports == dict(imports=['paca_mm'], allow_failed_imports=False)
    # paper Table 5
    opt = cfg.optim_wrapper
    assert opt.type == 'AmpOptimWrapper'
    assert opt.optimizer.type == 'AdamW' and opt.optimizer.lr == 5e-4
    assert opt.optimizer.weight_decay == 0.05 and opt.optimizer.eps == 1e-8
    assert opt.paramwise_cfg.norm_decay_mult == 0 and opt.paramwise_cfg.bias_decay_mult == 0
    assert cfg.auto_scale_lr == dict(base_batch_size=512, enable=True)
    assert cfg.train_dataloader.batch_size == 128
    assert (opt.get('clip_grad') or {}).get('max_norm') == (1.0 if clip else None)
    warm, cos = cfg.param_scheduler
    assert (warm.type, warm.end, warm.start_factor) == ('LinearLR', 5, 1e-3)
    assert (cos.type, cos.begin, cos.end, cos.eta_min_ratio) == \
        ('CosineAnnealingLR', 5, 300, 1e-2)
    assert cfg.train_cfg.max_epochs == 300
    assert cfg.model.head.loss == dict(type='LabelSmoothLoss', label_smooth_val=0.1,
                                       mode='original')
    assert [a['type'] for a in cfg.model.train_cfg.augments] == ['Mixup', 'CutMix']
    assert [a['alpha'] for a in cfg.model.train_cfg.augments] == [0.8, 1.0]
    train_tf = {t['type']: t for t in cfg.train_dataloader.dataset.pipeline}
    assert train_tf['RandAugment']['magnitude_level'] == 9
    assert train_tf['RandAugment']['magnitude_std'] == 0.5
    assert train_tf['RandomErasing']['erase_prob'] == 0.25
    test_tf = {t['type']: t for t in cfg.test_dataloader.dataset.pipeline}
    assert test_tf['ResizeEdge']['scale'] == 248 and test_tf['CenterCrop']['crop_size'] == 224
    assert cfg.val_evaluator == dict(type='Accuracy', topk=(1, 5))
    assert cfg.model.backbone.arch == name
    assert cfg.model.backbone.drop_path_rate == drop_path
    assert cfg.model.backbone.out_indices == (3,)

    model = _build(cfg)
    assert model.backbone.drop_path_rate == drop_path
    assert sum(p.numel() for p in model.parameters()) == params
    assert model.head.fc.in_features == model.backbone.embed_dims[-1]
    model.eval()
    with torch.no_grad():
        logits = model(torch.randn(1, 3, 64, 64), mode='tensor')
    assert logits.shape == (1, 1000) and torch.isfinite(logits).all()


def _official_file(tmp_path, num_classes=10):
    """An official-layout ImageNet file: PaCaViT keys + head.weight/bias, plain dict."""
    torch.manual_seed(0)
    backbone = PaCaViT(arch='tiny', drop_path_rate=0.)
    backbone.init_weights()
    sd = dict(backbone.state_dict())
    sd['head.weight'] = torch.randn(num_classes, 384) * 0.05
    sd['head.bias'] = torch.randn(num_classes) * 0.1
    path = str(tmp_path / 'IMNET_224_pacavit_tiny_p2cconv_100_0.pth')
    torch.save(sd, path)
    return path, backbone.eval(), sd


def test_official_checkpoint_gives_official_logits(tmp_path):
    path, backbone, sd = _official_file(tmp_path)
    x = torch.randn(2, 3, 64, 80)
    with torch.no_grad():
        feat = backbone(x)[-1]  # (B, 384, H/32, W/32), after norm4
        # official head: mean over tokens, then Linear
        expected = F.linear(feat.flatten(2).mean(-1), sd['head.weight'], sd['head.bias'])

    cfg = Config.fromfile(osp.join(IMNET_DIR, 'pacavit_tiny_p2cconv_100_0_8xb128_in1k.py'))
    cfg.model.head.num_classes = 10
    cfg.model.backbone.drop_path_rate = 0.
    model = _build(cfg)
    converted = convert_official_to_classifier(torch.load(path, weights_only=True))
    assert 'head.fc.weight' in converted and 'backbone.patch_embed.norm.weight' in converted
    result = model.load_state_dict(converted, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    model.eval()
    with torch.no_grad():
        logits = model(x, mode='tensor')
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)

    # the tools' loader recognises the official layout and converts it the same way
    from paca_mm.visualization.inference import build_model
    cfg2 = cfg.copy()
    model2 = build_model(cfg2, path)
    with torch.no_grad():
        torch.testing.assert_close(model2(x, mode='tensor'), expected, rtol=1e-5, atol=1e-5)


def test_official_checkpoint_as_backbone_init_cfg(tmp_path):
    """The Pretrained init path loads the backbone part (the official head is dropped)."""
    path, backbone, sd = _official_file(tmp_path)
    cfg = Config.fromfile(osp.join(IMNET_DIR, 'pacavit_tiny_p2cconv_100_0_8xb128_in1k.py'))
    cfg.model.head.num_classes = 10
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=path)
    model = _build(cfg)
    model.init_weights()
    got = model.backbone.state_dict()
    for k, v in backbone.state_dict().items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=0, msg=k)
    assert not torch.equal(model.head.fc.weight, sd['head.weight'])


def test_synthetic_generator(tmp_path):
    root = str(tmp_path / 'cls')
    generate_synthetic_cls(root, num_classes=3, train_per_class=2, val_per_class=1,
                           img_size=32, seed=1)
    files = sorted(glob.glob(osp.join(root, '*', '*', '*.png')))
    assert len(files) == 3 * 2 + 3 * 1
    assert sorted(os.listdir(osp.join(root, 'train'))) == class_names(3)
    blobs = {f: open(f, 'rb').read() for f in files}
    # same arguments: reused untouched; other arguments: refused
    generate_synthetic_cls(root, num_classes=3, train_per_class=2, val_per_class=1,
                           img_size=32, seed=1)
    assert all(open(f, 'rb').read() == b for f, b in blobs.items())
    with pytest.raises(FileExistsError, match='other arguments'):
        generate_synthetic_cls(root, num_classes=3, train_per_class=2, val_per_class=1,
                               img_size=32, seed=2)
    # deterministic: an identical second copy
    root2 = str(tmp_path / 'cls2')
    generate_synthetic_cls(root2, num_classes=3, train_per_class=2, val_per_class=1,
                           img_size=32, seed=1)
    for f, b in blobs.items():
        assert open(f.replace(root, root2), 'rb').read() == b
    import cv2
    img = cv2.imread(files[0])
    assert img.shape == (32, 32, 3)
    with pytest.raises(ValueError):
        generate_synthetic_cls(str(tmp_path / 'bad'), num_classes=1)


def test_synthetic_dataset_labels(tmp_path):
    root = str(tmp_path / 'cls')
    ds = SyntheticClsDataset(data_root=root, split='val', num_classes=4, train_per_class=2,
                             val_per_class=3, img_size=32,
                             pipeline=[dict(type='LoadImageFromFile'), dict(type='PackInputs')])
    assert len(ds) == 12
    assert list(ds.metainfo['classes']) == class_names(4)
    labels = [ds.get_data_info(i)['gt_label'] for i in range(len(ds))]
    assert sorted(np.bincount(labels).tolist()) == [3, 3, 3, 3]
    for i in range(len(ds)):
        info = ds.get_data_info(i)
        assert osp.basename(osp.dirname(info['img_path'])) == class_names(4)[info['gt_label']]
    sample = ds[0]
    assert sample['inputs'].shape == (3, 32, 32)
    from mmpretrain.registry import DATASETS
    assert DATASETS.get('PaCaSyntheticCls') is SyntheticClsDataset
    with pytest.raises(ValueError, match='split'):
        SyntheticClsDataset(data_root=root, split='test')


def _run_tool(args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable] + args, cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
def test_train_then_test_end_to_end(demo_cls):
    """tools/train.py (2 epochs on the tiny generated dataset, cluster hook on: the
    session's ``demo_cls``) then tools/test.py (top-1 with mmpretrain's Accuracy)."""
    work_dir, opts = demo_cls['work_dir'], demo_cls['options']
    ckpt = osp.join(work_dir, 'epoch_2.pth')
    assert osp.isfile(ckpt)
    # the cluster hook wrote heatmaps every 2 iterations (4 classes x 8 / batch 16 = 2 iters
    # per epoch -> iterations 2 and 4)
    pngs = sorted(glob.glob(osp.join(work_dir, 'cluster_vis', '*.png')))
    assert [osp.basename(p) for p in pngs] == ['iter_000002_stage1.png',
                                               'iter_000004_stage1.png']
    out = _run_tool([osp.join(ROOT, 'tools', 'test.py'), DEMO_CFG, ckpt, '--work-dir',
                     work_dir, '--cfg-options'] + opts, cwd=demo_cls['cwd'])
    assert 'accuracy/top1' in out
    results = glob.glob(osp.join(work_dir, '*', '*.json'))
    metrics = [json.load(open(f)) for f in results]
    top1 = [m['accuracy/top1'] for m in metrics if 'accuracy/top1' in m]
    assert top1 and all(0.0 <= t <= 100.0 for t in top1)


def test_imagenet_pipelines_optimizer_and_schedule():
    """The shared recipe builds: augmentation pipelines run, no weight decay on 1-D params,
    and the lr curve is warm-up 5e-7 -> 5e-4 (5 epochs) -> cosine to 5e-6 (at batch 512)."""
    from mmengine.dataset import Compose
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import PARAM_SCHEDULERS
    cfg = Config.fromfile(osp.join(IMNET_DIR, 'pacavit_tiny_p2cconv_100_0_8xb128_in1k.py'))
    init_default_scope('mmpretrain')
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(300, 400, 3), dtype=np.uint8)
    for key, shape in (('train_dataloader', (3, 224, 224)), ('test_dataloader', (3, 224, 224))):
        pipeline = [t for t in cfg[key].dataset.pipeline if t['type'] != 'LoadImageFromFile']
        out = Compose(pipeline)(dict(img=img.copy(), img_shape=img.shape[:2],
                                     ori_shape=img.shape[:2]))
        assert tuple(out['inputs'].shape) == shape

    model = _build(cfg)
    # as the Runner builds it on this machine after tools/train.py's adaptation
    # (mmengine's AmpOptimWrapper needs CUDA; on a CPU it becomes bf16 CPUAmpOptimWrapper)
    adapt_cfg_to_device(cfg, cuda=False)
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    assert type(wrapper) is CPUAmpOptimWrapper and wrapper.cast_dtype == torch.bfloat16
    optim = wrapper.optimizer
    names = {id(p): n for n, p in model.named_parameters()}
    checked = 0
    for group in optim.param_groups:
        for p in group['params']:
            expected = 0.0 if p.ndim == 1 else 0.05
            assert group['weight_decay'] == expected, names[id(p)]
            checked += 1
    assert checked == len(list(model.parameters()))

    epoch_len = 4
    scheds = []
    for s in cfg.param_scheduler:
        s = dict(s)
        cls = PARAM_SCHEDULERS.get(s.pop('type'))
        s.pop('convert_to_iter_based')
        scheds.append(cls.build_iter_from_epoch(optim, epoch_length=epoch_len, **s))
    lrs = []
    for _ in range(300 * epoch_len):
        lrs.append(optim.param_groups[0]['lr'])
        optim.step()
        for s in scheds:
            s.step()
    assert lrs[0] == pytest.approx(5e-7)
    assert max(lrs) == pytest.approx(5e-4, rel=1e-3)
    assert lrs[5 * epoch_len] == pytest.approx(5e-4)  # the cosine starts at the peak
    assert all(a < b for a, b in zip(lrs[:5 * epoch_len - 1], lrs[1:5 * epoch_len]))
    assert lrs[-1] == pytest.approx(5e-6, rel=0.05)
    assert all(a >= b for a, b in zip(lrs[5 * epoch_len:], lrs[5 * epoch_len + 1:]))


@pytest.mark.slow
def test_imagenet_recipe_runs_through_the_runner(tmp_path):
    """One iteration of the full ImageNet recipe (RandAugment, random erasing, mixup/cutmix,
    label smoothing, AMP -> bf16 on CPU, auto-scaled lr) on 4 generated 224 crops."""
    data_root = str(tmp_path / 'data')
    generate_synthetic_cls(data_root, num_classes=4, train_per_class=1, val_per_class=1,
                           img_size=96)
    cfg_file = tmp_path / 'in1k_smoke.py'
    base = osp.join(IMNET_DIR, 'pacavit_tiny_p2cconv_100_0_8xb128_in1k.py')
    cfg_file.write_text(f"""_base_ = [{base!r}]
_ds = dict(_delete_=True, type='CustomDataset', data_root={data_root!r})
train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,
                        dataset=dict(**_ds, data_prefix='train',
                                     pipeline={{{{_base_.train_pipeline}}}}))
val_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,
                      dataset=dict(**_ds, data_prefix='val',
                                   pipeline={{{{_base_.test_pipeline}}}}))
test_dataloader = val_dataloader
train_cfg = dict(max_epochs=1)
default_hooks = dict(logger=dict(interval=1))
""")
    work_dir = str(tmp_path / 'work')
    out = _run_tool([osp.join(ROOT, 'tools', 'train.py'), str(cfg_file), '--work-dir',
                     work_dir], cwd=str(tmp_path))
    # warm-up start lr 5e-7 at batch 512, scaled to the real batch 4
    assert f'lr: {5e-7 * 4 / 512:.4e}' in out
    loss = [float(line.split('loss: ')[1].split()[0]) for line in out.splitlines()
            if 'Epoch(train)' in line and 'loss: ' in line]
    assert len(loss) == 1 and np.isfinite(loss[0])
    assert 'accuracy/top1' in out and osp.isfile(osp.join(work_dir, 'epoch_1.pth'))
