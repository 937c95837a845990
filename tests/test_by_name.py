"""Models by name (paca_mm.apis): the ImageNet models in mmpretrain's ModelHub (list_models,
get_model, ImageClassificationInferencer, FeatureExtractor) with the official releases
converted on the fly, and resolve_model for mmdet's / mmseg's inferencers. Downloads are
served from local files."""
import glob
import os.path as osp
import shutil

import numpy as np
import pytest
import torch
import yaml
from mmengine.registry import DefaultScope

import paca_mm  # noqa: F401
from paca_mm.apis import resolve_model
from paca_mm.checkpoint import CheckpointError
from paca_mm.models.backbones import PaCaViT

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
with open(osp.join(ROOT, 'configs', 'paca_vit_imagenet', 'metafile.yml')) as f:
    IMAGENET = {m['Name']: m for m in yaml.safe_load(f)['Models']}
TINY = 'pacavit_tiny_p2cconv_100_0_8xb128_in1k'
DET = 'mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco'
SEG = 'pacahead_pacavit_tiny_p2cconv_100_0_512x512_160k_ade20k'


@pytest.fixture(autouse=True)
def _mmpretrain_scope():
    """A fresh user process has no default scope; a test before may have left another
    toolbox's (the inferencers then look their transforms up in the wrong registry)."""
    with DefaultScope.overwrite_default_scope(None):
        yield


class _Served(dict):
    """url -> local file served for it; ``urls``: the URLs downloaded, in order."""
    def __init__(self):
        super().__init__()
        self.urls = []

    def download(self, url, dst, *args, **kwargs):
        self.urls.append(url)
        shutil.copy(self[url], dst)  # an unknown URL fails (KeyError): no network


@pytest.fixture
def served(tmp_path, monkeypatch):
    """``served[url] = path``: downloads of url copy path, into a fresh torch hub cache."""
    import torch.hub
    served = _Served()
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    monkeypatch.setattr(torch.hub, 'download_url_to_file', served.download)
    return served


@pytest.fixture(scope='module')
def official_tiny(tmp_path_factory):
    """An official-layout IMNET_224 release of pacavit_tiny (timm keys + head.*), random, and
    the same file wrapped by a DDP training script ({'model': {'module.' + key}})."""
    torch.manual_seed(0)
    sd = dict(PaCaViT(arch='tiny').state_dict())
    sd['head.weight'] = torch.randn(1000, 384) * 0.05
    sd['head.bias'] = torch.randn(1000)
    base = tmp_path_factory.mktemp('release')
    plain, wrapped = str(base / 'plain.pth'), str(base / 'wrapped.pth')
    torch.save(sd, plain)
    torch.save({'model': {'module.' + k: v for k, v in sd.items()}, 'epoch': 300}, wrapped)
    return sd, plain, wrapped


def _check_classifier(model, sd):
    """The official tensors sit in the classifier's parameters (timm key -> backbone.key,
    head.* -> head.fc.*), every one of them."""
    msd = model.state_dict()
    assert set(msd) == {'backbone.' + k for k in sd if not k.startswith('head.')} | \
        {'head.fc.weight', 'head.fc.bias'}
    for k, v in sd.items():
        assert torch.equal(msd['head.fc.' + k[5:] if k.startswith('head.') else 'backbone.' + k],
                           v), k


def test_list_models_lists_the_13_imagenet_configs():
    import mmpretrain
    from mmpretrain.apis import ModelHub

    from paca_mm.registry import register_all
    stems = {osp.basename(p)[:-3]
             for p in glob.glob(osp.join(ROOT, 'configs', 'paca_vit_imagenet', '*.py'))}
    assert len(stems) == 13
    assert set(mmpretrain.list_models('*paca*')) == stems == set(IMAGENET)
    register_all()  # a second registration is a no-op (ModelHub raises on a repeated name)
    assert len(mmpretrain.list_models('*paca*')) == 13
    # only the classifiers: detectors/segmentors are not mmpretrain models
    assert not mmpretrain.list_models('mask_rcnn_paca') + mmpretrain.list_models('upernet_pac')
    meta = ModelHub.get(TINY)
    # the checkout's file, or its link in paca_mm/.mim of an editable install
    assert osp.realpath(meta.config.filename) == osp.join(ROOT, IMAGENET[TINY]['Config'])
    assert meta.weights == IMAGENET[TINY]['Converted From']['Weights']
    # the model without a release has no weights
    assert {n for n, m in IMAGENET.items() if 'Weights' not in m} == {
        'pacavit_convmixer_tiny_100_8xb128_in1k'}


def test_get_model_builds_every_imagenet_model():
    from mmpretrain import get_model
    for name, entry in IMAGENET.items():
        model = get_model(name)
        assert type(model.backbone).__name__ == 'PaCaViT', name
        assert sum(p.numel() for p in model.parameters()) == entry['Metadata']['Parameters']
        assert not model.training
    with torch.no_grad():  # (the tiny one runs in the tests below; forwards cost seconds)
        assert model(torch.randn(1, 3, 32, 32), mode='tensor').shape == (1, 1000), name


@pytest.mark.parametrize('layout', ['plain', 'wrapped'])
def test_pretrained_loads_the_release_converted(official_tiny, served, layout):
    from mmpretrain import get_model
    sd, plain, wrapped = official_tiny
    url = IMAGENET[TINY]['Weights']
    assert url == f'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_' \
        f'{TINY.replace("_8xb128_in1k", "")}.pth'
    served[url] = plain if layout == 'plain' else wrapped
    model = get_model(TINY, pretrained=True)
    assert served.urls == [url]
    _check_classifier(model, sd)
    if layout == 'wrapped':
        return
    # the logits are the official model's: mean of the last stage's tokens, then Linear
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        feat = model.backbone(x)[-1].flatten(2).mean(-1)
        torch.testing.assert_close(model(x, mode='tensor'),
                                   torch.nn.functional.linear(feat, sd['head.weight'],
                                                              sd['head.bias']))


