"""The heavy session fixtures of tests/conftest.py (trained demos, the GPU check's dry run, an
installed copy of the package): their builders, and the "fixture lane" that builds them in
the background while the tests run.

Most tests are short single-threaded Python work, so one of the CI machine's two cores is
mostly idle while they run. After collection, conftest starts ONE child process
(``python tests/_fixture_lane.py LANE_DIR NAME...``, cwd the repository root, with the
environment pytest had at that moment and ``OMP_NUM_THREADS=1``) that builds the fixtures the
collected tests use, one after another in the order of their first use, and writes each
result atomically to ``LANE_DIR/NAME.json`` (``NAME.error``: the traceback). A fixture then
waits for its file; where no lane runs (``--collect-only``, a fixture requested only at run
time, ``PACA_MM_FIXTURE_LANE=0``) it is built inline, in the test process, by the same
builder. A process, not a thread: tests monkeypatch ``os.environ``, which a thread's
subprocesses would inherit.

Each builder takes a fresh folder for its outputs and returns a JSON-able value;
:func:`decode` turns it into what the fixture returns.
"""
import json
import os
import os.path as osp
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

# the files of a clone that building the package reads (setup.py, MANIFEST.in)
PACKAGE_SOURCE = ('setup.py', 'MANIFEST.in', 'README.md', 'LICENSE', 'CITATION.cff',
                  'model-index.yml', 'requirements', 'configs', 'tools', 'paca_mm')

# A smaller budget than the seg demo (128 px, 300 iterations): about 45 s of CPU.
# Measured (1 thread, busy 2-core box, 46 s wall): mIoU 54.2, per class 75.6 / 45.0 / 52.6 /
# 43.6, chance 18.9.
DEMO_SEG = dict(iters=160, num_train=96, num_val=24, img_size=64)


def build_installed_paca_mm(base):
    """A non-editable install of this checkout: the source files copied, then ``pip install
    --no-deps --no-build-isolation --target`` into ``base/site`` (not the venv)."""
    base = Path(base)
    src, target = base / 'src', base / 'site'
    src.mkdir()
    ignore = shutil.ignore_patterns('__pycache__', '*.pyc', '*.so', '.mim', '*.egg-info')
    for name in PACKAGE_SOURCE:
        path = osp.join(ROOT, name)
        if osp.isdir(path):
            shutil.copytree(path, str(src / name), ignore=ignore)
        else:
            shutil.copy(path, str(src / name))
    proc = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-deps',
                           '--no-build-isolation', '--target', str(target), str(src)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    assert proc.returncode == 0, f'pip install of the checkout failed:\n{proc.stdout[-4000:]}'
    return str(target)


def build_demo_det(base):
    """demo.det.run: the detection demo trained for 150 iterations on 120 generated images,
    AP on 24, also of the untrained detector; 1 thread per tool run (the accuracy floor of
    tests/test_det_e2e.py was measured with 1 thread)."""
    from demo import det
    return det.run(osp.join(str(base), 'det'), iters=150, data_root=osp.join(str(base), 'data'),
                   num_train=120, num_val=24, baseline=True, threads=1, timeout=600)


def build_demo_seg(base):
    """demo.seg.run for ``DEMO_SEG`` (1 thread), with its ``img_size``."""
    from demo.seg import run
    return dict(run(work_dir=osp.join(str(base), 'seg'), data_root=osp.join(str(base), 'data'),
                    timeout=600, threads=1, **DEMO_SEG), img_size=DEMO_SEG['img_size'])


def build_demo_cls(base):
    """tools/train.py on the classification demo config: 2 epochs on 8 generated images per
    class (cluster hook every 2 iterations), 1 thread, run from ``base``."""
    base = str(base)
    data_root = osp.join(base, 'data')
    opts = [f'{split}_dataloader.dataset.{k}' for split in ('train', 'val', 'test')
            for k in (f'data_root={data_root}', 'train_per_class=8')]
    opts += ['train_cfg.max_epochs=2', 'train_cfg.val_interval=2',
             'default_hooks.checkpoint.interval=2', 'custom_hooks.0.interval=2']
    work_dir = osp.join(base, 'work')
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, osp.join(ROOT, 'tools', 'train.py'),
         osp.join(ROOT, 'demo', 'configs', 'paca_tiny_synthetic_cls.py'), '--work-dir',
         work_dir, '--cfg-options'] + opts,
        cwd=base, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dict(work_dir=work_dir, checkpoint=osp.join(work_dir, 'epoch_2.pth'),
                options=opts, cwd=base, output=proc.stdout + proc.stderr)


def build_gpu_check_dry_run(base):
    """``dev/gpu_check.sh --device cpu --out base`` (its exit status is the test's to check)."""
    proc = subprocess.run(['bash', osp.join(ROOT, 'dev', 'gpu_check.sh'), '--device', 'cpu',
                           '--out', str(base)], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHON=sys.executable))
    return dict(proc=dict(args=proc.args, returncode=proc.returncode, stdout=proc.stdout,
                          stderr=proc.stderr), out=str(base))


