"""Safe checkpoint loading: weights-only ``torch.load`` plus what mmengine Runner files hold.

Unpickling can run arbitrary code, so every loader of paca_mm, and after ``import paca_mm``
mmengine's ``CheckpointLoader`` for local and ``http(s)://`` files (``load_from``, ``--resume``,
``init_model`` ...), goes through :func:`safe_torch_load`: tensors plus an allow-list of what
Runner checkpoints hold (HistoryBuffer with its methods via a restricted ``getattr``, numpy
arrays/scalars) and timm's hold (``args``: an ``argparse.Namespace``, whose ``__dict__`` passes
the same allow-list). Anything else raises :class:`CheckpointError` naming the refused global.
torch >= 2.4 adds the allow-list to its safe globals (process-wide, also for the toolboxes' own
``torch.load``); older torch uses a restricted unpickler. A trusted file is unpickled in full
on explicit opt-in only: ``trust=True``, ``--trust-checkpoint`` or ``PACA_MM_TRUST_CHECKPOINTS=1``.
"""
import _codecs
import _compat_pickle
import argparse
import io
import logging
import os
import os.path as osp
import pickle
import re
import types
import zipfile
from typing import Any, List, Optional, Sequence

import torch
from mmengine.logging import print_log


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read, is refused, or does not fit the model."""


TRUST_ENV = 'PACA_MM_TRUST_CHECKPOINTS'
_TRUST_HINT = (
    'If you trust the file (you wrote it, or it comes from a source you trust), opt in '
    'explicitly: trust=True in the Python API (load_checkpoint_file, '
    'load_backbone_checkpoint, build_model, run_image_demo), --trust-checkpoint on the '
    'paca_mm tools, or the environment variable ' + TRUST_ENV + '=1 (any loader, also '
    "init_cfg=dict(type='Pretrained') and the toolboxes' own scripts).")


def trust_requested(trust: bool) -> bool:
    """``trust``, or ``PACA_MM_TRUST_CHECKPOINTS`` set to 1/true/yes/on."""
    return bool(trust) or os.environ.get(TRUST_ENV, '').strip().lower() in (
        '1', 'true', 'yes', 'on')


def trust_checkpoints(enable: bool = True) -> None:
    """``--trust-checkpoint``: sets ``PACA_MM_TRUST_CHECKPOINTS=1`` in this process."""
    if enable:
        os.environ[TRUST_ENV] = '1'


def _history_buffer_getattr(obj: Any, name: Any) -> Any:
    """``builtins.getattr`` while unpickling, for HistoryBuffer's public methods only (the
    real one would let a checkpoint fetch any attribute of an allowed object, e.g.
    ``numpy.ndarray.tofile``)."""
    import inspect

    from mmengine.logging import HistoryBuffer
    if (obj is HistoryBuffer and isinstance(name, str) and not name.startswith('_')
            and inspect.isfunction(HistoryBuffer.__dict__.get(name))):
        return HistoryBuffer.__dict__[name]
    raise pickle.UnpicklingError(
        f'weights-only load: getattr({obj!r}, {name!r}) is not allowed in a checkpoint '
        '(paca_mm allows HistoryBuffer methods only)')


def mmengine_checkpoint_globals() -> List[Any]:
    """The non-tensor globals of mmengine Runner and timm ``CheckpointSaver`` checkpoints."""
    import numpy as np
    from mmengine.logging import HistoryBuffer
    try:  # numpy >= 2 moved the private module
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray
    kinds = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
             np.uint64, np.float16, np.float32, np.float64)
    dtype_classes = {type(np.dtype(k)) for k in kinds}  # e.g. numpy.dtypes.Float64DType
    # ``numpy.dtype`` itself stays out of the object-dtype door: an object-dtype
    # instance can only be completed (BUILD) if its class is allow-listed, which it is not.
    return [HistoryBuffer, (_history_buffer_getattr, 'builtins.getattr'), argparse.Namespace,
            multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype,
            *sorted(dtype_classes, key=lambda c: c.__name__)]


def allow_mmengine_checkpoint_globals(extra: Sequence[Any] = ()) -> List[Any]:
    """Add :func:`mmengine_checkpoint_globals` (and ``extra``, e.g. what a custom hook stores)
    to torch's safe globals; returns them ([] on torch < 2.4, which has no allow-list)."""
    if not hasattr(torch.serialization, 'add_safe_globals'):
        return []
    allowed = mmengine_checkpoint_globals() + list(extra)
    current = getattr(torch.serialization, 'get_safe_globals', list)()
    torch.serialization.add_safe_globals([g for g in allowed if g not in current])
    return allowed


def _restricted_pickle_module():
    """torch < 2.4: a pickle module resolving torch's weights-only globals and
    :func:`mmengine_checkpoint_globals` only; any other global raises ``UnpicklingError``."""
    from torch import _weights_only_unpickler
    allowed = dict(_weights_only_unpickler._get_allowed_globals())
    # every dtype and torch.device, as newer torch allows (torch 2.1 lists some dtypes only)
    allowed.update({str(t): t for t in vars(torch).values() if isinstance(t, torch.dtype)})
    allowed['torch.device'] = torch.device
    allowed['_codecs.encode'] = _codecs.encode  # bytes in protocol 2 (also torch >= 2.4)
    for g in mmengine_checkpoint_globals():
        obj, name = g if isinstance(g, tuple) else (g, f'{g.__module__}.{g.__qualname__}')
        allowed[name] = obj

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            # protocol-2 pickles (torch.save) name Python 2 modules, e.g. __builtin__
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            full = f'{module}.{name}'
            if full in allowed:
                return allowed[full]
            raise pickle.UnpicklingError(
                f'Unsupported global: GLOBAL {full} was not an allowed global')

    module = types.ModuleType('paca_mm_restricted_pickle')
    module.__dict__.update(Unpickler=Unpickler, UnpicklingError=pickle.UnpicklingError,
                           load=lambda file, **kwargs: Unpickler(file, **kwargs).load())
    return module


