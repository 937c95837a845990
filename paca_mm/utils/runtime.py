"""Runtime helpers behind ``tools/train.py`` and ``tools/test.py``.

One set of tools serves the three toolboxes: the config's ``default_scope``
(``'mmseg'``, ``'mmdet'`` or ``'mmpretrain'``) selects whose modules are registered and
whose command-line semantics (``--out``, ``--show-dir``, ``--tta``) apply. Besides
that, the helpers make the tools work where the stock OpenMMLab tools do not:

* **safe checkpoints** -- ``import paca_mm`` makes mmengine load checkpoints weights-only
  plus the allow-list of what Runner checkpoints contain, on every torch (see
  :mod:`paca_mm.checkpoint`); ``--trust-checkpoint`` (:func:`trust_checkpoints`) opts in
  to full unpickling for one run.
* **CPU-only machines** -- SyncBN configs are rewritten to BN, ``AmpOptimWrapper``
  (CUDA only in mmengine) becomes bf16 autocast on CPU, and a distributed launch
  (torchrun / Slurm / MPI) creates a gloo process group itself, because mmengine's
  ``init_dist`` always calls ``torch.cuda.set_device`` (see :func:`adapt_cfg_to_device`
  and :func:`init_cpu_distributed`).
* **atomic checkpoints** -- ``tools/train.py`` has the ``CheckpointHook`` write through
  :class:`paca_mm.utils.atomic_backend.AtomicLocalBackend` (temporary file + ``os.replace``,
  see :func:`use_atomic_checkpoints`), and ``--resume`` checks the checkpoint it resumes
  from is complete: a truncated newest one is named and skipped for the newest complete
  one (auto-resume), or stops the run with a clear error (see
  :func:`check_resume_checkpoint`).
"""
import copy
import datetime
import importlib
import os
import os.path as osp
import re
import subprocess
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as torch_dist
from mmengine.config import Config, ConfigDict

from ..checkpoint import (TRUST_ENV, CheckpointError,  # noqa: F401
                          allow_mmengine_checkpoint_globals, mmengine_checkpoint_globals)
from .atomic_backend import ATOMIC_BACKEND, stale_temporary_files

TOOLBOXES = ('mmseg', 'mmdet', 'mmpretrain')
SYNC_BN_TYPES = ('SyncBN', 'MMSyncBN', 'TorchSyncBN')


# --------------------------------------------------------------------------- scope
def get_scope(cfg: Config) -> str:
    """The config's ``default_scope``; raises ValueError if missing or not a toolbox."""
    scope = cfg.get('default_scope')
    if scope is None:
        raise ValueError(
            "the config sets no default_scope; add default_scope='mmseg' (or 'mmdet', "
            "'mmpretrain') so the tools know which toolbox's modules to use")
    if scope not in TOOLBOXES:
        raise ValueError(f'default_scope must be one of {TOOLBOXES}, got {scope!r}')
    return scope


def register_toolbox_modules(cfg: Config) -> str:
    """Register every module of the toolbox named by ``cfg.default_scope`` (as the
    toolboxes' own tools do) plus paca_mm's; returns the scope."""
    scope = get_scope(cfg)
    import paca_mm  # noqa: F401  (registers PaCaViT & co. into all toolboxes)
    try:
        utils = importlib.import_module(f'{scope}.utils')
    except ImportError as e:
        raise ImportError(f'default_scope={scope!r} but {scope} cannot be imported: {e}') from e
    utils.register_all_modules(init_default_scope=False)
    return scope


# --------------------------------------------------------------------- checkpoints
WEIGHTS_ONLY_HINT = (
    'The checkpoint holds Python objects outside the allow-list of what mmengine Runner '
    'checkpoints contain (paca_mm.checkpoint.mmengine_checkpoint_globals), and checkpoints '
    'are loaded weights-only (paca_mm.checkpoint.safe_torch_load). If you trust the file, '
    'pass --trust-checkpoint to tools/train.py / tools/test.py or set '
    f'{TRUST_ENV}=1.')


def trust_checkpoints(enable: bool = True) -> None:
    """``--trust-checkpoint``: the checkpoints this run loads (CHECKPOINT, ``--resume``,
    ``load_from``, a backbone's ``init_cfg`` file) are unpickled in full, i.e. may run
    code. Sets ``PACA_MM_TRUST_CHECKPOINTS=1`` for this process (see
    :func:`paca_mm.checkpoint.safe_torch_load`); does nothing when ``enable`` is false."""
    if enable:
        os.environ[TRUST_ENV] = '1'


