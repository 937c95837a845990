"""CPU stand-ins for mmengine's CUDA-only wrappers, used by the tools when CUDA is absent.

Registered in mmengine's root registries by :func:`paca_mm.registry.register_all`, so they
resolve from every toolbox scope; :func:`paca_mm.utils.runtime.adapt_cfg_to_device`
selects them.
"""
from contextlib import contextmanager
from typing import Optional, Union

import torch
import torch.nn as nn
from mmengine.model import MMDistributedDataParallel, revert_sync_batchnorm
from mmengine.optim import OptimWrapper


class CPUAmpOptimWrapper(OptimWrapper):
    """Mixed precision on CPU: the forward runs under ``torch.autocast('cpu', bfloat16)``.

    ``AmpOptimWrapper`` asserts CUDA. bfloat16 has float32's exponent range, so no loss
    scaling is needed: ``loss_scale`` is accepted for config compatibility and ignored,
    and a ``loss_scaler`` entry in a (GPU) checkpoint's optimizer state is dropped.

    Args:
        loss_scale: ignored (kept so AmpOptimWrapper configs build unchanged).
        dtype: 'bfloat16' / torch.bfloat16 / None (= bfloat16); CPU autocast in
            mmengine supports bfloat16 only, anything else raises ValueError.
        **kwargs: passed to :class:`mmengine.optim.OptimWrapper`.
    """

    def __init__(self, loss_scale: Union[str, float, dict] = 'dynamic',
                 dtype: Optional[Union[str, torch.dtype]] = None, use_fsdp: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, dtype)
        if dtype not in (None, torch.bfloat16):
            raise ValueError(f'CPUAmpOptimWrapper supports dtype bfloat16 only, got {dtype!r}')
        if use_fsdp:
            raise ValueError('CPUAmpOptimWrapper does not support use_fsdp=True')
        self.cast_dtype = torch.bfloat16

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        state_dict.pop('loss_scaler', None)
        super().load_state_dict(state_dict)

    @contextmanager
    def optim_context(self, model: nn.Module):
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
            yield


class CPUDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` for CPU (gloo) processes.

    The Runner passes ``device_ids=[LOCAL_RANK]``, which DDP rejects for CPU modules, and
    DDP refuses SyncBatchNorm on CPU. This wrapper drops ``device_ids``/``output_device``
    and reverts SyncBN layers (also ones a model creates in code, not via ``norm_cfg``)
    to BN before wrapping; gradients are still all-reduced over the process group.
    """

    def __init__(self, module: nn.Module, detect_anomalous_params: bool = False, **kwargs):
        kwargs.pop('device_ids', None)
        kwargs.pop('output_device', None)
        module = revert_sync_batchnorm(module)
        super().__init__(module=module, detect_anomalous_params=detect_anomalous_params,
                         **kwargs)
