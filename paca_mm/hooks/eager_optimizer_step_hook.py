"""mmengine's ``compile`` option, for configs with ``paramwise_cfg`` and a learning-rate schedule.

mmengine compiles the model's ``train_step``, and with it the optimizer wrapper's
``update_params`` (backward, optimizer step, zero_grad). Two things go wrong in the
optimizer part of that graph, measured with torch 2.14.1 on our configs:

* with ``paramwise_cfg``, ``DefaultOptimWrapperConstructor`` stores its per-parameter groups
  in the (``ConfigDict``) optimizer config, which makes every group a ``ConfigDict``; dynamo
  fails on them while it traces the step (``InternalTorchDynamoError: AttributeError:
  'UserDefinedDictVariable' object has no attribute 'items'``, in ``_set_capturable``);
* each group's ``lr`` is a Python float that the parameter schedulers change every
  iteration, and dynamo guards on it: the step is recompiled, one group at a time, until
  dynamo's recompile limit (with inductor on the 2-core CPU, 100-200 s per iteration).

:class:`EagerOptimizerStepHook` (added by ``tools/train.py`` when the config sets
``compile``; for the toolboxes' own train scripts add ``dict(type='EagerOptimizerStepHook')``
to ``custom_hooks``) makes ``update_params`` run outside the compiled graph
(``torch.compiler.disable``), in ``before_train``: the forward and, through the compiled
autograd graph, the backward stay compiled; ``loss.backward()``, the optimizer step and
``zero_grad`` are called eagerly, as without ``compile``.
"""
import torch
from mmengine.hooks import Hook
from mmengine.optim import OptimWrapperDict


class EagerOptimizerStepHook(Hook):
    """Keep the optimizer wrappers' ``update_params`` out of the compiled ``train_step``
    (see module doc)."""

    priority = 'VERY_HIGH'

    def before_train(self, runner) -> None:
        wrapper = runner.optim_wrapper
        wrappers = wrapper.values() if isinstance(wrapper, OptimWrapperDict) else [wrapper]
        for optim_wrapper in wrappers:
            optim_wrapper.update_params = torch.compiler.disable(optim_wrapper.update_params)