# ------------------------------------------------------------------ device adaptation
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
    """Make a (GPU) config runnable on a machine without CUDA; returns log notes.

    Does nothing when CUDA is available. Otherwise (in place):

    * every ``norm_cfg``-style dict of type SyncBN/MMSyncBN in ``cfg.model`` (and
      ``cfg.tta_model``) becomes BN, and ``cfg.sync_bn`` is dropped: SyncBN has no CPU
      kernel and DDP refuses it on CPU modules;
    * distributed runs (``cfg.launcher != 'none'``) use gloo (``env_cfg.dist_cfg``) and
      ``CPUDistributedDataParallel`` (DDP without ``device_ids``, reverting any SyncBN a
      model builds in code);
    * ``AmpOptimWrapper`` (CUDA only in mmengine) becomes ``CPUAmpOptimWrapper``: bf16
      autocast without loss scaling (CPU autocast is bf16 only in mmengine).
    """
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if cuda:
        return []
    notes = []
    changed: List[str] = []
    for key in ('model', 'tta_model'):
        if cfg.get(key) is not None:
            _replace_sync_bn(cfg[key], key, changed)
    if cfg.get('sync_bn') is not None:
        changed.append(f'sync_bn={cfg.sync_bn!r} removed')
        cfg.pop('sync_bn')
    if changed:
        notes.append('CUDA is not available: SyncBN reverted to BN (' + '; '.join(changed) + ')')

    if cfg.get('launcher', 'none') != 'none':
        env_cfg = cfg.setdefault('env_cfg', ConfigDict())
        dist_cfg = env_cfg.setdefault('dist_cfg', ConfigDict())
        if dist_cfg.get('backend', 'nccl') != 'gloo':
            notes.append(f"CUDA is not available: distributed backend "
                         f"{dist_cfg.get('backend', 'nccl')!r} -> 'gloo'")
            dist_cfg['backend'] = 'gloo'
        wrapper = cfg.get('model_wrapper_cfg')
        if wrapper is None:
            cfg.model_wrapper_cfg = dict(
                type='CPUDistributedDataParallel', broadcast_buffers=False,
                find_unused_parameters=cfg.get('find_unused_parameters', False))
            notes.append('CUDA is not available: model wrapped in CPUDistributedDataParallel')
        elif wrapper.get('type', 'MMDistributedDataParallel') == 'MMDistributedDataParallel':
            wrapper['type'] = 'CPUDistributedDataParallel'
            notes.append('CUDA is not available: MMDistributedDataParallel -> '
                         'CPUDistributedDataParallel')

    optim = cfg.get('optim_wrapper')
    if isinstance(optim, dict) and optim.get('type') == 'AmpOptimWrapper':
        optim['type'] = 'CPUAmpOptimWrapper'
        dtype = optim.get('dtype')
        if dtype not in (None, 'bfloat16', torch.bfloat16):
            notes.append(f'CUDA is not available: AMP dtype {dtype!r} -> bfloat16')
        optim['dtype'] = 'bfloat16'
        notes.append('CUDA is not available: AmpOptimWrapper -> CPUAmpOptimWrapper '
                     '(bfloat16 autocast on CPU, no loss scaling)')
    return notes


# ---------------------------------------------------------------------- distributed
def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except KeyError:
        raise KeyError(f'environment variable {name} is not set; launch with torchrun '
                       '(tools/dist_train.sh), srun or mpirun, or use --launcher none') from None


