"""Checkpoints written by tools/train.py are atomic, and ``--resume`` survives a broken one.

The slow tests train tests/data/tools_tiny_seg.py (tiny PaCaViT + FCN head, 32x32
synthetic images) for 4 iterations with a checkpoint every 2. The run of the module
fixture uses tests/data/tools_tiny_seg_kill.py, whose test-only module
(tests/data/tools_kill_during_save.py) SIGKILLs the process halfway through writing
iter_4.pth, whatever backend writes it. Then:

* the kill leaves no partial iter_4.pth under its final name (mmengine's own LocalBackend
  leaves half a file there), last_checkpoint still names iter_2.pth, and ``--resume``
  continues from iter_2.pth and finishes;
* with a truncated newest checkpoint (the half-written iter_4.pth of the kill, moved to its
  final name, as an in-place writer leaves it) ``--resume`` names it and resumes from
  iter_2.pth;
* with every checkpoint truncated ``--resume`` stops with a clear error, and
  ``--resume CKPT`` of a truncated file names it and does not pick another.

The fast tests check AtomicLocalBackend itself (a write that fails midway leaves the old
file intact and no temporary file) and which configs the tools make atomic.
"""
import os
import os.path as osp
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

import paca_mm  # noqa: F401
from paca_mm import fileio
from paca_mm.engine.checkpoints import (ATOMIC_BACKEND, AtomicLocalBackend,
                                        check_resume_checkpoint, checkpoint_problem,
                                        use_atomic_checkpoints)
from paca_mm.fileio import stale_temporary_files

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DATA = osp.join(ROOT, 'tests', 'data')
CONFIG = osp.join(DATA, 'tools_tiny_seg.py')
KILL_CONFIG = osp.join(DATA, 'tools_tiny_seg_kill.py')
MAX_ITERS, EVERY = 4, 2
KILLED_AT = f'iter_{MAX_ITERS}.pth'  # the second checkpoint


