"""mmengine's ``compile`` option, for configs with ``paramwise_cfg`` and a learning-rate schedule.

mmengine compiles the model's ``train_step`` and with it the optimizer wrapper's
``update_params``. Traced, the optimizer step fails on the ``ConfigDict`` parameter groups
that ``paramwise_cfg`` produces (``InternalTorchDynamoError: AttributeError:
'UserDefinedDictVariable' object has no attribute 'items'``, torch 2.14.1), and dynamo guards
on each group's ``lr``, so every scheduler step recompiles (docs/development.md,
"torch.compile"). :class:`EagerOptimizerStepHook` (added by ``tools/train.py`` with
``compile``; elsewhere ``custom_hooks=[dict(type='EagerOptimizerStepHook')]``) wraps
``update_params`` in ``torch.compiler.disable`` before training: forward and backward stay
compiled; the ``backward()`` call, optimizer step and ``zero_grad`` run eagerly.
"""
import torch
from mmengine.hooks import Hook
from mmengine.optim import OptimWrapperDict


class EagerOptimizerStepHook(Hook):
    """Run the optimizer wrappers' ``update_params`` outside the compiled graph (module doc)."""

    priority = 'VERY_HIGH'

    def before_train(self, runner) -> None:
        wrapper = runner.optim_wrapper
        wrappers = wrapper.values() if isinstance(wrapper, OptimWrapperDict) else [wrapper]
        for optim_wrapper in wrappers:
            optim_wrapper.update_params = torch.compiler.disable(optim_wrapper.update_params)