def init_cpu_distributed(launcher: str, dist_cfg: Optional[Dict] = None) -> bool:
    """Create the gloo process group for a distributed run on a machine without CUDA.

    mmengine's ``init_dist`` calls ``torch.cuda.set_device`` unconditionally, so on CPU
    the process group is created here from the launcher's environment (torchrun:
    RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; Slurm: SLURM_PROCID/NTASKS/
    NODELIST/LOCALID; MPI: OMPI_COMM_WORLD_*), exporting the torchrun variables the
    Runner reads. The Runner then finds the group initialised and keeps it.

    Returns True if a group was created here (False with CUDA, launcher 'none', or a
    group that already exists).
    """
    if launcher == 'none' or torch.cuda.is_available() or torch_dist.is_initialized():
        return False
    dist_cfg = dict(dist_cfg or {})
    if launcher == 'pytorch':
        rank, world_size = _env_int('RANK'), _env_int('WORLD_SIZE')
        local_rank = int(os.environ.get('LOCAL_RANK', 0))
    elif launcher == 'slurm':
        rank, world_size = _env_int('SLURM_PROCID'), _env_int('SLURM_NTASKS')
        local_rank = int(os.environ.get('SLURM_LOCALID', 0))
        if 'MASTER_ADDR' not in os.environ:
            node_list = os.environ['SLURM_NODELIST']
            os.environ['MASTER_ADDR'] = subprocess.getoutput(
                f'scontrol show hostname {node_list} | head -n1')
        port = dist_cfg.pop('port', None)
        if port is not None:
            os.environ['MASTER_PORT'] = str(port)
        os.environ.setdefault('MASTER_PORT', '29500')
    elif launcher == 'mpi':
        rank, world_size = _env_int('OMPI_COMM_WORLD_RANK'), _env_int('OMPI_COMM_WORLD_SIZE')
        local_rank = int(os.environ.get('OMPI_COMM_WORLD_LOCAL_RANK', 0))
        if 'MASTER_ADDR' not in os.environ:
            raise KeyError('environment variable MASTER_ADDR is not set (needed by --launcher mpi)')
        os.environ.setdefault('MASTER_PORT', '29500')
    else:
        raise ValueError(f"launcher must be 'none', 'pytorch', 'slurm' or 'mpi', got {launcher!r}")
    for key in ('MASTER_ADDR', 'MASTER_PORT'):
        if key not in os.environ:
            raise KeyError(f'environment variable {key} is not set; launch with torchrun '
                           '(tools/dist_train.sh) or set it')
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank))
    kwargs = {}
    if dist_cfg.get('timeout') is not None:
        kwargs['timeout'] = datetime.timedelta(seconds=dist_cfg['timeout'])
    torch_dist.init_process_group(backend='gloo', init_method='env://', rank=rank,
                                  world_size=world_size, **kwargs)
    return True


# ------------------------------------------------------------------------ runner
def build_runner(cfg: Config):
    """Register the scope's modules, adapt ``cfg`` to the device, initialise CPU
    distributed if needed and build the Runner (``cfg.runner_type`` is honoured)."""
    scope = register_toolbox_modules(cfg)  # imports paca_mm: safe checkpoint loading
    notes = adapt_cfg_to_device(cfg)
    launcher = cfg.get('launcher', 'none')
    if init_cpu_distributed(launcher, cfg.get('env_cfg', {}).get('dist_cfg')):
        notes.append(f'rank {torch_dist.get_rank()}/{torch_dist.get_world_size()}: '
                     f'gloo process group initialised (launcher={launcher})')
    if 'runner_type' not in cfg:
        from mmengine.runner import Runner
        runner = Runner.from_cfg(cfg)
    else:
        runners = importlib.import_module(f'{scope}.registry').RUNNERS
        runner = runners.build(cfg)
    for note in notes:
        runner.logger.info(note)
    if torch_dist.is_initialized():
        # one line per rank on stdout (the logger prints rank 0 only)
        print(f'[paca_mm] rank {torch_dist.get_rank()}/{torch_dist.get_world_size()} '
              f'ready (backend {torch_dist.get_backend()})', flush=True)
    return runner


def run_with_checkpoint_hint(fn, *args, **kwargs):
    """Call ``fn``; re-raise a weights-only unpickling failure with a hint on the fix.

    On success in a distributed run, all ranks meet at a barrier and the process group is
    destroyed before the process exits: a rank leaving while another still talks to the
    store (hosted by rank 0) otherwise aborts the peer (seen with gloo: exit code -6).
    """
    import pickle
    try:
        result = fn(*args, **kwargs)
    except pickle.UnpicklingError as e:
        raise pickle.UnpicklingError(f'{e}\n\n[paca_mm] {WEIGHTS_ONLY_HINT}') from e
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()
        torch_dist.destroy_process_group()
    return result


