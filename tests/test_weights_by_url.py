"""The released ImageNet weights, named by URL.

Every downstream config (Mask R-CNN, PaCa head, UperNet) names its backbone's official
ImageNet release by URL in ``init_cfg``, and the metafiles list the same files as ``Weights``.
``init_weights()`` downloads the URL once into torch's hub cache and reads it weights-only.
The download is served from a local file here: ``torch.hub.download_url_to_file``, which
paca_mm's http loader calls, is replaced; everything above it (config, backbone,
``init_weights``, cache, safe loader) is the real code path.
"""
import glob
import os
import os.path as osp
import shlex
import shutil

import pytest
import torch
import yaml
from mmengine.config import Config

import paca_mm  # noqa: F401  (installs the safe checkpoint loaders)
from paca_mm.checkpoint import CheckpointError
from paca_mm.models.backbones import PaCaViT

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
RELEASE = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/'
DOWNSTREAM = sorted(p for d in ('mask_rcnn', 'paca_head', 'upernet')
                    for p in glob.glob(osp.join(ROOT, 'configs', d, '*.py')))
IMAGENET_META = osp.join(ROOT, 'configs', 'paca_vit_imagenet', 'metafile.yml')
# the ImageNet-1k models of paper Tables 1 and 4, all released as IMNET_224_<model>.pth
RELEASED = {f'pacavit_{m}' for m in (
    'tiny_p2cconv_100_0', 'small_p2cconv_100_0', 'small_p2cmlp_100_0', 'convmixer_small_100',
    'base_p2cconv_100_0', 'convmixer_base_100', 'small_p2cconv_2_0', 'small_p2cconv_49_0',
    'small_p2cconv_49_100', 'small_p2cconv_100_49', 'small_p2cconv_100',
    'small_p2cconv_100_blockwise')}
# the configs' backbones are shrunk (the random init of PaCa-Tiny takes seconds)
SMALL_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8])
DET_TINY = osp.join(ROOT, 'configs', 'mask_rcnn',
                    'mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py')
SEG_SMALL_100 = osp.join(ROOT, 'configs', 'paca_head',
                         'pacahead_pacavit_small_p2cconv_100_512x512_160k_ade20k.py')


def _models(path):
    with open(path) as f:
        return yaml.safe_load(f)['Models']


# {arch: Weights URL} of the ImageNet metafile (arch = the model name without the recipe)
IMAGENET_WEIGHTS = {m['Name'][:-len('_8xb128_in1k')]: m.get('Weights')
                    for m in _models(IMAGENET_META)}


def test_metafiles_weights():
    for path in glob.glob(osp.join(ROOT, 'configs', '*', 'metafile.yml')):
        for model in _models(path):
            released = 'Converted From' in model
            assert ('Weights' in model) == released, model['Name']
            if released:
                assert model['Weights'] == model['Converted From']['Weights'], model['Name']
                assert model['Weights'].startswith(RELEASE), model['Name']
    assert {a for a, w in IMAGENET_WEIGHTS.items() if w} == RELEASED
    for arch in RELEASED:  # the file is named after the model (also M = 100 x 4)
        assert IMAGENET_WEIGHTS[arch] == f'{RELEASE}IMNET_224_{arch}.pth'


@pytest.mark.parametrize('path', DOWNSTREAM, ids=lambda p: osp.basename(p)[:-3])
def test_downstream_config_names_the_released_imagenet_file(path):
    backbone = Config.fromfile(path).model.backbone
    checkpoint = backbone.init_cfg.checkpoint
    assert backbone.init_cfg.type == 'Pretrained'
    if backbone.arch in RELEASED:
        assert checkpoint == IMAGENET_WEIGHTS[backbone.arch]
    else:  # no released file: a local path, said so in the config
        assert backbone.arch == 'pacavit_convmixer_tiny_100'
        assert checkpoint == 'checkpoints/IMNET_224_pacavit_convmixer_tiny_100.pth'