# ----------------------------------------------------------------------------- fast
class _DiskFullMidway:
    """A file whose write stores the first half of the bytes, then fails."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        self._f.write(data[:len(data) // 2])
        self._f.flush()
        raise OSError(28, 'No space left on device (planted)')

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


def _plant_failing_open(monkeypatch, module):
    real_open = open

    def failing_open(file, mode='r', *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return _DiskFullMidway(f) if ('w' in mode or 'x' in mode) else f

    monkeypatch.setattr(module, 'open', failing_open, raising=False)


def test_atomic_backend_keeps_old_file_when_write_fails(tmp_path, monkeypatch):
    from mmengine.fileio import get_file_backend
    backend = get_file_backend(str(tmp_path), backend_args=dict(backend=ATOMIC_BACKEND))
    assert isinstance(backend, AtomicLocalBackend)
    target, text_target = tmp_path / 'iter_2.pth', tmp_path / 'last_checkpoint'
    backend.put(b'old checkpoint', target)
    backend.put_text('old/iter_2.pth', text_target)
    assert target.read_bytes() == b'old checkpoint'

    _plant_failing_open(monkeypatch, fileio)
    with pytest.raises(OSError, match='planted'):
        backend.put(b'N' * 1000, target)
    with pytest.raises(OSError, match='planted'):
        backend.put_text('new/iter_4.pth' * 10, text_target)
    with pytest.raises(OSError, match='planted'):
        backend.put(b'N' * 1000, tmp_path / 'sub' / 'iter_4.pth')  # new file, new folder
    monkeypatch.undo()
    # old content intact, no partial file under any name
    assert target.read_bytes() == b'old checkpoint'
    assert text_target.read_text() == 'old/iter_2.pth'
    assert sorted(os.listdir(tmp_path)) == ['iter_2.pth', 'last_checkpoint', 'sub']
    assert os.listdir(tmp_path / 'sub') == []

    # the same planted failure with mmengine's in-place LocalBackend: half a file is left
    # (what this backend exists for)
    from mmengine.fileio.backends import LocalBackend, local_backend
    _plant_failing_open(monkeypatch, local_backend)
    with pytest.raises(OSError, match='planted'):
        LocalBackend().put(b'N' * 1000, target)
    monkeypatch.undo()
    assert target.read_bytes() == b'N' * 500

    # a successful write replaces the file; an interruption (not an Exception) cleans up
    backend.put(b'new checkpoint', target)
    assert target.read_bytes() == b'new checkpoint'
    monkeypatch.setattr(fileio.os, 'fsync', lambda fd: (_ for _ in ()).throw(
        KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        backend.put(b'X' * 100, target)
    monkeypatch.undo()
    assert target.read_bytes() == b'new checkpoint'
    assert stale_temporary_files(str(tmp_path)) == []


def test_atomic_path_for_writers_that_take_a_file_name(tmp_path):
    """fileio.atomic_path (ONNX export): the target appears only once the block succeeded."""
    from paca_mm.fileio import atomic_path
    target = tmp_path / 'sub' / 'model.onnx'
    with atomic_path(target) as tmp:
        assert osp.dirname(tmp) == str(target.parent) and not target.exists()
        with open(tmp, 'wb') as f:
            f.write(b'first')
    assert target.read_bytes() == b'first'
    with pytest.raises(RuntimeError, match='export failed'):
        with atomic_path(target) as tmp:
            with open(tmp, 'wb') as f:
                f.write(b'half')
            raise RuntimeError('export failed')
    assert target.read_bytes() == b'first' and os.listdir(target.parent) == ['model.onnx']
    with pytest.raises(FileNotFoundError):  # a writer that wrote nothing is an error
        with atomic_path(tmp_path / 'empty.onnx'):
            pass
    assert not (tmp_path / 'empty.onnx').exists()


def test_every_file_writer_goes_through_fileio(tmp_path, monkeypatch):
    """The converter's save, the ONNX export and the visualisation PNGs write atomically."""
    import numpy as np

    from paca_mm import fileio
    from paca_mm.checkpoint import save_checkpoint_atomic
    from paca_mm.visualization import save_image
    written = []
    real = fileio.atomic_path

    def spy(filepath):
        written.append(osp.basename(str(filepath)))
        return real(filepath)

    monkeypatch.setattr(fileio, 'atomic_path', spy)
    save_checkpoint_atomic({'w': torch.ones(2)}, str(tmp_path / 'a.pth'))
    save_image(str(tmp_path / 'b.png'), np.zeros((4, 4, 3), np.uint8))
    assert written == ['a.pth', 'b.png']
    assert torch.equal(torch.load(str(tmp_path / 'a.pth'), weights_only=True)['w'], torch.ones(2))
    import cv2
    assert cv2.imread(str(tmp_path / 'b.png')).shape == (4, 4, 3)