# ------------------------------------------------------------------- CLI semantics
def set_work_dir(cfg: Config, work_dir: Optional[str], config_path: str) -> None:
    """CLI ``--work-dir`` > ``work_dir`` in the file > ``./work_dirs/<config name>``."""
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = os.path.join('./work_dirs',
                                    os.path.splitext(os.path.basename(config_path))[0])


def apply_train_args(cfg: Config, amp: bool = False, auto_scale_lr: bool = False,
                     resume: Optional[str] = None) -> List[str]:
    """``--amp``, ``--auto-scale-lr`` and ``--resume [CKPT]`` as in mmdet/mmpretrain (and
    mmseg, whose bare ``--resume`` equals ``--resume auto``); returns log notes."""
    notes = []
    if amp:
        optim = cfg.get('optim_wrapper')
        if optim is None:
            raise ValueError('--amp needs an optim_wrapper in the config')
        kind = optim.get('type', 'OptimWrapper')
        if kind in ('AmpOptimWrapper', 'CPUAmpOptimWrapper'):
            notes.append('AMP training is already enabled in the config.')
        elif kind != 'OptimWrapper':
            raise ValueError('--amp is only supported when the optimizer wrapper type is '
                             f'OptimWrapper, got {kind!r}')
        else:
            optim.type = 'AmpOptimWrapper'
            optim.setdefault('loss_scale', 'dynamic')
    if auto_scale_lr:
        asl = cfg.get('auto_scale_lr')
        if not asl or 'base_batch_size' not in asl:
            raise ValueError('--auto-scale-lr needs auto_scale_lr=dict(enable=False, '
                             'base_batch_size=...) in the config')
        asl.enable = True
    if resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif resume is not None:
        cfg.resume = True
        cfg.load_from = resume
    return notes


def compiles(cfg: Config) -> bool:
    """Whether mmengine's Runner will ``torch.compile`` the train step: ``compile`` is True
    or a dict (``dict()`` too) without ``disable=True``."""
    value = cfg.get('compile')
    if isinstance(value, dict):
        return not value.get('disable', False)
    return bool(value)


def compile_backend(cfg: Config) -> Optional[str]:
    """The ``torch.compile`` backend mmengine's Runner will use (inductor unless ``compile``
    names another), or None when it does not compile."""
    if not compiles(cfg):
        return None
    value = cfg.get('compile')
    return value.get('backend', 'inductor') if isinstance(value, dict) else 'inductor'


def compiled_adam_lr_zero(cfg: Config) -> Optional[str]:
    """A warning when the config trains with ``compile`` and an Adam-family optimizer while
    a parameter scheduler takes the learning rate to 0 (``PolyLR``/``CosineAnnealingLR``
    with ``eta_min`` 0, ``LinearLR`` with ``end_factor`` 0); else None.

    mmengine compiles ``train_step``, optimizer step included, and torch's compiled Adam
    folds the step size into the denominator: at lr = 0 an element whose second moment is
    0 gets 0 / -0 = NaN (pytorch/pytorch#126514; seen here with torch 2.14.1: a tiny
    segmentation run ends with NaN weights in its last iteration, where PolyLR reaches 0).
    """
    if not compiles(cfg):
        return None
    optim = (cfg.get('optim_wrapper') or {}).get('optimizer') or {}
    if 'adam' not in str(optim.get('type', '')).lower():
        return None
    schedulers = cfg.get('param_scheduler') or []
    if isinstance(schedulers, dict):
        schedulers = [schedulers]
    for sched in schedulers:
        kind = str(sched.get('type', '')).split('.')[-1]
        to_zero = (kind in ('PolyLR', 'CosineAnnealingLR') and not sched.get('eta_min') and
                   not sched.get('eta_min_ratio')) or \
            (kind == 'LinearLR' and sched.get('end_factor', 1.0) == 0)
        if to_zero:
            return (f'compile is on with {optim.get("type")} and {kind} takes the learning '
                    'rate to 0: torch\'s compiled Adam step writes NaN into parameters whose '
                    'second moment is 0 when lr is 0 (pytorch/pytorch#126514). Keep the '
                    f'final lr above 0 (e.g. {kind} eta_min=1e-8 / end_factor=1e-6) or '
                    'train without compile.')
    return None


