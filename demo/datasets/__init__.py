"""Generated datasets for the demos and tests (no download needed).

Importing this package (the demo configs list it in ``custom_imports``) registers the
datasets into the toolboxes that are installed: ``SyntheticClsDataset`` (also
``PaCaSyntheticCls``) in mmpretrain, ``SyntheticCocoDataset`` (``PaCaSyntheticCoco``) in
mmdet and ``SyntheticSegDataset`` (``PaCaSyntheticSeg``) in mmseg; each errors with the file
and the dataset named when a sample cannot be read (:mod:`demo.datasets.bad_data`).
"""
from paca_mm.registry import register

from .bad_data import BadDataError, CorruptDataFileError, MissingDataFileError
from .synthetic_cls import SyntheticClsDataset, generate_synthetic_cls
from .synthetic_coco import SyntheticCocoDataset, generate_synthetic_coco
from .synthetic_seg import SyntheticSegDataset, generate_synthetic_seg

# each class is None when its toolbox is missing; register() skips it then
register('mmpretrain', 'DATASETS', SyntheticClsDataset,
         names=['SyntheticClsDataset', 'PaCaSyntheticCls'])
register('mmdet', 'DATASETS', SyntheticCocoDataset,
         names=['SyntheticCocoDataset', 'PaCaSyntheticCoco'])
register('mmseg', 'DATASETS', SyntheticSegDataset,
         names=['SyntheticSegDataset', 'PaCaSyntheticSeg'])

__all__ = ['SyntheticClsDataset', 'generate_synthetic_cls', 'generate_synthetic_coco',
           'SyntheticCocoDataset', 'SyntheticSegDataset', 'generate_synthetic_seg',
           'BadDataError', 'MissingDataFileError', 'CorruptDataFileError']
