"""Opt-in additions to mmengine's Runner used by paca_mm's ``tools/train.py`` and
``tools/test.py``, one concept per module."""