def compiled_cpu_attention_torch_bug(cfg: Config) -> Optional[str]:
    """A warning when the config trains with ``compile`` through inductor on the CPU with
    torch < 2.3; else None.

    There inductor lays out the inputs of the CPU flash attention after a convolution (PaCa's
    clustering) channels-last, and its generated code then fails
    ``assert_size_stride`` on the attention output in the first iteration
    (pytorch/pytorch#121174, fixed in torch 2.3 by #122083; seen here with torch 2.1.2).
    """
    if compile_backend(cfg) != 'inductor' or torch.cuda.is_available() or \
            torch_version() >= (2, 3):
        return None
    return (f'compile with inductor on the CPU fails on torch {torch.__version__} for PaCa\'s '
            'attention after a convolution (pytorch/pytorch#121174, fixed in torch 2.3): '
            'use torch >= 2.3, compile.backend=aot_eager, or train without compile.')


def compile_static_shapes(cfg: Config) -> Tuple[List[str], List[str]]:
    """With ``compile`` through inductor, make the compiled graphs static in shape: set
    ``compile.dynamic=False`` unless the config sets ``dynamic``; returns (log notes,
    warnings).

    Inductor (torch 2.14.1, seen here) fails to compile a training graph with symbolic
    sizes when a (B, C, H, W) tensor it saves for the backward has channels_last strides, as
    PaCa's views of (B, N, C) tokens have: ``InductorError: TypeError: cannot determine truth
    value of Relational: 128*s65 < 128`` in ``ir.get_stride_order`` (pytorch/pytorch#172204,
    #185510). torch.compile's default, ``dynamic=None``, recompiles with symbolic sizes at
    the second input size, so Mask R-CNN's multi-scale training stopped with that error in
    its third iteration. With ``dynamic=False`` each input size is compiled once (up to
    dynamo's ``recompile_limit``, ``cache_size_limit`` in older torch, sizes per frame;
    beyond it the frame runs eagerly). docs/benchmarks.md, issue 20.4.
    """
    if compile_backend(cfg) != 'inductor':
        return [], []
    compile_cfg = dict(cfg.compile) if isinstance(cfg.compile, dict) else {}
    if 'dynamic' not in compile_cfg:
        cfg.compile = dict(compile_cfg, dynamic=False)
        return ['compile.dynamic=False set: inductor cannot compile PaCa\'s training graphs '
                'with symbolic sizes (pytorch/pytorch#172204); each input size is compiled '
                'once. Set compile.dynamic in the config to choose otherwise.'], []
    if compile_cfg['dynamic'] is not False:
        return [], [f'compile.dynamic={compile_cfg["dynamic"]}: inductor fails to compile PaCa\'s '
                    'training graphs with symbolic sizes (InductorError "cannot determine truth '
                    'value of Relational", pytorch/pytorch#172204); use compile.dynamic=False '
                    'or compile.backend=aot_eager.']
    return [], []


def torch_version() -> Tuple[int, int]:
    """(major, minor) of the running torch."""
    major, minor = torch.__version__.split('.')[:2]
    return int(major), int(minor)


def _add_custom_hook(cfg: Config, name: str, note: str) -> List[str]:
    """Append ``dict(type=name)`` to ``cfg.custom_hooks`` unless the config has that hook;
    returns ``[note]`` when it was added, else ``[]``."""
    hooks = list(cfg.get('custom_hooks') or [])
    if any(h.get('type') in (name, f'mmengine.{name}') for h in hooks):
        return []
    cfg.custom_hooks = hooks + [dict(type=name)]
    return [note]


def add_eager_optimizer_step_hook(cfg: Config) -> List[str]:
    """With ``compile`` on, append :class:`paca_mm.utils.compile_hook.EagerOptimizerStepHook`
    to ``cfg.custom_hooks`` (once): the optimizer step runs outside the compiled
    ``train_step`` (dynamo cannot trace it over ``paramwise_cfg`` groups, and recompiles it
    whenever a scheduler changes the learning rate); returns log notes."""
    if not compiles(cfg):
        return []
    return _add_custom_hook(
        cfg, 'EagerOptimizerStepHook', 'EagerOptimizerStepHook added: the compiled train_step '
        'calls the optimizer wrapper\'s update_params eagerly (no recompilation at each '
        'learning-rate change)')


