"""Atomic checkpoint writes for runs through ``tools/train.py``.

mmengine's ``LocalBackend.put`` (what ``save_checkpoint`` uses for a local work dir)
opens ``iter_N.pth`` with ``'wb'`` and writes it in place: a run killed while it saves
(preemption, OOM killer, a time limit) leaves a truncated ``iter_N.pth`` under its final
name. :class:`AtomicLocalBackend` writes to a temporary file next to the target
(``.<name>.tmp-<pid>-<random>``), flushes and fsyncs it, then ``os.replace``-s it onto
the final name, so ``iter_N.pth`` is either the previous complete file or the new complete
one. ``CheckpointHook`` writes ``last_checkpoint`` only after ``save_checkpoint`` returns,
i.e. after the rename.

``tools/train.py`` selects it with ``default_hooks.checkpoint.backend_args =
dict(backend='paca_atomic_local')`` (see :func:`paca_mm.utils.runtime.use_atomic_checkpoints`);
importing this module (``import paca_mm`` does) registers the name in mmengine.
"""
import os
import os.path as osp
import re
import uuid
from pathlib import Path
from typing import List, Union

from mmengine.fileio import LocalBackend, register_backend
from mmengine.utils import mkdir_or_exist

ATOMIC_BACKEND = 'paca_atomic_local'
# temporary files of an unfinished write: ".<final name>.tmp-<pid>-<8 hex>"
_TMP_NAME = re.compile(r'^\.(?P<name>.+)\.tmp-\d+-[0-9a-f]{8}$')


def _fsync_dir(folder: str) -> None:
    """Make a rename in ``folder`` durable (best effort; not possible on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(data: Union[bytes, str], filepath: Union[str, Path],
                 encoding: str = 'utf-8') -> None:
    """Write ``data`` to ``filepath`` atomically: temporary file in the same folder,
    flush + fsync, ``os.replace``. On any error (or interruption) the temporary file is
    removed and ``filepath`` keeps its previous content (or stays absent)."""
    filepath = str(filepath)
    folder = osp.dirname(osp.abspath(filepath))
    mkdir_or_exist(folder)
    tmp = osp.join(folder, f'.{osp.basename(filepath)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}')
    if isinstance(data, str):
        data = data.encode(encoding)
    try:
        # builtin open, not mkstemp: the file gets the usual umask permissions
        with open(tmp, 'xb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, filepath)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(folder)


def stale_temporary_files(folder: str) -> List[str]:
    """Temporary files that :func:`atomic_write` left in ``folder`` (a process killed
    while writing): paths, sorted. They are never complete checkpoints."""
    if not osp.isdir(folder):
        return []
    return sorted(osp.join(folder, name) for name in os.listdir(folder)
                  if _TMP_NAME.match(name))


class AtomicLocalBackend(LocalBackend):
    """mmengine ``LocalBackend`` whose ``put``/``put_text`` replace the target file
    atomically (see :func:`atomic_write`); everything else is ``LocalBackend``'s."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        atomic_write(obj, filepath)

    def put_text(self, obj: str, filepath: Union[str, Path], encoding: str = 'utf-8') -> None:
        atomic_write(obj, filepath, encoding=encoding)


# force: re-importing (e.g. importlib.reload in tests) must not fail
register_backend(ATOMIC_BACKEND, AtomicLocalBackend, force=True)
