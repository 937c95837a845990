"""Config -> model (+ checkpoint), what kind of model it is, and image -> network-input
pixels, for mmpretrain, mmdet and mmseg models (the toolbox is the config's ``default_scope``).
"""
import copy
import importlib
import os.path as osp
from typing import Optional, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.logging import print_log

from ..registry import get_scope

MODEL_KINDS = {('mmdet', 'BaseDetector'): 'detector', ('mmseg', 'BaseSegmentor'): 'segmentor',
               ('mmpretrain', 'BaseClassifier'): 'classifier'}


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP-style (and TTA) ``.module`` wrappers."""
    while isinstance(getattr(model, 'module', None), nn.Module) and \
            not hasattr(model, 'data_preprocessor') and not hasattr(model, 'record_clusters'):
        model = model.module
    return model


def model_kind(model: nn.Module) -> str:
    """'detector', 'segmentor' or 'classifier' for a model (or a wrapper of one) derived
    from mmdet's, mmseg's or mmpretrain's base class of that name, else 'model'."""
    for cls in type(unwrap(model)).__mro__:
        kind = MODEL_KINDS.get((cls.__module__.split('.')[0], cls.__name__))
        if kind:
            return kind
    return 'model'


def normalize_inputs(model: nn.Module, raw: torch.Tensor) -> torch.Tensor:
    """Apply the model's data_preprocessor channel order and mean/std (no padding) to raw
    (B, 3, H, W) pixels, BGR in [0, 255] as LoadImageFromFile + Pack* produce them.
    Traceable: the ONNX export (:mod:`paca_mm.deployment`) puts it into the graph."""
    if raw.dim() != 4:
        raise ValueError(f'expected (B, 3, H, W) raw images, got shape {tuple(raw.shape)}')
    dp = getattr(unwrap(model), 'data_preprocessor', None)
    x = raw.float()
    if any(getattr(dp, a, False) for a in ('_channel_conversion', 'channel_conversion', 'to_rgb')):
        x = x.flip(1)  # BGR <-> RGB
    mean, std = getattr(dp, 'mean', None), getattr(dp, 'std', None)
    if getattr(dp, '_enable_normalize', mean is not None) and mean is not None:
        x = (x - mean.to(x).view(1, -1, 1, 1)) / std.to(x).view(1, -1, 1, 1)
    return x


