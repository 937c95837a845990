"""dev/benchmark.py end to end on a tiny input (the figures themselves are not asserted:
speed is checked by running the benchmark, not by timed tests)."""
import csv
import os.path as osp
import subprocess
import sys

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _run(tmp_path, *extra, models=('paca_tiny',)):
    """The benchmark on PaCa-Tiny (and the reference model the tool adds) at 64x64."""
    cmd = [sys.executable, osp.join(ROOT, 'dev', 'benchmark.py'), '--models', *models,
           '--sizes', '64', '--repeats', '1', '--warmup', '0', '--threads', '1',
           '--out', str(tmp_path), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with open(tmp_path / 'benchmark.csv') as f:
        rows = list(csv.DictReader(f))
    return proc, rows, (tmp_path / 'benchmark.md').read_text()


def _dry_run(gpu_check_dry_run, tag):
    """The benchmark table of the GPU check's dry run (``dev/benchmark.py`` on PaCa-Tiny
    and the reference model at 64x64, one repetition): (rows, Markdown)."""
    proc, folder = gpu_check_dry_run['proc'], gpu_check_dry_run['out'] / f'benchmark_{tag}'
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(folder / 'benchmark.csv') as f:
        return list(csv.DictReader(f)), (folder / 'benchmark.md').read_text()


@pytest.mark.slow
def test_benchmark_table(gpu_check_dry_run):
    rows, md = _dry_run(gpu_check_dry_run, 'fp32')
    # the reference model is added, every model has a row, ratios are to it
    assert [r['model'] for r in rows] == ['paca_tiny', 'pvt_v2_b2']
    ref = rows[-1]
    assert float(ref['fwd_ms_eager_ratio']) == 1.0 and float(ref['mem_mb_ratio']) == 1.0
    assert float(ref['train_mem_mb_ratio']) == 1.0
    for r in rows:
        assert float(r['fwd_ms_eager']) > 0 and float(r['fwd_bwd_ms']) > 0
        assert r['best_engine'] == 'eager' and r['best_fwd_ms'] == r['fwd_ms_eager']
        assert float(r['mem_mb']) >= 0 and float(r['fwd_faults_k']) >= 0
        # a training step keeps activations and gradients: more than an inference forward
        assert float(r['train_mem_mb']) > float(r['mem_mb'])
        assert 0 <= float(r['fwd_steal_pct']) <= 100  # Linux reports steal in /proc/stat
    assert abs(float(rows[0]['params_m']) - 11.81568) < 1e-4  # PaCa-Tiny backbone
    assert 'default glibc malloc' in md and '| paca_tiny | 64x64, 1 |' in md
    assert '| fwd steal % |' in md and '| train peak MB |' in md
    # the PaCa model against each peer, in the one engine timed
    assert '| paca_tiny | pvt_v2_b2 | 64x64 |' in md
    # ... with the training figures divided likewise (no MACs counted: a dash)
    paca, peer = rows[0], rows[1]
    line = next(ln for ln in md.splitlines()
                if ln.startswith('| paca_tiny | pvt_v2_b2 | 64x64 |'))
    cells = [c.strip() for c in line.strip('|').split('|')]
    assert float(cells[-3]) == pytest.approx(
        float(paca['fwd_bwd_ms']) / float(peer['fwd_bwd_ms']), abs=0.006)
    assert float(cells[-2]) == pytest.approx(
        float(paca['train_mem_mb']) / float(peer['train_mem_mb']), abs=0.006)
    assert cells[-1] == '–'
    assert (gpu_check_dry_run['out'] / 'benchmark_fp32' / 'benchmark.png').stat().st_size > 0


def test_benchmark_engines(tmp_path):
    """Every engine times every model; ratios within an engine and best against best are
    the figures' own quotients; a batch given with the size is used. (The compile engine
    uses aot_eager here: inductor's code generation took 70 s of this test on torch 2.14
    and 150 s on torch 2.1; inductor inference is checked on a small model by
    tests/test_compile.py::test_inductor_inference_equals_eager.)"""
    proc, rows, md = _run(tmp_path, '--engine', 'eager', 'compile', 'onnxruntime',
                          '--skip-backward', '--skip-memory', '--sizes', '48:2',
                          '--compile-backend', 'aot_eager')
    engines = ('eager', 'compile', 'onnxruntime')
    by = {r['model']: r for r in rows}
    for r in rows:
        assert r['size'] == '48x48' and r['batch'] == '2'
        ms = {e: float(r[f'fwd_ms_{e}']) for e in engines}
        assert all(v > 0 for v in ms.values())
        assert r['best_engine'] == min(ms, key=ms.get)
        assert float(r['best_fwd_ms']) == min(ms.values())
        for e in engines:
            assert float(r[f'fwd_ms_{e}_ratio']) == pytest.approx(
                ms[e] / float(by['pvt_v2_b2'][f'fwd_ms_{e}']))
    assert set(by) == {'paca_tiny', 'pvt_v2_b2'}
    assert 'pvt_v2_b2      48:2: exported to ONNX' in proc.stdout
    assert 'paca_tiny      48:2: compiled + first forward' in proc.stdout
    paca, peer = by['paca_tiny'], by['pvt_v2_b2']
    line = next(ln for ln in md.splitlines()
                if ln.startswith('| paca_tiny | pvt_v2_b2 | 48x48 |'))
    cells = [c.strip() for c in line.strip('|').split('|')][3:]
    for e, cell in zip(engines, cells):
        assert float(cell) == pytest.approx(
            float(paca[f'fwd_ms_{e}']) / float(peer[f'fwd_ms_{e}']), abs=0.006)
    assert float(cells[len(engines)]) == pytest.approx(
        float(paca['best_fwd_ms']) / float(peer['best_fwd_ms']), abs=0.006)


def test_benchmark_engine_errors(tmp_path):
    """Unknown, contradicting or unusable choices stop before any model is built."""
    base = [sys.executable, osp.join(ROOT, 'dev', 'benchmark.py'), '--out', str(tmp_path)]
    for extra, msg in ((['--engine', 'fused'], "invalid choice: 'fused'"),
                       (['--engine', 'onnxruntime', '--amp'], 'runs the float32 export'),
                       (['--sizes', '64xa'], 'is not a size')):
        proc = subprocess.run(base + extra, capture_output=True, text=True, timeout=300,
                              cwd=ROOT)
        assert proc.returncode == 2 and msg in proc.stderr, proc.stderr[-1000:]


def test_benchmark_malloc_keep(tmp_path):
    proc, rows, md = _run(tmp_path, '--skip-backward', '--skip-memory', '--malloc-keep')
    assert 'freed memory kept in the heap' in md
    assert rows[0]['fwd_bwd_ms'] == '' and rows[0]['mem_mb'] == ''
    assert rows[0]['train_mem_mb'] == ''


def test_benchmark_bad_device(tmp_path):
    """A device the machine lacks is named in a clear error, before any model is built."""
    if torch.cuda.is_available():
        pytest.skip('this machine has a CUDA device')
    cmd = [sys.executable, osp.join(ROOT, 'dev', 'benchmark.py'), '--device', 'cuda',
           '--out', str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2
    assert 'no CUDA device is usable here' in proc.stderr
    proc = subprocess.run(cmd[:-4] + ['--device', 'gpu0', '--out', str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and 'is not a torch device' in proc.stderr


@pytest.mark.slow
def test_benchmark_amp_on_cpu(gpu_check_dry_run):
    """--amp (bf16 autocast on the CPU) runs forward and forward + backward for every model."""
    rows, md = _dry_run(gpu_check_dry_run, 'amp')
    assert 'amp=True' in md
    for r in rows:
        assert float(r['fwd_ms_eager']) > 0 and float(r['fwd_bwd_ms']) > 0


@pytest.mark.parametrize('settle', [0, 2])
def test_benchmark_settle(tmp_path, load_tool, monkeypatch, settle):
    """Each timed forward follows ``--settle`` untimed forwards of the same model and engine
    (so it measures that engine's steady state, not the switch from another model)."""
    bench = load_tool('dev/benchmark')
    calls = []
    real = bench.time_forward

    def spy(fn, x, device, amp, threads=None):
        res = real(fn, x, device, amp)
        calls.append((id(fn), threads is not None))  # timed calls pass threads
        return res

    monkeypatch.setattr(bench, 'time_forward', spy)
    bench.main(['--models', 'paca_tiny', 'swin_t', '--sizes', '32', '--repeats', '2',
                '--warmup', '0', '--settle', str(settle), '--engine', 'eager',
                '--skip-backward', '--skip-memory', '--threads', '1', '--out', str(tmp_path)])
    timed = [i for i, (_, t) in enumerate(calls) if t]
    assert len(timed) == 2 * 3  # 2 rounds x (paca_tiny, swin_t, pvt_v2_b2)
    assert len(calls) == (1 + settle) * len(timed)
    for i in timed:  # the calls right before a timed one ran the same model
        assert all(calls[j][0] == calls[i][0] for j in range(i - settle, i))
        assert i - settle == 0 or calls[i - settle - 1][0] != calls[i][0]


def test_benchmark_rejects_bad_counts(tmp_path):
    base = [sys.executable, osp.join(ROOT, 'dev', 'benchmark.py'), '--out', str(tmp_path)]
    for extra in (['--settle', '-1'], ['--repeats', '0']):
        res = subprocess.run(base + extra, capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and '--repeats must be >= 1' in res.stderr


@pytest.mark.parametrize('scope', ['mmpretrain', 'mmseg'])
def test_benchmark_builds_in_mmdet_scope(load_tool, scope):
    """The peers are mmdet's models whichever default scope is current: under mmpretrain's
    scope (set by a test or tool run earlier in the same process) ``swin_t`` used to build
    mmpretrain's SwinTransformer and fail on ``embed_dims``."""
    from mmdet.models.backbones import SwinTransformer
    from mmengine.registry import DefaultScope
    bench = load_tool('dev/benchmark')
    with DefaultScope.overwrite_default_scope(scope):
        model = bench.build('swin_t', 'cpu')
        assert DefaultScope.get_current_instance().scope_name == scope  # left as it was
    assert type(model) is SwinTransformer


@pytest.mark.slow
def test_train_step_time_tool(tmp_path, load_tool):
    """dev/train_step_time.py trains the config twice through tools/train.py, eager and
    with mmengine's ``compile`` option (``aot_eager`` here to keep the suite's time), and
    reports both median step times and their ratio."""
    from mmengine.config import Config
    tool = load_tool('dev/train_step_time')
    config = osp.join(ROOT, 'tests', 'data', 'tools_tiny_seg.py')
    medians = tool.main([config, '--data', 'seg', '--work-dir', str(tmp_path), '--iters', '3',
                         '--skip', '1', '--backend', 'aot_eager', '--cfg-options',
                         'param_scheduler.0.eta_min=1e-5'])
    assert set(medians) == {'eager', 'compiled'} and min(medians.values()) > 0
    md = (tmp_path / 'train_step_time.md').read_text()
    assert 'backend aot_eager' in md and '| tools_tiny_seg.py |' in md
    assert f'{medians["compiled"] / medians["eager"]:.2f} |' in md
    for mode, compiled in (('eager', None), ('compiled', dict(backend='aot_eager'))):
        dumped = Config.fromfile(str(tmp_path / mode / 'tools_tiny_seg.py'))
        assert dumped.get('compile') == compiled and dumped.train_cfg.max_iters == 3


def test_train_step_time_rejects_bad_counts(load_tool):
    tool = load_tool('dev/train_step_time')
    with pytest.raises(SystemExit):
        tool.main(['some_config.py', '--iters', '3', '--skip', '3'])
