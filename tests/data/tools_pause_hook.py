"""Test-only hook for tests/test_resume.py: pauses a training run right after the
checkpoint of iteration ``at_iter`` was written, so the test can kill the process at a
known point. It writes ``<work_dir>/paused_at_iter_<k>`` and sleeps; it does not touch
the model, the data or any random state."""
import os.path as osp
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class PauseAtIterHook(Hook):
    """Sleep ``seconds`` before training iteration ``at_iter`` + 1 (0 < at_iter)."""

    def __init__(self, at_iter: int, seconds: float = 300.):
        self.at_iter = at_iter
        self.seconds = seconds

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        # runner.iter = iterations completed; the CheckpointHook of iteration at_iter
        # ran in the previous after_train_iter, so iter_<at_iter>.pth is on disk.
        if runner.iter == self.at_iter:
            with open(osp.join(runner.work_dir, f'paused_at_iter_{self.at_iter}'), 'w') as f:
                f.write('paused\n')
            time.sleep(self.seconds)
