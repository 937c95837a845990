"""The one place where paca_mm registers its modules into the OpenMMLab toolboxes.

``import paca_mm`` calls :func:`register_all`. Each toolbox (mmpretrain, mmdet, mmseg) is
optional: a missing one is skipped (see ``REGISTERED`` for what went where), so importing
never fails because one of the three is absent. Registering into the scoped registries
(not mmengine's root) makes ``type='PaCaViT'`` resolve in every scope and also with a
scope prefix, e.g. ``type='mmdet.PaCaViT'`` from an mmseg config. It also installs safe
checkpoint loading into mmengine (:func:`paca_mm.checkpoint.install_safe_checkpoint_loading`).
"""
import importlib
from typing import Dict, List

# toolbox -> names registered there (filled by register_all)
REGISTERED: Dict[str, List[str]] = {}
MISSING: Dict[str, str] = {}


def _registry(toolbox: str, name: str):
    try:
        module = importlib.import_module(f'{toolbox}.registry')
    except Exception as e:  # toolbox not installed, or broken install
        MISSING[toolbox] = f'{type(e).__name__}: {e}'
        return None
    return getattr(module, name)


def _register(toolbox: str, registry_name: str, module, names=None):
    registry = _registry(toolbox, registry_name)
    if registry is None or module is None:  # toolbox (or the part `module` needs) missing
        return
    for name in names or [module.__name__]:
        if name not in registry.module_dict:
            registry.register_module(name=name, module=module)
        REGISTERED.setdefault(toolbox, []).append(f'{registry_name}.{name}')


def register_all():
    """Register every paca_mm component into the toolboxes that are installed."""
    from .models.backbones import PaCaViT
    for toolbox in ('mmpretrain', 'mmdet', 'mmseg'):
        _register(toolbox, 'MODELS', PaCaViT)
    from .hooks import PaCaClusterVisHook  # heatmaps
    for toolbox in ('mmengine', 'mmpretrain', 'mmdet', 'mmseg'):
        _register(toolbox, 'HOOKS', PaCaClusterVisHook)
    from .models.decode_heads import PaCaEncoderDecoder, PaCaHead  # None without mmseg
    _register('mmseg', 'MODELS', PaCaHead, names=['PaCaHead', 'PaCaSegHead'])
    _register('mmseg', 'MODELS', PaCaEncoderDecoder)
    from .datasets.synthetic_cls import SyntheticClsDataset  # None without mmpretrain
    _register('mmpretrain', 'DATASETS', SyntheticClsDataset,
              names=['SyntheticClsDataset', 'PaCaSyntheticCls'])
    # mmdet's CocoDataset / mmseg's BaseSegDataset whose bad-file errors name file + dataset
    from .datasets.synthetic_coco import SyntheticCocoDataset  # None without mmdet
    _register('mmdet', 'DATASETS', SyntheticCocoDataset,
              names=['SyntheticCocoDataset', 'PaCaSyntheticCoco'])
    from .datasets.synthetic_seg import SyntheticSegDataset  # None without mmseg
    _register('mmseg', 'DATASETS', SyntheticSegDataset,
              names=['SyntheticSegDataset', 'PaCaSyntheticSeg'])
    from .utils.cpu_wrappers import CPUAmpOptimWrapper, CPUDistributedDataParallel  # tools, CPU
    _register('mmengine', 'OPTIM_WRAPPERS', CPUAmpOptimWrapper)
    _register('mmengine', 'MODEL_WRAPPERS', CPUDistributedDataParallel)
    from .utils.rng_hook import RNGStateHook  # tools/train.py: exact --resume
    _register('mmengine', 'HOOKS', RNGStateHook)
    from .utils.compile_hook import EagerOptimizerStepHook  # tools/train.py with compile
    _register('mmengine', 'HOOKS', EagerOptimizerStepHook)
    # checkpoints: weights-only + the Runner allow-list in mmengine's CheckpointLoader and
    # torch.load (the toolboxes' own tools/test.py, load_from, --resume, init_model ...)
    from .checkpoint import install_safe_checkpoint_loading
    install_safe_checkpoint_loading()
    from .flops import install_flop_handles  # mmengine's FLOP counters: attention MACs
    install_flop_handles()
