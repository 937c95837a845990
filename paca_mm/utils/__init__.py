"""Only :mod:`paca_mm.utils.flops` is left here (it moves to :mod:`paca_mm.flops`)."""
