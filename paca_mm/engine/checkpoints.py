"""Atomic checkpoints and a checked ``--resume`` for ``tools/train.py``.

mmengine's ``LocalBackend.put`` (what ``save_checkpoint`` uses for a local work dir)
opens ``iter_N.pth`` with ``'wb'`` and writes it in place: a run killed while it saves
(preemption, OOM killer, a time limit) leaves a truncated ``iter_N.pth`` under its final
name. :class:`AtomicLocalBackend` writes through :func:`paca_mm.fileio.atomic_write`
(temporary file next to the target, fsync, ``os.replace``), so ``iter_N.pth`` is either the
previous complete file or the new complete one. ``CheckpointHook`` writes
``last_checkpoint`` only after ``save_checkpoint`` returns, i.e. after the rename.
:func:`use_atomic_checkpoints` selects the backend (``backend_args=dict(backend=
'paca_atomic_local')``; importing this module, as ``import paca_mm`` does, registers the
name in mmengine), and :func:`check_resume_checkpoint` makes ``--resume`` skip a truncated
newest checkpoint for the newest complete one, or stop with a clear error.
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
    """Have ``default_hooks.checkpoint`` write through :class:`AtomicLocalBackend` (see the
    module doc); returns log notes. Left alone: a config that sets the hook's own
    ``backend_args`` / ``file_client_args``, a remote ``out_dir``, a hook that is not a
    CheckpointHook, or no checkpoint hook.
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
