"""Generated datasets for demos and tests (no download needed)."""
from .bad_data import BadDataError, CorruptDataFileError, MissingDataFileError
from .synthetic_cls import SyntheticClsDataset, generate_synthetic_cls
from .synthetic_coco import SyntheticCocoDataset, generate_synthetic_coco
from .synthetic_seg import SyntheticSegDataset, generate_synthetic_seg

__all__ = ['SyntheticClsDataset', 'generate_synthetic_cls', 'generate_synthetic_coco',
           'SyntheticCocoDataset', 'SyntheticSegDataset', 'generate_synthetic_seg',
           'BadDataError', 'MissingDataFileError', 'CorruptDataFileError']
