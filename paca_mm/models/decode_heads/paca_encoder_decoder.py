"""``PaCaEncoderDecoder``: a compatibility name for the official segmentor."""
from mmseg.models.segmentors import EncoderDecoder


class PaCaEncoderDecoder(EncoderDecoder):
    """mmseg's ``EncoderDecoder``, unchanged, under the official config name.

    The official segmentor only existed to merge the PaCa head's two loss dicts (both
    named ``loss_ce``) into ``decode.*``/``paca.*``. :class:`PaCaHead` already returns one
    dict with distinct names (``decode.loss_ce``, ``decode.loss_paca``, ...), so the stock
    segmentor works and this subclass adds nothing; it only lets configs written for the
    official code (``type='PaCaEncoderDecoder'``) build.
    """
