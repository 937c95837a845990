import contextlib
import os
import sys

import torch

# The demo package (demo/: generated datasets, demo configs) is not part of paca_mm: the
# repository root makes it importable (the tools' subprocesses add it themselves).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.append(ROOT)

# Keep CPU tests predictable on the 2-core CI machine (dev/mutation_test.py runs its jobs
# on one thread each through PACA_MM_TEST_THREADS=1).
torch.set_num_threads(int(os.environ.get('PACA_MM_TEST_THREADS', 0))
                      or max(1, min(2, os.cpu_count() or 1)))

import pytest  # noqa: E402


@contextlib.contextmanager
def _default_scope_restored():
    """Restore mmengine's default scopes (``DefaultScope._instance_dict``) on exit."""
    from mmengine.registry import DefaultScope
    scopes = dict(DefaultScope._instance_dict)
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(scopes)


@pytest.fixture(autouse=True)
def _isolate_global_state():
    """Tests must not leak process-wide state into each other: grad mode and mmengine's
    default scope (``init_default_scope`` in one test would redirect every later
    ``Registry.build`` to that toolbox)."""
    grad = torch.is_grad_enabled()
    with _default_scope_restored():
        yield
    torch.set_grad_enabled(grad)


@pytest.fixture(autouse=True, scope='module')
def _isolate_module_state():
    """The same for module-scoped fixtures (e.g. a model built once per module under a
    toolbox's scope): each test module leaves mmengine's default scope as it found it."""
    with _default_scope_restored():
        yield


@pytest.fixture(scope='session')
def load_tool():
    """``load_tool('train')``: a fresh import of ``tools/train.py`` (any script under
    ``tools/``, e.g. ``'deployment/pytorch2onnx'``, or under ``dev/`` as
    ``'dev/benchmark'``), to call its ``main(argv)`` in-process."""
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def load(name):
        spec = importlib.util.spec_from_file_location(
            f'_paca_tool_{name.replace("/", "_")}',
            os.path.join(root, *([] if name.startswith('dev/') else ['tools']), f'{name}.py'))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def plain_conv_ffn(monkeypatch):
    """``with plain_conv_ffn(): ...`` runs every ConvFFN through its standard ops
    (``ConvFFN.forward_plain``), also in a training forward that records gradients: the
    reference for :class:`~paca_mm.models.layers.common.DWConvGELULinear`."""
    from paca_mm.models.layers.common import ConvFFN

    @contextlib.contextmanager
    def use():
        with monkeypatch.context() as m:
            m.setattr(ConvFFN, 'forward', ConvFFN.forward_plain)
            yield

    return use


def _relative_grad_errors(grads, ref):
    """{name: |g - g_ref| / |g_ref|}; a gradient that is 0 up to rounding (below 1e-9 of the
    largest: ``attn.k.bias`` and the clustering logits' bias, which the softmax ignores) is
    measured against the largest gradient instead."""
    assert grads.keys() == ref.keys()
    scale = max(g.norm() for g in ref.values())
    return {n: ((grads[n] - ref[n]).norm() / max(ref[n].norm(), 1e-9 * scale)).item()
            for n in ref}


@pytest.fixture
def grad_errors():
    """``grad_errors(grads, ref)``: relative error of each parameter gradient."""
    return _relative_grad_errors


# the files of a clone that building the package reads (setup.py, MANIFEST.in)
PACKAGE_SOURCE = ('setup.py', 'MANIFEST.in', 'README.md', 'LICENSE', 'CITATION.cff',
                  'model-index.yml', 'requirements', 'configs', 'tools', 'paca_mm')


