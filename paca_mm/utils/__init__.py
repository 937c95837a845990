"""Runtime helpers for the tools (train/test, CPU support, safe checkpoint loading)."""
from .compile_hook import EagerOptimizerStepHook
from .cpu_wrappers import CPUAmpOptimWrapper, CPUDistributedDataParallel
from .rng_hook import RNGStateHook
from .runtime import (adapt_cfg_to_device, add_eager_optimizer_step_hook, add_rng_state_hook,
                      allow_mmengine_checkpoint_globals, apply_test_args, apply_train_args,
                      build_runner, get_scope, init_cpu_distributed,
                      mmengine_checkpoint_globals, register_toolbox_modules, set_work_dir,
                      trust_checkpoints)

__all__ = [
    'CPUAmpOptimWrapper', 'CPUDistributedDataParallel', 'EagerOptimizerStepHook', 'RNGStateHook',
    'add_eager_optimizer_step_hook', 'add_rng_state_hook', 'adapt_cfg_to_device',
    'allow_mmengine_checkpoint_globals', 'apply_test_args', 'apply_train_args', 'build_runner',
    'get_scope', 'init_cpu_distributed', 'mmengine_checkpoint_globals', 'register_toolbox_modules',
    'set_work_dir', 'trust_checkpoints'
]
