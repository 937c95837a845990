"""mmdet test-time augmentation: instance masks (``None`` without mmdetection)."""
try:
    import mmdet  # noqa: F401
except ImportError:  # mmdet is optional for paca_mm as a whole
    MaskRCNNTTAModel = None
else:
    from .mask_rcnn_tta import MaskRCNNTTAModel

__all__ = ['MaskRCNNTTAModel']
