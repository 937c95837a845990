"""mmengine hooks of paca_mm (registered in every toolbox's HOOKS by paca_mm.registry)."""
from .cluster_vis_hook import PaCaClusterVisHook
from .cpu_inference_hook import PaCaCPUInferenceHook

__all__ = ['PaCaClusterVisHook', 'PaCaCPUInferenceHook']