def test_release_urls_load_weights_only(tmp_path, served):
    """The release scheme reads weights-only like every other loader: a file that pickles
    another object is refused, not unpickled."""
    import fractions

    from mmpretrain import get_model
    bad = str(tmp_path / 'bad.pth')
    torch.save({'head.bias': torch.zeros(2), 'x': fractions.Fraction(1, 3)}, bad)
    served[IMAGENET[TINY]['Weights']] = bad
    with pytest.raises(CheckpointError, match='fractions.Fraction'):
        get_model(TINY, pretrained=True)


def test_inferencer_and_feature_extractor_by_name(official_tiny, served):
    from mmpretrain import FeatureExtractor, ImageClassificationInferencer
    sd, plain, _ = official_tiny
    served[IMAGENET[TINY]['Weights']] = plain
    img = np.random.default_rng(0).integers(0, 255, (40, 48, 3), dtype=np.uint8)
    inferencer = ImageClassificationInferencer(TINY, device='cpu')
    _check_classifier(inferencer.model, sd)
    (result, ) = inferencer(img)
    assert len(inferencer.classes) == 1000  # ImageNet's, from the config's dataset
    scores = np.asarray(result['pred_scores'])
    assert result['pred_label'] == int(scores.argmax())
    assert result['pred_class'] == inferencer.classes[result['pred_label']]

    extractor = FeatureExtractor(TINY, device='cpu')
    _check_classifier(extractor.model, sd)
    (feats, ) = extractor(img)
    # the classifier's features: the last stage, average-pooled by the neck
    assert [tuple(f.shape) for f in feats] == [(384, )]
    torch.testing.assert_close(
        torch.nn.functional.linear(feats[0], sd['head.weight'], sd['head.bias']).softmax(-1),
        torch.as_tensor(scores), rtol=1e-4, atol=1e-6)


def test_resolve_model_names_config_and_weights():
    config, weights = resolve_model(DET)
    assert osp.realpath(config) == osp.join(ROOT, 'configs', 'mask_rcnn', DET + '.py')
    assert weights == f'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/{DET}.pth'
    config, weights = resolve_model(TINY)
    assert (osp.realpath(config), weights) == (osp.join(ROOT, IMAGENET[TINY]['Config']),
                                               IMAGENET[TINY]['Weights'])
    assert resolve_model('pacavit_convmixer_tiny_100_8xb128_in1k')[1] is None  # no release
    with pytest.raises(ValueError, match='unknown PaCa-ViT model') as e:
        resolve_model('mask_rcnn_pacavit_tiny')
    assert DET in str(e.value)  # the closest names are listed


def _saved_weights(model, path):
    """Save ``model``'s (random) weights as an mmengine checkpoint; returns the state_dict."""
    torch.manual_seed(1)
    sd = {k: torch.randn_like(v) if v.is_floating_point() else v
          for k, v in model.state_dict().items()}
    torch.save({'state_dict': sd, 'meta': {}}, path)
    return sd


def _check_loaded(model, sd):
    msd = model.state_dict()
    assert set(msd) == set(sd)
    assert all(torch.equal(msd[k], v) for k, v in sd.items())


def test_det_inferencer_by_config_and_by_name(tmp_path, served):
    from mmdet.apis import DetInferencer, init_detector
    from mmengine.config import Config
    tiny = Config.fromfile(osp.join(ROOT, 'tests', 'data', 'image_demo_tiny_mask_rcnn.py'))
    tiny.visualizer = dict(type='DetLocalVisualizer')  # DetInferencer needs one
    ckpt = str(tmp_path / 'tiny.pth')
    sd = _saved_weights(init_detector(tiny, device='cpu'), ckpt)
    inferencer = DetInferencer(model=tiny, weights=ckpt, device='cpu')
    _check_loaded(inferencer.model, sd)
    img = np.random.default_rng(0).integers(0, 255, (64, 80, 3), dtype=np.uint8)
    pred = inferencer(img, no_save_vis=True)['predictions'][0]
    assert len(pred['scores']) == len(pred['labels']) == len(pred['bboxes'])

    config, weights = resolve_model(DET)
    served[weights] = str(tmp_path / 'det.pth')
    sd = _saved_weights(init_detector(config, device='cpu'), served[weights])
    _check_loaded(DetInferencer(*resolve_model(DET), device='cpu').model, sd)
    assert served.urls == [weights]


def test_seg_inferencer_by_config_and_by_name(tmp_path, served):
    from mmseg.apis import MMSegInferencer, init_model
    tiny = osp.join(ROOT, 'tests', 'data', 'tools_tiny_seg.py')
    ckpt = str(tmp_path / 'tiny.pth')
    sd = _saved_weights(init_model(tiny, device='cpu'), ckpt)
    inferencer = MMSegInferencer(model=tiny, weights=ckpt, device='cpu')
    _check_loaded(inferencer.model, sd)
    img = np.random.default_rng(0).integers(0, 255, (32, 40, 3), dtype=np.uint8)
    pred = inferencer(img)['predictions']
    assert pred.shape == (32, 40)

    config, weights = resolve_model(SEG)
    served[weights] = str(tmp_path / 'seg.pth')
    sd = _saved_weights(init_model(config, device='cpu'), served[weights])
    _check_loaded(MMSegInferencer(*resolve_model(SEG), device='cpu').model, sd)
    _check_loaded(init_model(config, weights, device='cpu'), sd)
    assert served.urls == [weights]  # downloaded once, then cached
