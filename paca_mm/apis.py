"""Models by name: the model zoo of the metafiles in the toolboxes' own APIs.

* mmpretrain: ``import paca_mm`` registers the ImageNet models
  (configs/paca_vit_imagenet/metafile.yml) with ``mmpretrain.apis.ModelHub``, so
  ``list_models('*pacavit*')``, ``get_model(name, pretrained=True)``,
  ``ImageClassificationInferencer(name)`` and ``FeatureExtractor(name)`` work. Their weights
  are the official timm-layout releases; :func:`load_imagenet_release`, an mmengine
  ``CheckpointLoader`` scheme for exactly those URLs, loads them weights-only and converted
  to the classifier layout wherever mmengine loads them (``load_checkpoint``, ``load_from``,
  ``init_cfg``).
* mmdet / mmseg look names up in mmengine's fixed package table only:
  :func:`resolve_model` gives (config path, weights URL) for ``DetInferencer`` /
  ``MMSegInferencer`` / ``init_detector`` / ``init_model``.
"""
import difflib
import os.path as osp
import warnings
from typing import Dict, Optional, Tuple

import yaml

IMAGENET_METAFILE = 'configs/paca_vit_imagenet/metafile.yml'
RELEASE_URL = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/'
IMAGENET_RELEASE_URL = RELEASE_URL + 'IMNET_224_'


def zoo_root() -> str:
    """The folder with model-index.yml and configs/: ``paca_mm/.mim`` of an installed (or
    editable) package, else the checkout that holds this package."""
    package = osp.dirname(osp.abspath(__file__))
    for root in (osp.join(package, '.mim'), osp.dirname(package)):
        if osp.isfile(osp.join(root, 'model-index.yml')):
            return root
    raise FileNotFoundError(
        f'model-index.yml is neither in {osp.join(package, ".mim")} nor beside {package}: '
        'reinstall paca_mm (pip install . or pip install -e .), which packs configs/ and '
        'model-index.yml into paca_mm/.mim')


def _load_yaml(path: str):
    with open(path) as f:
        return yaml.safe_load(f)


def zoo_models() -> Dict[str, dict]:
    """Name -> metafile entry of every model that model-index.yml imports."""
    root = zoo_root()
    return {m['Name']: m for metafile in _load_yaml(osp.join(root, 'model-index.yml'))['Import']
            for m in _load_yaml(osp.join(root, metafile))['Models']}


def resolve_model(name: str) -> Tuple[str, Optional[str]]:
    """(config path, weights URL or None if none was released) of a model-zoo name, e.g.
    ``DetInferencer(*resolve_model('mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_'
    '1x_coco'))``. An unknown name raises ``ValueError`` listing the closest names."""
    models = zoo_models()
    if name not in models:
        close = difflib.get_close_matches(name, list(models), n=5, cutoff=0.5)
        raise ValueError(f'unknown PaCa-ViT model {name!r}; closest names: {close or "none"} '
                         f'(all {len(models)} are listed in {osp.join(zoo_root(), "configs")}'
                         '/*/metafile.yml)')
    return osp.join(zoo_root(), models[name]['Config']), models[name].get('Weights')


def load_imagenet_release(filename: str, map_location=None) -> dict:
    """mmengine ``CheckpointLoader`` scheme for the official ImageNet releases
    (``IMNET_224_<model>.pth`` URLs): cached download, weights-only load
    (:func:`paca_mm.checkpoint.loading.load_from_http`), official timm layout -> classifier
    keys (:func:`paca_mm.checkpoint.convert_official_to_classifier`)."""
    from .checkpoint import convert_official_to_classifier
    from .checkpoint.loading import load_from_http
    return {'state_dict': convert_official_to_classifier(load_from_http(filename, map_location))}


def register_model_zoo() -> None:
    """Called by ``import paca_mm``: the release scheme above, and the ImageNet models in
    mmpretrain's ``ModelHub`` (once; skipped without mmpretrain)."""
    from mmengine.runner import CheckpointLoader
    CheckpointLoader.register_scheme(IMAGENET_RELEASE_URL, load_imagenet_release, force=True)
    try:
        from mmpretrain.apis import ModelHub
    except ImportError:
        return
    try:
        root = zoo_root()
    except FileNotFoundError as e:  # a broken install: the modules still register
        warnings.warn(f'paca_mm models are not listed in mmpretrain.list_models: {e}')
        return
    metafile = osp.join(root, IMAGENET_METAFILE)
    if not ModelHub.has(_load_yaml(metafile)['Models'][0]['Name']):
        ModelHub.register_model_index(metafile, config_prefix=root)
