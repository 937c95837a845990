"""Generated datasets for demos and tests (no download needed)."""
from .synthetic_cls import SyntheticClsDataset, generate_synthetic_cls

__all__ = ['SyntheticClsDataset', 'generate_synthetic_cls']
