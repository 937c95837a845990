"""CPU demos (not part of the paca_mm package): generated datasets (:mod:`demo.datasets`),
their configs (``demo/configs``) and the runs behind ``make demo`` (:mod:`demo.run`:
:func:`demo.seg.run` and :func:`demo.det.run` train and evaluate PaCa-Tiny on generated
data through ``tools/train.py`` and ``tools/test.py``)."""
