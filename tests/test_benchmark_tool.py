"""tools/benchmark.py end to end on a tiny input (the figures themselves are not asserted:
speed is checked by running the benchmark, not by timed tests)."""
import csv
import os.path as osp
import subprocess
import sys

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _run(tmp_path, *extra):
    cmd = [sys.executable, osp.join(ROOT, 'tools', 'benchmark.py'), '--models', 'paca_tiny',
           'swin_t', '--sizes', '64', '--repeats', '1', '--warmup', '0', '--threads', '1',
           '--out', str(tmp_path), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with open(tmp_path / 'benchmark.csv') as f:
        rows = list(csv.DictReader(f))
    return proc, rows, (tmp_path / 'benchmark.md').read_text()


def test_benchmark_table(tmp_path):
    proc, rows, md = _run(tmp_path)
    # the reference model is added, every model has a row, ratios are to it
    assert [r['model'] for r in rows] == ['paca_tiny', 'swin_t', 'pvt_v2_b2']
    ref = rows[-1]
    assert float(ref['fwd_ms_fused_ratio']) == 1.0 and float(ref['mem_mb_ratio']) == 1.0
    assert float(ref['train_mem_mb_ratio']) == 1.0
    for r in rows:
        assert float(r['fwd_ms_fused']) > 0 and float(r['fwd_bwd_ms']) > 0
        assert r['best_engine'] == 'fused' and r['best_fwd_ms'] == r['fwd_ms_fused']
        assert float(r['mem_mb']) >= 0 and float(r['fwd_faults_k']) >= 0
        # a training step keeps activations and gradients: more than an inference forward
        assert float(r['train_mem_mb']) > float(r['mem_mb'])
        assert 0 <= float(r['fwd_steal_pct']) <= 100  # Linux reports steal in /proc/stat
    assert abs(float(rows[0]['params_m']) - 11.81568) < 1e-4  # PaCa-Tiny backbone
    assert 'default glibc malloc' in md and '| paca_tiny | 64x64, 1 |' in md
    assert '| fwd steal % |' in md and '| train peak MB |' in md
    # the PaCa model against each peer, in the one engine timed
    assert '| paca_tiny | swin_t | 64x64 |' in md and '| paca_tiny | pvt_v2_b2 | 64x64 |' in md
    assert (tmp_path / 'benchmark.png').stat().st_size > 0


def test_benchmark_engines(tmp_path):
    """Every engine times every model; ratios within an engine and best against best are
    the figures' own quotients; a batch given with the size is used."""
    proc, rows, md = _run(tmp_path, '--engine', 'eager', 'fused', 'compile', 'onnxruntime',
                          '--skip-backward', '--skip-memory', '--sizes', '48:2')
    engines = ('eager', 'fused', 'compile', 'onnxruntime')
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
    # the peers have no PaCa module: their fused model is the model, timed once
    for peer in ('swin_t', 'pvt_v2_b2'):
        assert by[peer]['fwd_ms_fused'] == by[peer]['fwd_ms_eager']
    assert 'swin_t      48:2: exported to ONNX' in proc.stdout
    assert 'paca_tiny      48:2: compiled + first forward' in proc.stdout
    paca, swin = by['paca_tiny'], by['swin_t']
    line = next(ln for ln in md.splitlines() if ln.startswith('| paca_tiny | swin_t | 48x48 |'))
    cells = [c.strip() for c in line.strip('|').split('|')][3:]
    for e, cell in zip(engines, cells):
        assert float(cell) == pytest.approx(
            float(paca[f'fwd_ms_{e}']) / float(swin[f'fwd_ms_{e}']), abs=0.006)
    assert float(cells[4]) == pytest.approx(
        float(paca['best_fwd_ms']) / float(swin['best_fwd_ms']), abs=0.006)


def test_benchmark_engine_errors(tmp_path):
    """Contradicting or unusable engine choices stop before any model is built."""
    base = [sys.executable, osp.join(ROOT, 'tools', 'benchmark.py'), '--out', str(tmp_path)]
    for extra, msg in ((['--no-fuse', '--engine', 'fused'], 'contradict each other'),
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
    cmd = [sys.executable, osp.join(ROOT, 'tools', 'benchmark.py'), '--device', 'cuda',
           '--out', str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2
    assert 'no CUDA device is usable here' in proc.stderr
    proc = subprocess.run(cmd[:-4] + ['--device', 'gpu0', '--out', str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and 'is not a torch device' in proc.stderr


def test_benchmark_amp_on_cpu(tmp_path):
    """--amp (bf16 autocast on the CPU) runs forward and forward + backward for every model."""
    proc, rows, md = _run(tmp_path, '--amp', '--skip-memory')
    assert 'amp=True' in md
    for r in rows:
        assert float(r['fwd_ms_fused']) > 0 and float(r['fwd_bwd_ms']) > 0
