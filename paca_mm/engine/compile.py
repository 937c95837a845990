"""mmengine's ``compile`` option in ``tools/train.py``: workarounds for torch.compile problems
seen on PaCa's training graphs, and the warnings for the ones without a workaround (the why
and the config equivalents: docs/development.md, "torch.compile")."""
from typing import List, Optional, Tuple

import torch
from mmengine.config import Config

from ..version import torch_version
from .args import add_custom_hook


def compile_backend(cfg: Config) -> Optional[str]:
    """The ``torch.compile`` backend mmengine's Runner will use for the train step (inductor
    unless ``compile`` names another), or None when it does not compile: ``compile`` is
    False/None or a dict with ``disable=True`` (``dict()`` compiles)."""
    value = cfg.get('compile')
    if isinstance(value, dict):
        return None if value.get('disable', False) else value.get('backend', 'inductor')
    return 'inductor' if value else None


def compiled_adam_lr_zero(cfg: Config) -> Optional[str]:
    """A warning when the config trains with ``compile`` and an Adam-family optimizer while
    a parameter scheduler takes the learning rate to 0; else None. torch's compiled Adam
    folds the step size into the denominator: at lr = 0 an element whose second moment is
    0 gets 0 / -0 = NaN (seen with torch 2.14.1 after PolyLR's last iteration)."""
    if compile_backend(cfg) is None:
        return None
    optim = (cfg.get('optim_wrapper') or {}).get('optimizer') or {}
    if 'adam' not in str(optim.get('type', '')).lower():
        return None
    schedulers = cfg.get('param_scheduler') or []
    if isinstance(schedulers, dict):
        schedulers = [schedulers]
    for sched in schedulers:
        kind = str(sched.get('type', '')).split('.')[-1]
        to_zero = (kind in ('PolyLR', 'CosineAnnealingLR') and not sched.get('eta_min') and
                   not sched.get('eta_min_ratio')) or \
            (kind == 'LinearLR' and sched.get('end_factor') == 0)
        if to_zero:
            return (f'compile is on with {optim.get("type")} and {kind} takes the learning '
                    'rate to 0: torch\'s compiled Adam step writes NaN into parameters whose '
                    'second moment is 0 when lr is 0 (pytorch/pytorch#126514). Keep the '
                    f'final lr above 0 (e.g. {kind} eta_min=1e-8 / end_factor=1e-6) or '
                    'train without compile.')
    return None


def compiled_cpu_attention_torch_bug(cfg: Config) -> Optional[str]:
    """A warning when the config trains with ``compile`` through inductor on the CPU with
    torch < 2.3 (the generated code fails ``assert_size_stride`` on the attention after
    PaCa's clustering convolution, pytorch/pytorch#121174); else None."""
    if compile_backend(cfg) != 'inductor' or torch.cuda.is_available() or \
            torch_version() >= (2, 3):
        return None
    return (f'compile with inductor on the CPU fails on torch {torch.__version__} for PaCa\'s '
            'attention after a convolution (pytorch/pytorch#121174, fixed in torch 2.3): '
            'use torch >= 2.3, compile.backend=aot_eager, or train without compile.')


def compile_static_shapes(cfg: Config) -> Tuple[List[str], List[str]]:
    """With ``compile`` through inductor, set ``compile.dynamic=False`` unless the config sets
    ``dynamic``; returns (log notes, warnings).

    Inductor (torch 2.14.1) fails on a training graph with symbolic sizes when a tensor saved
    for the backward has channels_last strides, as PaCa's views of (B, N, C) tokens have
    (pytorch/pytorch#172204, #185510); torch.compile's default ``dynamic=None`` switches to
    symbolic sizes at the second input size (Mask R-CNN's multi-scale training).
    """
    if compile_backend(cfg) != 'inductor':
        return [], []
    compile_cfg = dict(cfg.compile) if isinstance(cfg.compile, dict) else {}
    if 'dynamic' not in compile_cfg:
        cfg.compile = dict(compile_cfg, dynamic=False)
        return ['compile.dynamic=False set: inductor cannot compile PaCa\'s training graphs '
                'with symbolic sizes (pytorch/pytorch#172204); each input size is compiled '
                'once. Set compile.dynamic in the config to choose otherwise.'], []
    if compile_cfg['dynamic'] is not False:
        return [], [f'compile.dynamic={compile_cfg["dynamic"]}: inductor fails to compile PaCa\'s '
                    'training graphs with symbolic sizes (InductorError "cannot determine truth '
                    'value of Relational", pytorch/pytorch#172204); use compile.dynamic=False '
                    'or compile.backend=aot_eager.']
    return [], []


def add_eager_optimizer_step_hook(cfg: Config) -> List[str]:
    """With ``compile`` on, add :class:`paca_mm.hooks.EagerOptimizerStepHook` (once)."""
    if compile_backend(cfg) is None:
        return []
    return add_custom_hook(
        cfg, 'EagerOptimizerStepHook', 'EagerOptimizerStepHook added: the compiled train_step '
        'calls the optimizer wrapper\'s update_params eagerly (no recompilation at each '
        'learning-rate change)')