def add_rng_state_hook(cfg: Config) -> List[str]:
    """Append :class:`paca_mm.utils.rng_hook.RNGStateHook` to ``cfg.custom_hooks`` (once)
    so checkpoints carry the torch RNG state and ``--resume`` continues it exactly."""
    return _add_custom_hook(
        cfg, 'RNGStateHook',
        'RNGStateHook added: checkpoints keep the torch RNG state for exact --resume')


# ------------------------------------------------------- atomic checkpoints, --resume
def use_atomic_checkpoints(cfg: Config) -> List[str]:
    """Have ``default_hooks.checkpoint`` write checkpoints atomically; returns log notes.

    mmengine writes ``iter_N.pth`` in place (``LocalBackend.put``: ``open(path, 'wb')``),
    so a run killed while saving leaves a truncated file under the final name. This sets
    the hook's ``backend_args=dict(backend='paca_atomic_local')``
    (:class:`~paca_mm.utils.atomic_backend.AtomicLocalBackend`: temporary file in the same
    folder, fsync, ``os.replace``). ``last_checkpoint`` is written by the hook after the
    save returns, so it only ever names a complete file. Left alone: a config that sets
    the hook's own ``backend_args`` / ``file_client_args``, a remote ``out_dir``, a hook
    that is not a CheckpointHook, or no checkpoint hook.
    """
    hook = (cfg.get('default_hooks') or {}).get('checkpoint')
    if not hook:
        return []
    kind = hook.get('type', '')
    name = kind if isinstance(kind, str) else getattr(kind, '__name__', str(kind))
    if not name.split('.')[-1].endswith('CheckpointHook'):
        return [f'checkpoints are not made atomic: default_hooks.checkpoint is {name!r}, '
                'not a CheckpointHook']
    for key in ('backend_args', 'file_client_args'):
        if hook.get(key) is not None:
            return [f'checkpoints are written with the config\'s default_hooks.checkpoint.'
                    f'{key}={hook[key]}, not atomically by paca_mm']
    out_dir = hook.get('out_dir')
    if out_dir is not None and '://' in str(out_dir):
        return [f'checkpoints go to {out_dir} (not a local folder): not made atomic']
    hook['backend_args'] = dict(backend=ATOMIC_BACKEND)
    return ['checkpoints are written atomically (temporary file + os.replace): '
            f"default_hooks.checkpoint.backend_args=dict(backend='{ATOMIC_BACKEND}')"]


def checkpoint_problem(path: str) -> Optional[str]:
    """Why the checkpoint file ``path`` cannot be resumed from, or None if it is complete.

    torch's format is a zip archive: the archive must open (a truncated file has lost its
    central directory at the end) and every member must match its CRC
    (``ZipFile.testzip``, one read of the file). A file in torch's legacy (non-zip) format
    is checked by loading it (weights-only; a refused global still counts as complete:
    loading it later fails with the usual hint).
    """
    if not osp.isfile(path):
        return 'does not exist'
    size = osp.getsize(path)
    if size == 0:
        return 'is empty (0 bytes)'
    with open(path, 'rb') as f:
        magic = f.read(4)
    if magic == b'PK\x03\x04':
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except Exception as e:  # BadZipFile, EOFError, OSError, struct.error ...
            return f'is truncated or corrupt ({size} bytes; {type(e).__name__}: {e})'
        if bad is not None:
            return f'is corrupt ({size} bytes; bad CRC in {bad})'
        return None
    from ..checkpoint import load_checkpoint_file
    try:
        load_checkpoint_file(path)
    except CheckpointError as e:
        if str(e).startswith('refusing to load'):
            return None
        return f'cannot be read ({size} bytes; {str(e)[:300]})'
    except Exception as e:
        return f'cannot be read ({size} bytes; {type(e).__name__}: {str(e)[:300]})'
    return None


def _checkpoint_pattern(cfg: Config) -> 're.Pattern':
    """Regex of the CheckpointHook's file names (``filename_tmpl``), step in group 1."""
    hook = (cfg.get('default_hooks') or {}).get('checkpoint') or {}
    tmpl = hook.get('filename_tmpl') or (
        'epoch_{}.pth' if hook.get('by_epoch', True) else 'iter_{}.pth')
    return re.compile('^' + re.escape(tmpl).replace(re.escape('{}'), r'(\d+)') + '$')


