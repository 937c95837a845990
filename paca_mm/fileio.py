"""Atomic file writes: the one writer behind every file paca_mm writes. The data goes to a
temporary file next to the target, is fsynced and ``os.replace``-d onto the final name, so
the target holds its previous (or no) content or the new complete content, never a partial
file, even when the process is killed while writing.
"""
import contextlib
import os
import os.path as osp
import re
import uuid
from pathlib import Path
from typing import Iterator, List, Union

# temporary files of an unfinished write: ".<final name>.tmp-<pid>-<8 hex>"
_TMP_NAME = re.compile(r'^\.(?P<name>.+)\.tmp-\d+-[0-9a-f]{8}$')


def _fsync(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(filepath: Union[str, Path]) -> Iterator[str]:
    """``with atomic_path(dst) as tmp:`` write the file ``tmp`` (by name, e.g. with a
    library that only takes a path); on leaving the block it is fsynced and replaces
    ``dst`` (folders are created). On any error or interruption inside the block or while
    committing, the temporary file is removed and ``dst`` is left as it was."""
    filepath = str(filepath)
    folder = osp.dirname(osp.abspath(filepath))
    os.makedirs(folder, exist_ok=True)
    tmp = osp.join(folder, f'.{osp.basename(filepath)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}')
    try:
        yield tmp
        _fsync(tmp, os.O_RDWR)  # also fails if the block wrote nothing
        os.replace(tmp, filepath)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename durable (best effort; not on Windows)
        _fsync(folder, os.O_RDONLY)


def atomic_write(data: Union[bytes, str], filepath: Union[str, Path],
                 encoding: str = 'utf-8') -> None:
    """Write ``data`` (bytes, or str encoded with ``encoding``) to ``filepath`` atomically."""
    if isinstance(data, str):
        data = data.encode(encoding)
    with atomic_path(filepath) as tmp:
        # builtin open, not mkstemp: the file gets the usual umask permissions
        with open(tmp, 'xb') as f:
            f.write(data)


def stale_temporary_files(folder: str) -> List[str]:
    """Temporary files that an interrupted atomic write left in ``folder`` (a process killed
    while writing): paths, sorted. They never hold complete content."""
    if not osp.isdir(folder):
        return []
    return sorted(osp.join(folder, name) for name in os.listdir(folder)
                  if _TMP_NAME.match(name))
