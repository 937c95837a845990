"""Let mmengine's ``compile`` option trace the optimizer step of configs with ``paramwise_cfg``.

mmengine compiles ``train_step``, optimizer step included. With ``paramwise_cfg``,
``DefaultOptimWrapperConstructor`` stores its per-parameter groups in the optimizer config,
a ``ConfigDict``, which turns every group into a ``ConfigDict`` too. The optimizer keeps
those objects as its ``param_groups``, and dynamo (torch 2.14.1) fails on them while it
traces the step: ``InternalTorchDynamoError: AttributeError: 'UserDefinedDictVariable'
object has no attribute 'items'`` (``_set_capturable``). Plain dicts trace.

This hook (added by ``tools/train.py`` when the config sets ``compile``; for the toolboxes'
own train scripts add ``dict(type='PlainParamGroupsHook')`` to ``custom_hooks``) replaces
each group by a plain dict with the same keys and values in ``before_train``: after the
optimizer and the parameter schedulers are built and a resumed state is loaded, before
the first (compiled) training step. The groups keep their number and order, so the
schedulers, which index ``optimizer.param_groups`` at every step, are unaffected.
"""
from mmengine.hooks import Hook
from mmengine.optim import OptimWrapperDict


class PlainParamGroupsHook(Hook):
    """Turn the optimizers' parameter groups into plain dicts (see module doc)."""

    priority = 'VERY_HIGH'

    def before_train(self, runner) -> None:
        wrapper = runner.optim_wrapper
        wrappers = wrapper.values() if isinstance(wrapper, OptimWrapperDict) else [wrapper]
        for optim_wrapper in wrappers:
            groups = optim_wrapper.optimizer.param_groups
            groups[:] = [dict(group) for group in groups]
