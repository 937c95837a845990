"""mmengine hooks of paca_mm (registered by :func:`paca_mm.registry.register_all`)."""
from .cluster_vis_hook import PaCaClusterVisHook
from .eager_optimizer_step_hook import EagerOptimizerStepHook
from .rng_state_hook import RNGStateHook

__all__ = ['PaCaClusterVisHook', 'EagerOptimizerStepHook', 'RNGStateHook']
