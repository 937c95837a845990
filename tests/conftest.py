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


def _load_fixture_lane():
    """tests/_fixture_lane.py (by path: in importlib mode tests/ is not on ``sys.path``)."""
    import importlib.util
    name = '_paca_mm_fixture_lane'
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(os.path.dirname(os.path.abspath(__file__)), '_fixture_lane.py'))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_lane_module = _load_fixture_lane()

# The heavy session fixtures (tests/_fixture_lane.py): built in a background process while
# the tests run ("the fixture lane"), or inline where no lane runs.
_LANE = dict(lane=None, inline={}, threads=None)  # the Lane; {name: seconds} of inline builds;
# the test process's torch threads, while the lane runs with one of the two cores


def pytest_sessionstart(session):
    _LANE.update(lane=None, inline={}, threads=None)


def pytest_runtest_setup(item):
    """While the lane builds, this process computes on one thread: two processes of two
    threads each on 2 cores stall each other's parallel regions (measured: the suite took
    longer than without a lane). The usual thread count is back once the lane is done."""
    lane, threads = _LANE['lane'], _LANE['threads']
    if threads is not None and lane.proc.poll() is not None:
        torch.set_num_threads(threads)
        _LANE['threads'] = None


def _lane_wanted(config) -> bool:
    return not config.option.collectonly and os.environ.get('PACA_MM_FIXTURE_LANE') != '0'


def _uses_lane(item) -> bool:
    return any(name in _lane_module.BUILDERS for name in getattr(item, 'fixturenames', ()))


def pytest_collection_modifyitems(session, config, items):
    """With the lane on, the tests that use a heavy fixture run last (in their collected
    order), so that the lane builds while the others run instead of keeping them waiting."""
    if _lane_wanted(config):
        items.sort(key=_uses_lane)  # stable: False (no heavy fixture) first


def pytest_collection_finish(session):
    """Start the fixture lane for the heavy fixtures the collected tests use, in the order of
    their first use (``PACA_MM_FIXTURE_LANE=0``: build them inline)."""
    if not _lane_wanted(session.config):
        return
    names = []
    for item in session.items:
        for name in getattr(item, 'fixturenames', ()):
            if name in _lane_module.BUILDERS and name not in names:
                names.append(name)
    if names:
        try:
            _LANE['lane'] = _lane_module.Lane(names, dict(os.environ))
            _LANE['threads'] = torch.get_num_threads()
            torch.set_num_threads(1)
        except OSError as e:       # no lane: the fixtures build inline
            import warnings
            warnings.warn(f'the fixture lane did not start ({e}); heavy fixtures build inline')


def pytest_sessionfinish(session):
    lane = _LANE['lane']
    if lane is not None:
        lane.stop()


def pytest_terminal_summary(terminalreporter):
    lane, inline = _LANE['lane'], _LANE['inline']
    if lane is None and not inline:
        return
    write = terminalreporter.write_line
    terminalreporter.section('heavy session fixtures (tests/_fixture_lane.py)')
    if lane is not None:
        write(f'fixture lane order: {", ".join(lane.names)}')
        for name in lane.names:
            built = lane.built.get(name)
            state = ('failed' if name in lane.failed else
                     'result not read' if built is None else f'built in {built:.1f} s')
            waited = lane.waited.get(name)
            write(f'  {name}: {state}; tests waited '
                  + ('never (unused)' if waited is None else f'{waited:.1f} s'))
    for name, secs in inline.items():
        write(f'  {name}: built inline in {secs:.1f} s')


def _heavy_fixture(name, tmp_path_factory):
    """The value of heavy fixture ``name``: from the lane if it builds it, else built now."""
    lane = _LANE['lane']
    if lane is not None and name in lane.names:
        try:
            return lane.result(name)
        except RuntimeError as e:
            message = str(e)
        pytest.fail(message, pytrace=False)      # outside the except: no chained traceback
    import time
    start = time.time()
    try:
        value = _lane_module.BUILDERS[name](tmp_path_factory.mktemp(name))
    finally:
        _LANE['inline'][name] = time.time() - start
    return _lane_module.decode(name, value)


@pytest.fixture(scope='session')
def installed_paca_mm(tmp_path_factory):
    """A non-editable install of this checkout, built once per session: the source files
    copied, then ``pip install --no-deps --no-build-isolation --target`` into a throwaway
    folder (not the venv), which is returned. With ``PYTHONPATH=<it>`` Python and openmim
    use that copy (its configs, tools and model index under ``paca_mm/.mim``)."""
    return _heavy_fixture('installed_paca_mm', tmp_path_factory)


# The CPU demos, trained once per test session through tools/train.py and evaluated through
# tools/test.py (shortened budgets); tests of what the trained models do share them.
@pytest.fixture(scope='session')
def demo_det(tmp_path_factory):
    """demo.det.run's result: the detection demo trained for 150 iterations on 120
    generated images (~2 min on 1 core), AP on 24, also of the untrained detector. Each tool
    runs on 1 thread (it used 2 before the fixture lane, which builds the fixtures on the core
    the tests leave idle): the accuracy floor of tests/test_det_e2e.py was measured with 1
    thread."""
    return _heavy_fixture('demo_det', tmp_path_factory)


@pytest.fixture(scope='session')
def demo_seg(tmp_path_factory):
    """demo.seg.run's result for ``DEMO_SEG`` (64 px images, 160 iterations) and its
    ``img_size``."""
    return _heavy_fixture('demo_seg', tmp_path_factory)


@pytest.fixture(scope='session')
def demo_cls(tmp_path_factory):
    """The classification demo config trained for 2 epochs on 8 generated images per class
    (tools/train.py, cluster hook every 2 iterations): dict(work_dir, checkpoint, options
    (the ``--cfg-options`` for both tools), cwd, output (the tool's output))."""
    return _heavy_fixture('demo_cls', tmp_path_factory)


@pytest.fixture(scope='session')
def gpu_check_dry_run(tmp_path_factory):
    """``dev/gpu_check.sh --device cpu`` (the GPU check's dry run: dev/benchmark.py on
    PaCa-Tiny and PVTv2-B2 at 64², fp32 and AMP, the whole-model benchmark, one AMP training
    iteration): dict(proc, out (its output folder)). Its benchmark runs also serve the
    benchmark tool's table tests."""
    return _heavy_fixture('gpu_check_dry_run', tmp_path_factory)
