from .paca_teacher import ConvMixerTeacher
from .paca_vit import ARCH_SETTINGS, PRESET_ALIASES, PRESETS, PaCaViT

__all__ = ['PaCaViT', 'ConvMixerTeacher', 'ARCH_SETTINGS', 'PRESETS', 'PRESET_ALIASES']