BUILDERS = dict(installed_paca_mm=build_installed_paca_mm, demo_det=build_demo_det,
                demo_seg=build_demo_seg, demo_cls=build_demo_cls,
                gpu_check_dry_run=build_gpu_check_dry_run)


def decode(name, value):
    """A builder's JSON-able result as its fixture returns it."""
    if name == 'installed_paca_mm':
        return Path(value)
    if name == 'gpu_check_dry_run':
        return dict(proc=subprocess.CompletedProcess(**value['proc']), out=Path(value['out']))
    return value


def _tail(path, chars=4000):
    try:
        with open(path, errors='replace') as f:
            return f.read()[-chars:]
    except OSError as e:
        return f'({path} unreadable: {e})'


class Lane:
    """The parent's side: start the child, wait for a fixture's file, stop the child."""

    def __init__(self, names, env):
        self.names = list(names)
        self.dir = tempfile.mkdtemp(prefix='paca_mm_fixture_lane_')
        self.log = osp.join(self.dir, 'lane.log')
        self.waited = {}          # name: seconds the tests waited for it
        self.built = {}           # name: seconds the lane took to build it
        self.failed = set()
        try:
            with open(self.log, 'w') as log:
                # a session of its own: stop() ends the child and the tools it runs together
                self.proc = subprocess.Popen(
                    [sys.executable, osp.abspath(__file__), self.dir] + self.names, cwd=ROOT,
                    env=dict(env, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1'), stdout=log,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def result(self, name, poll=0.5):
        """Wait for ``name``'s file; its decoded value, or raise with the builder's error."""
        start = time.time()
        ok, err = osp.join(self.dir, f'{name}.json'), osp.join(self.dir, f'{name}.error')
        try:
            while True:
                dead = self.proc.poll() is not None     # before looking: no race with a write
                if osp.exists(ok):
                    with open(ok) as f:
                        record = json.load(f)
                    self.built[name] = record['seconds']
                    return decode(name, record['value'])
                if osp.exists(err):
                    self.failed.add(name)
                    raise RuntimeError(f'building the {name} fixture failed in the fixture lane '
                                       f'(tests/_fixture_lane.py):\n{_tail(err, 8000)}')
                if dead:
                    self.failed.add(name)
                    building = self._building()
                    raise RuntimeError(
                        f'the fixture lane (tests/_fixture_lane.py, pid {self.proc.pid}) exited '
                        f'with status {self.proc.returncode} without building {name}; its log:'
                        f'\n{_tail(self.log)}' + (building and (
                            f'\nthe end of the output of {building}, the fixture it was '
                            f'building:\n' + _tail(osp.join(self.dir, f'{building}.log')))))
                time.sleep(poll)
        finally:
            self.waited[name] = self.waited.get(name, 0.0) + time.time() - start

    def _building(self):
        """The fixture the lane started last ('' if none)."""
        started = [n for n in self.names if osp.exists(osp.join(self.dir, f'{n}.log'))]
        return started[-1] if started else ''

    def _group_alive(self):
        self.proc.poll()                          # a zombie child would count as alive
        try:
            os.killpg(self.proc.pid, 0)
        except OSError:
            return False
        return True

    def stop(self):
        """End the child and the tools it runs (its process group) if still running; remove
        the lane's folder."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self._group_alive():
                break
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                break
            deadline = time.time() + 10
            while time.time() < deadline and self._group_alive():
                time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)


def main(lane_dir, names):
    """The child: build ``names`` one after another into ``lane_dir``. Its own output (the
    lane's log) is one line per fixture; a builder's output goes to ``NAME.log``."""
    from paca_mm.fileio import atomic_write
    log = os.fdopen(os.dup(1), 'w')
    for name in names:
        start = time.time()
        print(f'fixture lane: building {name} (output: {name}.log)', file=log, flush=True)
        with open(osp.join(lane_dir, f'{name}.log'), 'wb') as out:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
        try:
            base = osp.join(lane_dir, name)
            os.makedirs(base)
            value = BUILDERS[name](base)
            text = json.dumps(dict(value=value, seconds=round(time.time() - start, 1)))
        except Exception:
            traceback.print_exc()
            atomic_write(traceback.format_exc(), osp.join(lane_dir, f'{name}.error'))
            print(f'fixture lane: {name} FAILED after {time.time() - start:.1f} s', file=log,
                  flush=True)
            continue
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        atomic_write(text, osp.join(lane_dir, f'{name}.json'))
        print(f'fixture lane: {name} built in {time.time() - start:.1f} s', file=log,
              flush=True)


if __name__ == '__main__':
    sys.path[0] = ROOT          # the demo package; not tests/ (this script's folder)
    main(sys.argv[1], sys.argv[2:])
