"""Opt-in additions to mmengine's Runner used by paca_mm's ``tools/train.py`` and
``tools/test.py``, one concept per module: :mod:`.args` (the tools' command-line
semantics, building the Runner), :mod:`.cpu` (machines without CUDA),
:mod:`.checkpoints` (atomic checkpoints, a checked ``--resume``) and :mod:`.compile`
(``torch.compile`` workarounds)."""
