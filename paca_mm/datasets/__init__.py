"""Generated datasets for demos and tests (no download needed)."""
from .synthetic_cls import SyntheticClsDataset, generate_synthetic_cls
from .synthetic_coco import generate_synthetic_coco

__all__ = ['SyntheticClsDataset', 'generate_synthetic_cls', 'generate_synthetic_coco']