def _refused(message: str):
    """``(what was refused, True)`` from a weights-only load's error, or ``(first line of the
    error, False)`` if nothing was (a corrupt file)."""
    found = re.search(r'GLOBAL (\S+) (was not an allowed global|whose module)', message)
    if found:
        return f'the global {found.group(1)}', True
    found = re.search(r'(getattr\(.*?\)) is not allowed', message)
    if found:
        return f'builtins.{found.group(1)} (only HistoryBuffer methods are allowed)', True
    found = re.search(r'^.*(Can only build|Can only create new object|reduce for '
                      r'unrecognized function).*$', message, re.M)
    if found:
        return f'an object outside the allow-list ({found.group(0).strip()[:300]})', True
    lines = message.split('WeightsUnpickler error:')[-1].strip().splitlines()
    return (lines[0] if lines else '?')[:300], False


def safe_torch_load(f, map_location='cpu', trust: bool = False, source: Optional[str] = None):
    """``torch.load`` under the policy of this module."""
    source = source or (f if isinstance(f, str) else '<file object>')
    if trust_requested(trust):
        print_log(f'{source}: trusted checkpoint, unpickled in full (weights_only=False)',
                  logger='current', level=logging.WARNING)
        try:
            return torch.load(f, map_location=map_location, weights_only=False)
        except (AttributeError, ImportError, pickle.UnpicklingError) as e:
            raise CheckpointError(f'cannot unpickle trusted checkpoint {source!r}: '
                                  f'{type(e).__name__}: {e}') from e
    if allow_mmengine_checkpoint_globals():  # torch >= 2.4
        kwargs = dict(weights_only=True)
    else:
        kwargs = dict(weights_only=False, pickle_module=_restricted_pickle_module())
    try:
        return torch.load(f, map_location=map_location, **kwargs)
    except pickle.UnpicklingError as e:
        what, refused = _refused(str(e))
        if refused:
            raise CheckpointError(
                f'refusing to load checkpoint {source!r}: it pickles {what}, which is '
                'neither a tensor nor in the allow-list of what mmengine Runner checkpoints '
                'contain; unpickling it could run arbitrary code. ' + _TRUST_HINT) from None
        raise CheckpointError(
            f'cannot read checkpoint {source!r} weights-only ({what}): the file is corrupt, '
            'not a PyTorch checkpoint, or pickles objects paca_mm does not load by default. '
            + _TRUST_HINT) from None


def _download(url: str) -> str:
    """Path of ``url`` cached in ``<torch hub dir>/checkpoints`` (rank 0 downloads first)."""
    from urllib.parse import urlparse

    from mmengine.dist import get_dist_info
    from torch.hub import download_url_to_file, get_dir
    cached = osp.join(get_dir(), 'checkpoints', osp.basename(urlparse(url).path))
    rank, world_size = get_dist_info()
    if rank > 0 and world_size > 1:
        torch.distributed.barrier()  # wait for rank 0
    if not osp.isfile(cached):
        os.makedirs(osp.dirname(cached), exist_ok=True)
        download_url_to_file(url, cached, progress=False)
    if rank == 0 and world_size > 1:
        torch.distributed.barrier()
    return cached


def load_from_local(filename, map_location=None):
    """mmengine ``CheckpointLoader`` scheme for local files."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return safe_torch_load(filename, map_location)


def load_from_http(filename, map_location=None, trust: bool = False):
    """mmengine ``CheckpointLoader`` scheme for ``http(s)://``."""
    return safe_torch_load(_download(filename), map_location, trust, source=filename)


def install_safe_checkpoint_loading() -> None:
    """Called by ``import paca_mm``: the allow-list, and safe ``CheckpointLoader`` schemes for
    local and ``http(s)://`` files; others (``s3://``, ``open-mmlab://`` ...) stay mmengine's."""
    from mmengine.runner import CheckpointLoader
    allow_mmengine_checkpoint_globals()
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)
    CheckpointLoader.register_scheme(prefixes=('http://', 'https://'), loader=load_from_http,
                                     force=True)


def load_checkpoint_file(path: str, map_location='cpu', trust: bool = False) -> dict:
    """Read a checkpoint file, ``http(s)://`` URL or other ``scheme://`` path (through
    ``mmengine.fileio.get``) into a dict, with errors that say what to fix."""
    path = str(path)
    if re.match(r'^https?://', path):
        return load_from_http(path, map_location, trust)
    if '://' in path and not osp.exists(path):  # s3://, petrel:// ...
        from mmengine.fileio import get
        return safe_torch_load(io.BytesIO(get(path)), map_location, trust, source=path)
    path = osp.expanduser(path)
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'checkpoint not found: {path!r} (resolved against the working directory '
            f'{os.getcwd()!r}). Download the released file or fix the path in init_cfg / '
            '--checkpoint; PaCaViT never falls back to random weights silently.')
    try:
        return safe_torch_load(path, map_location, trust)
    except CheckpointError:
        raise
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(
            f'cannot read checkpoint {path!r} ({osp.getsize(path)} bytes): the file is '
            f'truncated or corrupt, or not a PyTorch checkpoint. Original error: '
            f'{type(e).__name__}: {str(e)[:300]}') from e