def test_mmengine_save_checkpoint_through_atomic_backend(tmp_path):
    from mmengine.runner.checkpoint import save_checkpoint
    path = tmp_path / 'iter_1.pth'
    save_checkpoint({'state_dict': {'w': torch.ones(3)}}, str(path),
                    backend_args=dict(backend=ATOMIC_BACKEND))
    assert checkpoint_problem(str(path)) is None
    assert torch.equal(torch.load(str(path), weights_only=True)['state_dict']['w'],
                       torch.ones(3))
    assert os.listdir(tmp_path) == ['iter_1.pth']
    # truncated / empty / corrupt in the middle: named problems
    data = path.read_bytes()
    (tmp_path / 'half.pth').write_bytes(data[:len(data) // 2])
    assert 'truncated or corrupt' in checkpoint_problem(str(tmp_path / 'half.pth'))
    (tmp_path / 'empty.pth').write_bytes(b'')
    assert 'empty' in checkpoint_problem(str(tmp_path / 'empty.pth'))
    i = data.index(b'\x00\x00\x80\x3f')  # inside the tensor bytes (1.0f): bad CRC
    (tmp_path / 'flipped.pth').write_bytes(data[:i] + b'\x00\x00\x80\x40' + data[i + 4:])
    assert 'corrupt' in checkpoint_problem(str(tmp_path / 'flipped.pth'))
    assert checkpoint_problem(str(tmp_path / 'missing.pth')) == 'does not exist'


def test_use_atomic_checkpoints_respects_the_config():
    cfg = Config.fromfile(CONFIG)
    notes = use_atomic_checkpoints(cfg)
    assert cfg.default_hooks.checkpoint.backend_args == dict(backend=ATOMIC_BACKEND)
    assert 'atomically' in notes[0]
    # the user's own backend, file_client_args or a remote out_dir: untouched
    for key, value in (('backend_args', dict(backend='petrel')),
                       ('file_client_args', dict(backend='disk')),
                       ('out_dir', 's3://bucket/ckpts')):
        cfg = Config.fromfile(CONFIG)
        cfg.default_hooks.checkpoint[key] = value
        notes = use_atomic_checkpoints(cfg)
        assert cfg.default_hooks.checkpoint.get('backend_args') == (
            value if key == 'backend_args' else None)
        assert 'not' in notes[0]
    cfg = Config.fromfile(CONFIG)  # a local out_dir is written atomically too
    cfg.default_hooks.checkpoint.out_dir = '/tmp/ckpts'
    assert 'atomically' in use_atomic_checkpoints(cfg)[0]
    assert cfg.default_hooks.checkpoint.backend_args == dict(backend=ATOMIC_BACKEND)
    cfg = Config.fromfile(CONFIG)
    cfg.default_hooks.checkpoint = None
    assert use_atomic_checkpoints(cfg) == []


def test_check_resume_without_resume_or_checkpoints(tmp_path):
    cfg = Config.fromfile(CONFIG)
    cfg.work_dir = str(tmp_path)
    assert check_resume_checkpoint(cfg) == []  # no --resume
    cfg.resume = True
    assert check_resume_checkpoint(cfg) == []  # no last_checkpoint: mmengine starts fresh
    cfg.load_from = str(tmp_path / 'missing.pth')
    assert check_resume_checkpoint(cfg) == []  # mmengine reports the missing file


# ----------------------------------------------------------------------------- slow
def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1',
               CUDA_VISIBLE_DEVICES='')
    env.pop('PACA_TEST_KILL_SAVING', None)
    env.update(extra)
    env['PYTHONPATH'] = os.pathsep.join(
        [ROOT, DATA] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    return env


def _train(config, work_dir, data_root, *extra, env=None, cwd=None):
    cmd = [sys.executable, osp.join(ROOT, 'tools', 'train.py'), config, '--work-dir',
           str(work_dir), *extra, '--cfg-options',
           *[f'{split}_dataloader.dataset.data_root={data_root}'
             for split in ('train', 'val', 'test')],
           f'train_cfg.max_iters={MAX_ITERS}', f'default_hooks.checkpoint.interval={EVERY}']
    proc = subprocess.run(cmd, cwd=cwd or str(work_dir.parent), env=env or _env(),
                          capture_output=True, text=True, timeout=300)
    return proc, proc.stdout + proc.stderr


def _ok(proc, out):
    assert proc.returncode == 0, f'exit code {proc.returncode}:\n{out[-6000:]}'


@pytest.fixture(scope='module')
def tiny_data(tmp_path_factory):
    from demo.datasets.synthetic_seg import generate_synthetic_seg
    root = tmp_path_factory.mktemp('atomic_seg_data')
    return generate_synthetic_seg(str(root), num_train=4, num_val=2, size=(32, 32), seed=0)


@pytest.fixture(scope='module')
def killed_run(tmp_path_factory, tiny_data):
    """Work dir of a run SIGKILLed halfway through writing iter_4.pth (never modified by
    the tests: they work on copies) and the run's output."""
    work = tmp_path_factory.mktemp('killed') / 'work'
    proc, out = _train(KILL_CONFIG, work, tiny_data,
                       env=_env(PACA_TEST_KILL_SAVING=KILLED_AT))
    assert proc.returncode == -signal.SIGKILL, \
        f'expected the run to be killed while saving {KILLED_AT}, exit code ' \
        f'{proc.returncode}:\n{out[-6000:]}'
    assert f'Saving checkpoint at {MAX_ITERS} iterations' in out, out[-3000:]
    return work, out


def _copy(work, dst):
    """Copy of a work dir; last_checkpoint re-pointed into the copy."""
    shutil.copytree(str(work), str(dst))
    last = dst / 'last_checkpoint'
    last.write_text(last.read_text().replace(str(work), str(dst)))
    return dst


def _partial_checkpoint(work):
    """The half-written iter_4.pth the kill left (temporary file of the atomic write)."""
    partial = stale_temporary_files(str(work))
    assert len(partial) == 1 and osp.basename(partial[0]).startswith(f'.{KILLED_AT}.tmp-'), \
        os.listdir(work)
    return partial[0]


@pytest.mark.slow
def test_kill_while_saving_leaves_no_partial_checkpoint(killed_run, tiny_data, tmp_path):
    work, out = killed_run
    # no partial file under the final name; the previous checkpoint is complete and is
    # what last_checkpoint names
    assert not (work / KILLED_AT).exists(), \
        f'{KILLED_AT} left by the killed save: {checkpoint_problem(str(work / KILLED_AT))}'
    assert 'checkpoints are written atomically' in out
    assert checkpoint_problem(str(work / f'iter_{EVERY}.pth')) is None
    assert (work / 'last_checkpoint').read_text().strip() == str(work / f'iter_{EVERY}.pth')
    assert 'truncated' in checkpoint_problem(_partial_checkpoint(work))

    # --resume continues from iter_2.pth and finishes
    copy = _copy(work, tmp_path / 'work')
    proc, out = _train(CONFIG, copy, tiny_data, '--resume')
    _ok(proc, out)
    assert f'Auto resumed from the latest checkpoint {copy / f"iter_{EVERY}.pth"}' in out, \
        out[-3000:]
    assert f'resumed epoch: 0, iter: {EVERY}' in out
    assert f'Iter(train) [{MAX_ITERS}/{MAX_ITERS}]' in out
    assert 'the partial file of a save that was interrupted' in out  # temp file removed
    assert stale_temporary_files(str(copy)) == []
    assert checkpoint_problem(str(copy / KILLED_AT)) is None
    assert (copy / 'last_checkpoint').read_text().strip() == str(copy / KILLED_AT)


@pytest.mark.slow
def test_resume_skips_truncated_newest_checkpoint(killed_run, tiny_data, tmp_path):
    work = _copy(killed_run[0], tmp_path / 'work')
    # what an in-place writer leaves: half of iter_4.pth under its final name, named by
    # last_checkpoint
    bad = work / KILLED_AT
    os.replace(_partial_checkpoint(work), bad)
    (work / 'last_checkpoint').write_text(str(bad))
    proc, out = _train(CONFIG, work, tiny_data, '--resume')
    _ok(proc, out)
    assert f'the latest checkpoint {bad} is truncated or corrupt' in out, out[-3000:]
    assert f'resuming from the newest complete checkpoint {work / f"iter_{EVERY}.pth"}' in out
    assert f'resumed epoch: 0, iter: {EVERY}' in out
    assert f'Iter(train) [{MAX_ITERS}/{MAX_ITERS}]' in out
    assert checkpoint_problem(str(bad)) is None  # rewritten by the resumed run
    assert (work / 'last_checkpoint').read_text().strip() == str(bad)


@pytest.mark.slow
def test_resume_stops_when_no_checkpoint_is_complete(killed_run, tiny_data, tmp_path):
    work = _copy(killed_run[0], tmp_path / 'work')
    bad_new, bad_old = work / KILLED_AT, work / f'iter_{EVERY}.pth'
    os.replace(_partial_checkpoint(work), bad_new)
    (work / 'last_checkpoint').write_text(str(bad_new))
    data = bad_old.read_bytes()
    bad_old.write_bytes(data[:len(data) // 3])

    proc, out = _train(CONFIG, work, tiny_data, '--resume')
    assert proc.returncode != 0, out[-3000:]
    assert 'error: --resume: no complete checkpoint to resume from' in proc.stderr, out[-3000:]
    assert f'{bad_new} is truncated or corrupt' in proc.stderr
    assert f'{bad_old} is truncated or corrupt' in proc.stderr
    assert 'Traceback' not in proc.stderr and 'Iter(train)' not in out

    # an explicit --resume CKPT that is truncated: named, no other file picked
    proc, out = _train(CONFIG, work, tiny_data, '--resume', str(bad_new))
    assert proc.returncode != 0, out[-3000:]
    assert f"error: cannot resume from '{bad_new}': the checkpoint is truncated" in \
        proc.stderr, out[-3000:]
    assert 'Traceback' not in proc.stderr and 'Iter(train)' not in out