def load_config(config: Union[str, Config], cfg_options: Optional[dict] = None) -> Config:
    """Read a config (importing its ``custom_imports``; ``paca_mm`` always) and merge options."""
    import paca_mm  # noqa: F401  (registers PaCaViT and friends)
    cfg = Config.fromfile(config) if isinstance(config, str) else copy.deepcopy(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def strip_pretrained(model_cfg):
    """Drop backbone/model pretrained loading (in place; returned): the full checkpoint is
    loaded afterwards, or the model is measured with its random init."""
    if isinstance(model_cfg.get('backbone'), dict):
        model_cfg['backbone']['init_cfg'] = None
    if 'pretrained' in model_cfg:
        model_cfg['pretrained'] = None
    return model_cfg


def load_model_weights(model: nn.Module, checkpoint: str, scope: str,
                       trust: bool = False) -> dict:
    """Load a full-model checkpoint (mmengine layout) or an official PaCa-ViT release (remapped
    for classifiers; only the backbone part for detectors and segmentors); returns the
    checkpoint dict. ``trust``: see :func:`paca_mm.checkpoint.load_checkpoint_file`."""
    from mmengine.runner.checkpoint import load_state_dict

    from ..checkpoint import (convert_official_to_classifier, load_backbone_checkpoint,
                              load_checkpoint_file, state_dict_of)
    ckpt = load_checkpoint_file(checkpoint, trust=trust)
    sd = state_dict_of(ckpt)
    official = not any(k.startswith('backbone.') for k in sd) and \
        any(k.startswith('patch_embed.') for k in sd)
    if official and scope != 'mmpretrain':
        print_log(f'{checkpoint}: official backbone checkpoint; only the backbone is loaded, '
                  'the rest of the model stays randomly initialised', logger='current',
                  level=30)
        load_backbone_checkpoint(model.backbone, ckpt, strict=True)
    else:
        sd = convert_official_to_classifier(sd) if official else sd
        if not any(k in sd for k in model.state_dict()):
            raise ValueError(f'checkpoint {checkpoint!r} shares no key with the model '
                             f'{type(model).__name__}; first checkpoint keys: {list(sd)[:5]}')
        load_state_dict(model, sd, strict=False, logger='current')
    return ckpt if isinstance(ckpt, dict) else {}


def _dataset_cfgs(cfg: Config, keys):
    """The dataset dicts of the ``keys`` dataloaders, each wrapper (RepeatDataset ...) before
    the dataset it wraps."""
    for key in keys:
        ds = (cfg.get(key) or {}).get('dataset')
        while isinstance(ds, dict):
            yield ds
            ds = ds.get('dataset')


def _dataset_metainfo(cfg: Config) -> Optional[dict]:
    """classes (and palette) of the config's test/val dataset, if they can be found."""
    datasets = importlib.import_module(f'{get_scope(cfg)}.registry').DATASETS
    for ds in _dataset_cfgs(cfg, ('test_dataloader', 'val_dataloader', 'train_dataloader')):
        if ds.get('metainfo'):
            return dict(ds['metainfo'])
        cls = datasets.get(ds.get('type')) if isinstance(ds.get('type'), str) else ds.get('type')
        meta = getattr(cls, 'METAINFO', None)
        if meta and meta.get('classes'):
            return dict(meta)
        # a dataset whose class names follow from its num_classes argument
        if isinstance(ds.get('num_classes'), int) and hasattr(cls, 'class_names'):
            return dict(classes=cls.class_names(ds['num_classes']))
    return None


def build_model(config: Union[str, Config], checkpoint: Optional[str] = None,
                device: str = 'cpu', cfg_options: Optional[dict] = None,
                trust: bool = False) -> nn.Module:
    """``cfg.model`` built in its toolbox scope with ``checkpoint`` (None: random init) loaded,
    on ``device``, in eval mode, with ``.cfg`` and ``.dataset_meta`` (from the checkpoint
    meta, else the config's dataset). ``trust``: see :func:`load_model_weights`."""
    from mmengine.registry import MODELS, init_default_scope
    cfg = load_config(config, cfg_options)
    scope = get_scope(cfg)
    init_default_scope(scope)
    model_cfg = strip_pretrained(copy.deepcopy(cfg.model))
    if 'data_preprocessor' not in model_cfg and cfg.get('data_preprocessor'):
        model_cfg['data_preprocessor'] = cfg.data_preprocessor  # merged by the Runner too
    if scope == 'mmseg':
        model_cfg['train_cfg'] = None
    model = MODELS.build(model_cfg)
    ckpt = {}
    if checkpoint is not None:
        ckpt = load_model_weights(model, checkpoint, scope, trust=trust)
    else:
        model.init_weights()
    if scope in ('mmdet', 'mmseg'):
        from mmengine.model import revert_sync_batchnorm
        model = revert_sync_batchnorm(model)
    meta = (ckpt.get('meta') or {}).get('dataset_meta')
    model.dataset_meta = dict(meta) if meta else (_dataset_metainfo(cfg) or {})
    model.cfg = cfg
    return model.to(device).eval()


def load_image(cfg: Config, image: Union[str, np.ndarray],
               size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """Image file (or (H, W, 3) uint8 BGR array) -> (3, H, W) float raw BGR network input,
    not normalised: resized/cropped by the config's test pipeline (less loading and packing),
    or just resized to ``size`` (H, W)."""
    import cv2
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope
    if isinstance(image, str):
        if not osp.isfile(image):
            raise FileNotFoundError(f'image not found: {image!r}')
        img = cv2.imread(image, cv2.IMREAD_COLOR)
        if img is None:
            raise ValueError(f'cannot decode image {image!r}')
    else:
        img = np.asarray(image)
        if img.ndim != 3 or img.shape[2] != 3:
            raise ValueError(f'expected an (H, W, 3) BGR image, got shape {img.shape}')
    if size is not None:
        img = cv2.resize(img, (int(size[1]), int(size[0])), interpolation=cv2.INTER_LINEAR)
    else:
        pipeline = next((ds['pipeline'] for ds in _dataset_cfgs(
            cfg, ('test_dataloader', 'val_dataloader')) if ds.get('pipeline')),
            cfg.get('test_pipeline'))
        pipeline = [t for t in (pipeline or [])
                    if not str(t.get('type', '')).startswith(('Load', 'Pack')) and
                    'Annotation' not in str(t.get('type', ''))]
        if pipeline:
            init_default_scope(get_scope(cfg))
            results = Compose(pipeline)(dict(img=img, img_shape=img.shape[:2],
                                             ori_shape=img.shape[:2], img_id=0,
                                             img_path=image if isinstance(image, str) else ''))
            img = results['img']
    return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float()