@pytest.fixture
def serve(tmp_path, monkeypatch):
    """``serve(url, file)``: the download of ``url`` copies ``file``; any other URL fails.
    torch's hub folder is a fresh one. Returns the list of downloaded URLs."""
    files, downloads = {}, []

    def download(url, dst, *args, **kwargs):
        assert url in files, f'no network in tests: {url}'
        downloads.append(url)
        shutil.copyfile(files[url], dst)

    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    monkeypatch.setattr(torch.hub, '_hub_dir', None)
    monkeypatch.setattr(torch.hub, 'download_url_to_file', download)

    def add(url, path):
        files[url] = str(path)
        return downloads

    return add


def _backbone(path, **options):
    """The backbone of a config as the toolboxes build it, shrunk, with ``--cfg-options``."""
    cfg = Config.fromfile(path)
    cfg.merge_from_dict({'model.backbone.arch': dict(SMALL_ARCH, _delete_=True), **options})
    kwargs = dict(cfg.model.backbone)
    assert kwargs.pop('type') == 'PaCaViT'
    return PaCaViT(**kwargs)


def _release_file(path, config, seed):
    """A file in the released layout for the (shrunk) backbone of ``config``: random values
    for every tensor, plus the classifier ``head.*``."""
    torch.manual_seed(seed)
    sd = {k: torch.randn(v.shape) for k, v in _backbone(config).state_dict().items()}
    torch.save(dict(sd, **{'head.weight': torch.randn(1000, SMALL_ARCH['embed_dims'][-1]),
                           'head.bias': torch.randn(1000)}), str(path))
    return sd


def _assert_loaded(model, expected):
    got = model.state_dict()
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert torch.equal(got[k], v), k


def test_init_weights_downloads_once_and_loads_the_release(tmp_path, serve):
    url = f'{RELEASE}IMNET_224_pacavit_tiny_p2cconv_100_0.pth'
    expected = _release_file(tmp_path / 'served.pth', DET_TINY, seed=1)
    downloads = serve(url, tmp_path / 'served.pth')
    model = _backbone(DET_TINY)
    assert model.init_cfg['checkpoint'] == url
    model.init_weights()
    _assert_loaded(model, expected)
    cached = osp.join(str(tmp_path), 'torch_home', 'hub', 'checkpoints', osp.basename(url))
    assert downloads == [url] and osp.isfile(cached)
    # a second model reads the cache; a local copy replaces the URL as --cfg-options does
    _backbone(DET_TINY).init_weights()
    local = tmp_path / 'my_copy.pth'
    other = _release_file(local, DET_TINY, seed=2)
    model = _backbone(DET_TINY, **{'model.backbone.init_cfg.checkpoint': str(local)})
    model.init_weights()
    _assert_loaded(model, other)
    assert downloads == [url]


class _System:
    """Unpickling runs ``os.system('touch MARKER')``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, ('touch ' + shlex.quote(self.marker),)


def test_payload_served_at_the_url_is_refused(tmp_path, serve):
    url = f'{RELEASE}IMNET_224_pacavit_small_p2cconv_100.pth'
    marker = tmp_path / 'marker'
    torch.save(dict(state_dict={'patch_embed.proj.weight': torch.zeros(1)},
                    meta=dict(evil=_System(marker))), str(tmp_path / 'payload.pth'))
    downloads = serve(url, tmp_path / 'payload.pth')
    model = _backbone(SEG_SMALL_100)
    assert model.init_cfg['checkpoint'] == url
    with pytest.raises(CheckpointError, match='refusing to load checkpoint') as e:
        model.init_weights()
    assert url in str(e.value) and f'{os.system.__module__}.system' in str(e.value)
    assert downloads == [url] and not marker.exists()
    # the payload is live: unpickled in full it runs
    torch.load(str(tmp_path / 'payload.pth'), weights_only=False)
    assert marker.exists()
