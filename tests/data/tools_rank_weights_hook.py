"""Test-only hook for tests/test_tools.py: at the end of training every rank saves its own
model weights to ``<work_dir>/rank<r>_weights.pth`` (the Runner's checkpoints are written
by rank 0 only), so the test can check that DDP kept the ranks in step."""
import os.path as osp

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module()
class SaveRankWeightsHook(Hook):

    def after_train(self, runner):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        rank = dist.get_rank() if dist.is_initialized() else 0
        state = dict(params={k: v.detach().clone() for k, v in model.named_parameters()},
                     buffers={k: v.detach().clone() for k, v in model.named_buffers()})
        torch.save(state, osp.join(runner.work_dir, f'rank{rank}_weights.pth'))
