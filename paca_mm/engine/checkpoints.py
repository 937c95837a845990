"""Atomic checkpoints and a checked ``--resume`` for ``tools/train.py``.

mmengine's ``LocalBackend.put`` writes ``iter_N.pth`` in place, so a run killed while it
saves leaves a truncated file under its final name. :class:`AtomicLocalBackend` writes
through :func:`paca_mm.fileio.atomic_write` instead (``CheckpointHook`` updates
``last_checkpoint`` after the rename); importing this module, as ``import paca_mm`` does,
registers it in mmengine as ``ATOMIC_BACKEND``.
"""
import os
import os.path as osp
import re
import zipfile
from pathlib import Path
from typing import List, Optional, Tuple, Union

from mmengine.config import Config
from mmengine.fileio import LocalBackend, register_backend

from ..checkpoint import CheckpointError, load_checkpoint_file
from ..fileio import atomic_write, stale_temporary_files
from .args import add_custom_hook

ATOMIC_BACKEND = 'paca_atomic_local'


class AtomicLocalBackend(LocalBackend):
    """mmengine ``LocalBackend`` whose ``put``/``put_text`` replace the target atomically."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        atomic_write(obj, filepath)

    def put_text(self, obj: str, filepath: Union[str, Path], encoding: str = 'utf-8') -> None:
        atomic_write(obj, filepath, encoding=encoding)


# force: re-importing (e.g. importlib.reload in tests) must not fail
register_backend(ATOMIC_BACKEND, AtomicLocalBackend, force=True)


def add_rng_state_hook(cfg: Config) -> List[str]:
    """Add :class:`paca_mm.hooks.RNGStateHook` (once): exact ``--resume``."""
    return add_custom_hook(
        cfg, 'RNGStateHook',
        'RNGStateHook added: checkpoints keep the torch RNG state for exact --resume')


def use_atomic_checkpoints(cfg: Config) -> List[str]:
    """Have ``default_hooks.checkpoint`` write through :class:`AtomicLocalBackend`; returns
    log notes. Left alone: a hook with its own ``backend_args`` / ``file_client_args``, a
    remote ``out_dir``, a hook that is not a CheckpointHook, or no checkpoint hook."""
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

    A zip archive (torch's format) must open (a truncated one has lost its central
    directory) and pass ``ZipFile.testzip`` (CRCs). A legacy (non-zip) file is loaded
    weights-only; a refused global counts as complete (loading it later gives the hint).
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
        return None if bad is None else f'is corrupt ({size} bytes; bad CRC in {bad})'
    try:
        load_checkpoint_file(path)
    except CheckpointError as e:
        if str(e).startswith('refusing to load'):
            return None
        return f'cannot be read ({size} bytes; {str(e)[:300]})'
    except Exception as e:
        return f'cannot be read ({size} bytes; {type(e).__name__}: {str(e)[:300]})'
    return None


def _checkpoints_newest_first(cfg: Config, folders: List[str]) -> List[str]:
    """The files in ``folders`` named like the CheckpointHook's ``filename_tmpl``, by step."""
    hook = (cfg.get('default_hooks') or {}).get('checkpoint') or {}
    tmpl = hook.get('filename_tmpl') or (
        'epoch_{}.pth' if hook.get('by_epoch', True) else 'iter_{}.pth')
    pattern = re.compile('^' + re.escape(tmpl).replace(re.escape('{}'), r'(\d+)') + '$')
    found: List[Tuple[int, float, str]] = []
    for folder in folders:
        for name in os.listdir(folder) if osp.isdir(folder) else []:
            m = pattern.match(name)
            path = osp.join(folder, name)
            if m and osp.isfile(path):
                found.append((int(m.group(1)), osp.getmtime(path), path))
    return [path for _, _, path in sorted(found, reverse=True)]


def check_resume_checkpoint(cfg: Config) -> List[str]:
    """Before the Runner is built: make ``--resume`` resume from a complete checkpoint;
    returns warnings to log. A broken ``--resume CKPT`` raises :class:`CheckpointError`.
    With ``--resume`` alone, a broken (or empty) ``<work_dir>/last_checkpoint`` target is
    replaced by the newest complete checkpoint of the hook's name pattern in its folder and
    the work dir (:class:`CheckpointError` if none); leftovers of interrupted atomic saves
    are removed. Without ``last_checkpoint``, training starts from scratch (as mmengine).
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
    problem = checkpoint_problem(latest) if latest else 'is empty'
    if problem is None:
        return warnings
    tried = [f'{latest or save_file} {problem}']
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
