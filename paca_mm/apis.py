"""Models by name: the metafiles' models in the toolboxes' own APIs.

``import paca_mm`` lists the ImageNet models in mmpretrain's ``ModelHub`` (``list_models``,
``get_model(name, pretrained=True)``, its inferencers), their release URLs loading through
:func:`load_imagenet_release`. mmdet / mmseg resolve names only from mmengine's fixed package
table: :func:`resolve_model` gives (config, weights) for their inferencers.
"""
import difflib
import os.path as osp
import warnings
from typing import List, Optional, Tuple

import yaml

IMAGENET_METAFILE = 'configs/paca_vit_imagenet/metafile.yml'
IMAGENET_RELEASE_URL = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/IMNET_224_'


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


def zoo_models(root: str) -> List[dict]:
    """Every model entry of the metafiles that ``<root>/model-index.yml`` imports, in its
    order."""
    return [m for metafile in _load_yaml(osp.join(root, 'model-index.yml'))['Import']
            for m in _load_yaml(osp.join(root, metafile))['Models']]


def resolve_model(name: str) -> Tuple[str, Optional[str]]:
    """(config path, weights URL or None if none was released) of a model of the metafiles,
    e.g. ``DetInferencer(*resolve_model(name))``; an unknown name raises ``ValueError``
    listing the closest names."""
    root = zoo_root()
    models = {m['Name']: m for m in zoo_models(root)}
    if name not in models:
        close = difflib.get_close_matches(name, list(models), n=5, cutoff=0.5)
        raise ValueError(f'unknown PaCa-ViT model {name!r}; closest names: {close or "none"} '
                         f'(all {len(models)} are in {root}/configs/*/metafile.yml)')
    return osp.join(root, models[name]['Config']), models[name].get('Weights')


def load_imagenet_release(filename: str, map_location=None) -> dict:
    """mmengine ``CheckpointLoader`` scheme for the ``IMNET_224_<model>.pth`` release URLs:
    cached download and weights-only read (``load_from_http``), then official timm keys ->
    classifier keys (:func:`paca_mm.checkpoint.convert_official_to_classifier`)."""
    from .checkpoint import convert_official_to_classifier
    from .checkpoint.loading import load_from_http
    return {'state_dict': convert_official_to_classifier(load_from_http(filename, map_location))}


def register_model_zoo() -> None:
    """Called by ``import paca_mm``: the release scheme, and the ImageNet models in
    mmpretrain's ``ModelHub`` (once: it refuses a name twice; skipped without mmpretrain)."""
    from mmengine.runner import CheckpointLoader
    CheckpointLoader.register_scheme(IMAGENET_RELEASE_URL, load_imagenet_release, force=True)
    try:
        from mmpretrain.apis import ModelHub
        root = zoo_root()
    except ImportError:
        return
    except FileNotFoundError as e:  # a broken install: the modules still register
        warnings.warn(f'paca_mm models are not listed in mmpretrain.list_models: {e}')
        return
    metafile = osp.join(root, IMAGENET_METAFILE)
    if not ModelHub.has(_load_yaml(metafile)['Models'][0]['Name']):
        ModelHub.register_model_index(metafile, config_prefix=root)