@pytest.fixture(scope='session')
def installed_paca_mm(tmp_path_factory):
    """A non-editable install of this checkout, built once per session: the source files
    copied, then ``pip install --no-deps --no-build-isolation --target`` into a throwaway
    folder (not the venv), which is returned. With ``PYTHONPATH=<it>`` Python and openmim
    use that copy (its configs, tools and model index under ``paca_mm/.mim``)."""
    import shutil
    import subprocess
    base = tmp_path_factory.mktemp('paca_mm_install')
    src, target = base / 'src', base / 'site'
    src.mkdir()
    ignore = shutil.ignore_patterns('__pycache__', '*.pyc', '*.so', '.mim', '*.egg-info')
    for name in PACKAGE_SOURCE:
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, str(src / name), ignore=ignore)
        else:
            shutil.copy(path, str(src / name))
    proc = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-deps',
                           '--no-build-isolation', '--target', str(target), str(src)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    assert proc.returncode == 0, f'pip install of the checkout failed:\n{proc.stdout[-4000:]}'
    return target


# The CPU demos, trained once per test session through tools/train.py and evaluated through
# tools/test.py (shortened budgets); tests of what the trained models do share them.
@pytest.fixture(scope='session')
def demo_det(tmp_path_factory):
    """demo.det.run's result: the detection demo trained for 150 iterations on 120
    generated images (~2 min on 2 cores), AP on 24, also of the untrained detector."""
    from demo import det
    tmp = tmp_path_factory.mktemp('demo_det')
    return det.run(str(tmp / 'det'), iters=150, data_root=str(tmp / 'data'), num_train=120,
                   num_val=24, baseline=True, threads=2, timeout=600)


# A smaller budget than the seg demo (128 px, 300 iterations): about 45 s of CPU.
# Measured (1 thread, busy 2-core box, 46 s wall): mIoU 54.2, per class 75.6 / 45.0 / 52.6 /
# 43.6, chance 18.9.
DEMO_SEG = dict(iters=160, num_train=96, num_val=24, img_size=64)


@pytest.fixture(scope='session')
def demo_seg(tmp_path_factory):
    """demo.seg.run's result for ``DEMO_SEG`` (64 px images, 160 iterations) and its
    ``img_size``."""
    from demo.seg import run
    tmp = tmp_path_factory.mktemp('demo_seg')
    return dict(run(work_dir=str(tmp / 'seg'), data_root=str(tmp / 'data'), timeout=600,
                    threads=1, **DEMO_SEG), img_size=DEMO_SEG['img_size'])


@pytest.fixture(scope='session')
def demo_cls(tmp_path_factory):
    """The classification demo config trained for 2 epochs on 8 generated images per class
    (tools/train.py, cluster hook every 2 iterations): dict(work_dir, checkpoint, options
    (the ``--cfg-options`` for both tools), cwd, output (the tool's output))."""
    import subprocess
    tmp = tmp_path_factory.mktemp('demo_cls')
    data_root = str(tmp / 'data')
    opts = [f'{split}_dataloader.dataset.{k}' for split in ('train', 'val', 'test')
            for k in (f'data_root={data_root}', 'train_per_class=8')]
    opts += ['train_cfg.max_epochs=2', 'train_cfg.val_interval=2',
             'default_hooks.checkpoint.interval=2', 'custom_hooks.0.interval=2']
    work_dir = str(tmp / 'work')
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'tools', 'train.py'),
         os.path.join(ROOT, 'demo', 'configs', 'paca_tiny_synthetic_cls.py'), '--work-dir',
         work_dir, '--cfg-options'] + opts,
        cwd=str(tmp), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dict(work_dir=work_dir, checkpoint=os.path.join(work_dir, 'epoch_2.pth'),
                options=opts, cwd=str(tmp), output=proc.stdout + proc.stderr)


@pytest.fixture(scope='session')
def gpu_check_dry_run(tmp_path_factory):
    """``dev/gpu_check.sh --device cpu`` (the GPU check's dry run: dev/benchmark.py on
    PaCa-Tiny and PVTv2-B2 at 64², fp32 and AMP, the whole-model benchmark, one AMP training
    iteration): dict(proc, out (its output folder)). Its benchmark runs also serve the
    benchmark tool's table tests."""
    import subprocess
    out = tmp_path_factory.mktemp('gpu_check')
    proc = subprocess.run(['bash', os.path.join(ROOT, 'dev', 'gpu_check.sh'), '--device', 'cpu',
                           '--out', str(out)], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHON=sys.executable))
    return dict(proc=proc, out=out)
