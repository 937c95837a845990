"""mmseg decode heads: the PaCa segmentation head (``None`` without mmsegmentation)."""
try:
    import mmseg  # noqa: F401
except ImportError:  # mmseg is optional for paca_mm as a whole
    PaCaHead = PaCaEncoderDecoder = None
else:
    from .paca_encoder_decoder import PaCaEncoderDecoder
    from .paca_head import PaCaHead

__all__ = ['PaCaHead', 'PaCaEncoderDecoder']
