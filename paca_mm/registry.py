"""The one place where paca_mm registers its modules into the OpenMMLab toolboxes.

``import paca_mm`` calls :func:`register_all`. Each toolbox is optional: a missing one is
skipped (``REGISTERED``/``MISSING`` say what went where), so the import never fails on it.
Registering into the scoped registries (not mmengine's root) makes ``type='PaCaViT'``
resolve in every scope, also with a prefix (``type='mmdet.PaCaViT'`` in an mmseg config).
"""
import importlib
from typing import Dict, List

TOOLBOXES = ('mmseg', 'mmdet', 'mmpretrain')

# toolbox -> names registered there (filled by register_all)
REGISTERED: Dict[str, List[str]] = {}
MISSING: Dict[str, str] = {}


def register(toolbox: str, registry_name: str, module, names=None):
    """Register ``module`` (under ``names``, default its class name) into
    ``<toolbox>.registry.<registry_name>``; skipped when the toolbox or ``module`` is
    missing (None)."""
    try:
        registries = importlib.import_module(f'{toolbox}.registry')
    except Exception as e:  # toolbox not installed, or broken install
        MISSING[toolbox] = f'{type(e).__name__}: {e}'
        return
    if module is None:  # the part of the toolbox `module` needs is missing
        return
    registry = getattr(registries, registry_name)
    for name in names or [module.__name__]:
        if name not in registry.module_dict:
            registry.register_module(name=name, module=module)
        REGISTERED.setdefault(toolbox, []).append(f'{registry_name}.{name}')


def register_all():
    """Register every paca_mm component into the toolboxes that are installed, and install
    safe checkpoint loading, the model zoo and the FLOP handles into mmengine."""
    from .models.backbones import PaCaViT
    for toolbox in ('mmpretrain', 'mmdet', 'mmseg'):
        register(toolbox, 'MODELS', PaCaViT)
    from .hooks import PaCaClusterVisHook  # heatmaps
    for toolbox in ('mmengine', 'mmpretrain', 'mmdet', 'mmseg'):
        register(toolbox, 'HOOKS', PaCaClusterVisHook)
    from .models.decode_heads import PaCaEncoderDecoder, PaCaHead  # None without mmseg
    register('mmseg', 'MODELS', PaCaHead, names=['PaCaHead', 'PaCaSegHead'])
    register('mmseg', 'MODELS', PaCaEncoderDecoder)
    from .models.test_time_augs import MaskRCNNTTAModel  # None without mmdet
    register('mmdet', 'MODELS', MaskRCNNTTAModel)  # --tta of instance masks
    from .engine.cpu import CPUAmpOptimWrapper, CPUDistributedDataParallel  # tools, CPU
    register('mmengine', 'OPTIM_WRAPPERS', CPUAmpOptimWrapper)
    register('mmengine', 'MODEL_WRAPPERS', CPUDistributedDataParallel)
    from .hooks import EagerOptimizerStepHook, RNGStateHook  # tools/train.py
    register('mmengine', 'HOOKS', RNGStateHook)  # exact --resume
    register('mmengine', 'HOOKS', EagerOptimizerStepHook)  # with compile
    from .engine import checkpoints  # noqa: F401  (the atomic checkpoint file backend)
    # checkpoints: weights-only + the Runner allow-list in mmengine's CheckpointLoader and
    # torch.load (the toolboxes' own tools/test.py, load_from, --resume, init_model ...)
    from .checkpoint import install_safe_checkpoint_loading
    install_safe_checkpoint_loading()
    from .apis import register_model_zoo  # models by name (mmpretrain's ModelHub)
    register_model_zoo()
    from .flops import install_flop_handles  # mmengine's FLOP counters: attention MACs
    install_flop_handles()


def get_scope(cfg) -> str:
    """The config's ``default_scope``; raises ValueError if missing or not a toolbox."""
    scope = cfg.get('default_scope')
    if scope is None:
        raise ValueError(
            "the config sets no default_scope; add default_scope='mmseg' (or 'mmdet', "
            "'mmpretrain') so the tools know which toolbox's modules to use")
    if scope not in TOOLBOXES:
        raise ValueError(f'default_scope must be one of {TOOLBOXES}, got {scope!r}')
    return scope


def register_toolbox_modules(cfg) -> str:
    """Register every module of the toolbox named by ``cfg.default_scope`` (as the
    toolboxes' own tools do) plus paca_mm's; returns the scope."""
    scope = get_scope(cfg)  # paca_mm's own modules: registered by `import paca_mm`
    try:
        utils = importlib.import_module(f'{scope}.utils')
    except ImportError as e:
        raise ImportError(f'default_scope={scope!r} but {scope} cannot be imported: {e}') from e
    utils.register_all_modules(init_default_scope=False)
    return scope
