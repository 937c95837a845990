"""``PaCaCPUInferenceHook``: the CPU inference pass for test runs."""
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from ..cpu_inference import apply_cpu_inference_pass


class PaCaCPUInferenceHook(Hook):
    """Before a test run (``runner.test()``, after the checkpoint is loaded), put the model
    in eval mode and apply :func:`paca_mm.fuse_for_cpu_inference` when it runs on the CPU
    (logged either way; see :func:`paca_mm.cpu_inference.apply_cpu_inference_pass`).

    ``tools/test.py`` adds it unless ``--no-fuse``; in a config for the toolboxes' own test
    scripts: ``custom_hooks=[dict(type='PaCaCPUInferenceHook')]``. Only the test loop is
    touched: the pass works in place, so the validation of a training run, whose model
    goes on training, is left as it is.

    Args:
        enabled: False logs that the pass is off and leaves the model as it is.
    """
    priority = 'VERY_LOW'

    def __init__(self, enabled: bool = True):
        if not isinstance(enabled, bool):
            raise TypeError(f'enabled must be True or False, got {enabled!r}')
        self.enabled = enabled

    def before_test(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        apply_cpu_inference_pass(model, self.enabled)