def _checkpoints_newest_first(cfg: Config, folders: List[str]) -> List[str]:
    pattern = _checkpoint_pattern(cfg)
    found: List[Tuple[int, float, str]] = []
    for folder in folders:
        if not osp.isdir(folder):
            continue
        for name in os.listdir(folder):
            m = pattern.match(name)
            path = osp.join(folder, name)
            if m and osp.isfile(path):
                found.append((int(m.group(1)), osp.getmtime(path), path))
    return [path for _, _, path in sorted(found, reverse=True)]


def check_resume_checkpoint(cfg: Config) -> List[str]:
    """Before the Runner is built: make sure ``--resume`` resumes from a complete
    checkpoint; returns warnings to log (empty when nothing was wrong).

    * ``--resume CKPT`` (``cfg.load_from``): a truncated/corrupt local file raises
      :class:`CheckpointError` naming it (no other file is picked silently).
    * ``--resume`` (auto, ``cfg.load_from`` None): the file named by
      ``<work_dir>/last_checkpoint`` is checked (:func:`checkpoint_problem`); if it is
      broken (or ``last_checkpoint`` is empty), the newest complete checkpoint of the
      CheckpointHook's name pattern in its folder and the work dir becomes
      ``cfg.load_from`` and a warning names the broken file(s). If none is complete,
      :class:`CheckpointError` names every file tried. Temporary files that an
      interrupted atomic save left behind are removed. Without ``last_checkpoint``,
      mmengine's behaviour stays: training starts from scratch.
    """
    if not cfg.get('resume'):
        return []
    load_from = cfg.get('load_from')
    if load_from is not None:
        path = str(load_from)
        if '://' in path or not osp.exists(path):  # remote, or mmengine says "not found"
            return []
        problem = checkpoint_problem(path)
        if problem is not None:
            raise CheckpointError(
                f'cannot resume from {path!r}: the checkpoint {problem}. It was probably '
                'written by a run killed while saving. Pass another checkpoint to --resume '
                '(e.g. an older iter_*/epoch_*.pth of that run), or --resume without a path '
                'to resume from the newest complete checkpoint of the work dir.')
        return []

    work_dir = str(cfg.work_dir)
    save_file = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(save_file):
        return []
    with open(save_file) as f:
        latest = f.read().strip()
    if '://' in latest:
        return []
    folders = [osp.dirname(latest)] if latest else []
    folders = list(dict.fromkeys(folders + [work_dir]))
    warnings = []
    for folder in folders:
        for tmp in stale_temporary_files(folder):
            try:
                os.remove(tmp)
            except FileNotFoundError:  # another rank removed it
                continue
            warnings.append(f'removed {tmp}: the partial file of a save that was interrupted')
    if latest:
        problem = checkpoint_problem(latest)
        if problem is None:
            return warnings
        tried = [f'{latest} {problem}']
    else:
        tried = [f'{save_file} is empty']
    for path in _checkpoints_newest_first(cfg, folders):
        if osp.abspath(path) == osp.abspath(latest or save_file):
            continue
        problem = checkpoint_problem(path)
        if problem is None:
            cfg.load_from = path
            warnings.append(
                f'--resume: the latest checkpoint {tried[0]}; resuming from the newest '
                f'complete checkpoint {path} instead'
                + (f' (also skipped: {"; ".join(tried[1:])})' if len(tried) > 1 else ''))
            return warnings
        tried.append(f'{path} {problem}')
    raise CheckpointError(
        f'--resume: no complete checkpoint to resume from in {", ".join(folders)}. Tried: '
        + '; '.join(tried) + '. Delete the broken files and train from scratch (without '
        '--resume), or pass --resume CKPT with a complete checkpoint.')


def _as_list(evaluator: Any) -> list:
    if evaluator is None:
        return []
    if isinstance(evaluator, dict) and 'metrics' in evaluator:  # Evaluator config
        return list(evaluator['metrics'])
    return list(evaluator) if isinstance(evaluator, (list, tuple)) else [evaluator]


