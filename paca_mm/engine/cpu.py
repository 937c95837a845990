"""Running the tools on a machine without CUDA: :func:`adapt_cfg_to_device` rewrites the
config, :func:`init_cpu_distributed` creates the gloo process group. The two wrappers below
are registered in mmengine's root registries by :func:`paca_mm.registry.register_all`, so
they resolve from every toolbox scope.
"""
import datetime
import os
import subprocess
from contextlib import contextmanager
from typing import Any, Dict, List, Optional, Union

import torch
import torch.distributed as torch_dist
import torch.nn as nn
from mmengine.config import Config, ConfigDict
from mmengine.model import MMDistributedDataParallel, revert_sync_batchnorm
from mmengine.optim import OptimWrapper

SYNC_BN_TYPES = ('SyncBN', 'MMSyncBN', 'TorchSyncBN')


class CPUAmpOptimWrapper(OptimWrapper):
    """Mixed precision on CPU (``AmpOptimWrapper`` asserts CUDA): the forward runs under
    ``torch.autocast('cpu', bfloat16)``. bfloat16 has float32's exponent range, so
    ``loss_scale`` is accepted (AmpOptimWrapper configs build unchanged) and ignored, and a
    (GPU) checkpoint's ``loss_scaler`` state is dropped. ``dtype``: bfloat16 (or None).
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
    """``MMDistributedDataParallel`` for CPU (gloo) processes: drops the ``device_ids`` the
    Runner passes (DDP rejects them for CPU modules) and reverts SyncBN layers, also ones a
    model builds in code, to BN (DDP refuses SyncBN on CPU)."""

    def __init__(self, module: nn.Module, **kwargs):
        kwargs.pop('device_ids', None)
        kwargs.pop('output_device', None)
        super().__init__(module=revert_sync_batchnorm(module), **kwargs)


def _replace_sync_bn(node: Any, path: str, changed: List[str]) -> Any:
    """Recursively rewrite norm configs of type SyncBN/MMSyncBN to BN (in place)."""
    if isinstance(node, dict):
        if node.get('type') in SYNC_BN_TYPES:
            changed.append(f"{path or 'model'}: {node['type']} -> BN")
            node['type'] = 'BN'
        for key, value in node.items():
            _replace_sync_bn(value, f'{path}.{key}' if path else str(key), changed)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            _replace_sync_bn(value, f'{path}[{i}]', changed)
    return node


def adapt_cfg_to_device(cfg: Config, cuda: Optional[bool] = None) -> List[str]:
    """Make a (GPU) config runnable on a machine without CUDA (in place; nothing when CUDA
    is available); returns log notes. SyncBN norm configs in ``cfg.model`` /
    ``cfg.tta_model`` become BN and ``cfg.sync_bn`` is dropped (no CPU kernel; DDP refuses
    it on CPU modules); distributed runs use gloo and :class:`CPUDistributedDataParallel`;
    ``AmpOptimWrapper`` becomes :class:`CPUAmpOptimWrapper`.
    """
    if (torch.cuda.is_available() if cuda is None else cuda):
        return []
    notes, changed = [], []
    for key in ('model', 'tta_model'):
        if cfg.get(key) is not None:
            _replace_sync_bn(cfg[key], key, changed)
    if cfg.get('sync_bn') is not None:
        changed.append(f'sync_bn={cfg.pop("sync_bn")!r} removed')
    if changed:
        notes.append('SyncBN reverted to BN (' + '; '.join(changed) + ')')
    if cfg.get('launcher', 'none') != 'none':
        dist_cfg = cfg.setdefault('env_cfg', ConfigDict()).setdefault('dist_cfg', ConfigDict())
        if dist_cfg.get('backend', 'nccl') != 'gloo':
            notes.append(f"distributed backend {dist_cfg.get('backend', 'nccl')!r} -> 'gloo'")
            dist_cfg['backend'] = 'gloo'
        wrapper = cfg.get('model_wrapper_cfg')
        if wrapper is None:
            cfg.model_wrapper_cfg = dict(
                type='CPUDistributedDataParallel', broadcast_buffers=False,
                find_unused_parameters=cfg.get('find_unused_parameters', False))
            notes.append('model wrapped in CPUDistributedDataParallel')
        elif wrapper.get('type', 'MMDistributedDataParallel') == 'MMDistributedDataParallel':
            wrapper['type'] = 'CPUDistributedDataParallel'
            notes.append('MMDistributedDataParallel -> CPUDistributedDataParallel')
    optim = cfg.get('optim_wrapper')
    if isinstance(optim, dict) and optim.get('type') == 'AmpOptimWrapper':
        optim['type'] = 'CPUAmpOptimWrapper'
        if optim.get('dtype') not in (None, 'bfloat16', torch.bfloat16):
            notes.append(f'AMP dtype {optim["dtype"]!r} -> bfloat16')
        optim['dtype'] = 'bfloat16'
        notes.append('AmpOptimWrapper -> CPUAmpOptimWrapper (bfloat16 autocast on CPU, no '
                     'loss scaling)')
    return [f'CUDA is not available: {note}' for note in notes]


def _env(name: str, default=None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise KeyError(f'environment variable {name} is not set; launch with torchrun '
                       '(tools/dist_train.sh), srun or mpirun, set it, or use --launcher none')
    return str(value)


_LAUNCHER_ENV = {'pytorch': ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'),
                 'slurm': ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID'),
                 'mpi': ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE',
                         'OMPI_COMM_WORLD_LOCAL_RANK')}


def init_cpu_distributed(launcher: str, dist_cfg: Optional[Dict] = None) -> bool:
    """Create the gloo process group for a distributed run on a machine without CUDA
    (mmengine's ``init_dist`` always calls ``torch.cuda.set_device``) from the launcher's
    environment (``_LAUNCHER_ENV``, MASTER_ADDR/MASTER_PORT; Slurm: SLURM_NODELIST),
    exporting the torchrun variables the Runner reads; the Runner keeps the group.
    Returns True if a group was created here (False with CUDA, launcher 'none', or a
    group that already exists).
    """
    if launcher == 'none' or torch.cuda.is_available() or torch_dist.is_initialized():
        return False
    if launcher not in _LAUNCHER_ENV:
        raise ValueError(f"launcher must be 'none', 'pytorch', 'slurm' or 'mpi', got {launcher!r}")
    dist_cfg = dist_cfg or {}
    rank_var, size_var, local_var = _LAUNCHER_ENV[launcher]
    rank, world_size, local_rank = int(_env(rank_var)), int(_env(size_var)), int(_env(local_var, 0))
    if launcher == 'slurm' and 'MASTER_ADDR' not in os.environ:
        os.environ['MASTER_ADDR'] = subprocess.getoutput(
            f"scontrol show hostname {_env('SLURM_NODELIST')} | head -n1")
    if launcher == 'slurm' and dist_cfg.get('port') is not None:
        os.environ['MASTER_PORT'] = str(dist_cfg['port'])
    if launcher != 'pytorch':
        os.environ.setdefault('MASTER_PORT', '29500')
    _env('MASTER_ADDR'), _env('MASTER_PORT')
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank))
    timeout = dist_cfg.get('timeout')
    torch_dist.init_process_group(backend='gloo', init_method='env://', rank=rank,
                                  world_size=world_size, **({} if timeout is None else dict(
                                      timeout=datetime.timedelta(seconds=timeout))))
    return True
