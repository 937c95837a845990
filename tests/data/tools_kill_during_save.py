"""Test-only module for tests/test_atomic_checkpoints.py: the training process SIGKILLs
itself in the middle of writing one checkpoint, as a preempted or OOM-killed job would.

Set ``PACA_TEST_KILL_SAVING=<file name>`` (e.g. ``iter_4.pth``). Importing this module
wraps ``builtins.open``: a binary write of that file -- under its final name (mmengine's
``LocalBackend.put`` writes in place) or under the temporary name of an atomic write
(``.iter_4.pth.tmp-<pid>-<hex>``, paca_mm.fileio) -- writes the first half
of the bytes, flushes them to disk and kills the process. It does not depend on which
backend writes the checkpoint, so the test sees what each one leaves on disk. Nothing
happens without the environment variable.
"""
import builtins
import os
import os.path as osp
import signal

TARGET = os.environ.get('PACA_TEST_KILL_SAVING')
_open = builtins.open


class _KillMidWrite:

    def __init__(self, f):
        self._f = f

    def write(self, data):
        self._f.write(data[:len(data) // 2])
        self._f.flush()
        os.fsync(self._f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


def _is_target(file):
    if not TARGET or not isinstance(file, (str, bytes, os.PathLike)):
        return False
    name = osp.basename(os.fsdecode(file))
    return name == TARGET or name.startswith(f'.{TARGET}.tmp-')


def _open_killing(file, mode='r', *args, **kwargs):
    f = _open(file, mode, *args, **kwargs)
    if 'b' in mode and ('w' in mode or 'x' in mode) and _is_target(file):
        return _KillMidWrite(f)
    return f


if TARGET:
    builtins.open = _open_killing
