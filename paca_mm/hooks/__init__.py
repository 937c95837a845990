"""mmengine hooks of paca_mm (registered in every toolbox's HOOKS by paca_mm.registry)."""
from .cluster_vis_hook import PaCaClusterVisHook

__all__ = ['PaCaClusterVisHook']