def trigger_visualization(cfg: Config, scope: str, show: bool = False,
                          show_dir: Optional[str] = None, wait_time: float = 2.,
                          interval: Optional[int] = None) -> None:
    """Turn on the config's visualization hook the way each toolbox's test.py does.

    ``interval`` (draw every N-th batch) defaults to 1 for mmpretrain (its test.py) and to
    the hook's own setting otherwise (SegVisualizationHook: 50).
    """
    hooks = cfg.get('default_hooks', {})
    if 'visualization' not in hooks:
        raise ValueError('--show/--show-dir need a `visualization` entry in default_hooks '
                         '(e.g. SegVisualizationHook, DetVisualizationHook, VisualizationHook)')
    hook = hooks['visualization']
    if scope == 'mmpretrain':
        hook['enable'] = True
        hook['interval'] = 1 if interval is None else interval
        if show_dir:
            hook['out_dir'] = show_dir
    else:
        hook['draw'] = True
        if interval is not None:
            hook['interval'] = interval
        if show_dir and scope == 'mmseg':
            cfg.visualizer['save_dir'] = show_dir
        elif show_dir:  # mmdet: relative to work_dir/timestamp
            hook['test_out_dir'] = show_dir
    if show:
        hook['show'] = True
        hook['wait_time'] = wait_time


def _default_flip_tta_pipeline(test_pipeline: list) -> list:
    """test pipeline with its last (packing) step replaced by a flip/no-flip TestTimeAug."""
    tta = copy.deepcopy(list(test_pipeline))
    flips = [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)]
    tta[-1] = dict(type='TestTimeAug', transforms=[flips, [test_pipeline[-1]]])
    return tta


def apply_tta(cfg: Config, scope: str) -> None:
    """``--tta``: wrap ``cfg.model`` in ``cfg.tta_model`` and test with ``cfg.tta_pipeline``.

    mmseg requires both in the config (as its test.py); mmdet and mmpretrain fall back to
    their default TTA models with a flip pipeline, as their test.py do.
    """
    test_dataset = cfg.test_dataloader.dataset
    if scope == 'mmseg':
        missing = [k for k in ('tta_model', 'tta_pipeline') if k not in cfg]
        if missing:
            raise ValueError(f'--tta needs {missing} in the config (mmseg has no default)')
    elif scope == 'mmdet':
        cfg.setdefault('tta_model', dict(
            type='mmdet.DetTTAModel',
            tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100)))
        while 'dataset' in test_dataset:
            test_dataset = test_dataset['dataset']
        if 'tta_pipeline' not in cfg:
            cfg.tta_pipeline = _default_flip_tta_pipeline(test_dataset.pipeline)
        if 'batch_shapes_cfg' in test_dataset:
            test_dataset.batch_shapes_cfg = None
    else:  # mmpretrain
        cfg.setdefault('tta_model', dict(type='mmpretrain.AverageClsScoreTTA'))
        if 'tta_pipeline' not in cfg:
            cfg.tta_pipeline = _default_flip_tta_pipeline(test_dataset.pipeline)
    test_dataset.pipeline = cfg.tta_pipeline
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)


def apply_test_args(cfg: Config, scope: str, checkpoint: str, out: Optional[str] = None,
                    show: bool = False, show_dir: Optional[str] = None, wait_time: float = 2.,
                    tta: bool = False, interval: Optional[int] = None) -> None:
    """The ``tools/test.py`` options with each toolbox's semantics:

    * ``--out``: mmseg -> directory of prediction maps for offline evaluation
      (``test_evaluator.output_dir``, ``keep_results``); mmdet -> ``.pkl`` of the
      predictions (DumpDetResults); mmpretrain -> ``.pkl`` of the predictions (DumpResults).
    * ``--show``/``--show-dir``: the config's visualization hook draws (see
      :func:`trigger_visualization`). ``--tta``: see :func:`apply_tta`.
    """
    cfg.load_from = checkpoint
    if show or show_dir:
        trigger_visualization(cfg, scope, show, show_dir, wait_time, interval)
    if tta:
        apply_tta(cfg, scope)
    if out is None:
        return
    if scope == 'mmseg':
        if cfg.get('test_evaluator') is None:
            raise ValueError('--out needs a test_evaluator (IoUMetric) in the config')
        for metric in _as_list(cfg.test_evaluator):
            metric['output_dir'] = out
            metric['keep_results'] = True
        return
    if not out.endswith(('.pkl', '.pickle')):
        raise ValueError(f'--out must be a .pkl/.pickle file for {scope}, got {out!r}')
    dump = dict(type='mmdet.DumpDetResults' if scope == 'mmdet' else 'DumpResults',
                out_file_path=out)
    cfg.test_evaluator = _as_list(cfg.get('test_evaluator')) + [dump]
