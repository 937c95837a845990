"""paca_mm: PaCa-ViT (Patch-to-Cluster Attention, CVPR 2023) for mmpretrain, mmdet and mmseg.

``import paca_mm`` (or ``custom_imports=dict(imports=['paca_mm'])`` in a config) registers
``PaCaViT`` and the other components in every installed toolbox's registries.
"""
from .registry import register_all
from .version import __version__  # noqa: F401

register_all()
