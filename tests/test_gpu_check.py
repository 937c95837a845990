"""dev/gpu_check.sh in its ``--device cpu`` dry mode: the GPU check's whole path (both
benchmark runs, the AMP training through tools/train.py, the Markdown report) runs here, so
it is known to work before it first meets a GPU."""
import csv
import json
import os
import os.path as osp
import re
import subprocess
import sys

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SCRIPT = osp.join(ROOT, 'dev', 'gpu_check.sh')


def _run(*args, **env):
    return subprocess.run(['bash', SCRIPT, *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHON=sys.executable, **env))


def _csv(path):
    with open(path, newline='') as f:
        return {r['model']: r for r in csv.DictReader(f)}


@pytest.mark.slow
def test_dry_run_writes_the_report(gpu_check_dry_run):
    res, tmp_path = gpu_check_dry_run['proc'], gpu_check_dry_run['out']
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = (tmp_path / 'gpu_check.md').read_text()
    assert 'dry run' in report
    # both benchmark runs really ran with the precision their column names
    assert 'amp=False' in (tmp_path / 'benchmark_fp32' / 'benchmark.md').read_text()
    assert 'amp=True' in (tmp_path / 'benchmark_amp' / 'benchmark.md').read_text()
    fp32 = _csv(tmp_path / 'benchmark_fp32' / 'benchmark.csv')
    amp = _csv(tmp_path / 'benchmark_amp' / 'benchmark.csv')
    assert set(fp32) == set(amp) == {'paca_tiny', 'pvt_v2_b2'}
    for model in fp32:
        row = re.search(rf'^\| {model} \| 64x64 \|(.*)\|$', report, re.M)
        assert row, report
        cells = [c.strip() for c in row.group(1).split('|')]
        # params, fwd fp32, fwd AMP, fwd+bwd fp32, fwd+bwd AMP, memory fp32, memory AMP, train
        # memory fp32, train memory AMP:
        # every figure measured, each from the run its column names
        # (one engine per run: its figure is the best one)
        expected = [fp32[model]['params_m'], fp32[model]['best_fwd_ms'],
                    amp[model]['best_fwd_ms'], fp32[model]['fwd_bwd_ms'],
                    amp[model]['fwd_bwd_ms'], fp32[model]['mem_mb'], amp[model]['mem_mb'],
                    fp32[model]['train_mem_mb'], amp[model]['train_mem_mb']]
        assert cells == [f'{float(v):.1f}' for v in expected], (cells, expected)
    # the whole-model benchmark ran in both precisions, its tables are in the report
    for tag in ('fp32', 'amp'):
        zoo = json.loads((tmp_path / f'zoo_{tag}.json').read_text())
        assert [r['task'] for r in zoo['records']] == ['seg', 'det'] and zoo['settings'][
            'amp'] == (tag == 'amp')
        assert zoo['records'][0]['ms']['logits']['eager'] > 0
    assert '## Whole models, fp32' in report and '## Whole models, AMP' in report
    train = re.search(r'^\| 1 \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| – \|$', report, re.M)
    assert train, report  # one iteration, finite loss, a time; no CUDA memory on the CPU
    assert float(train.group(1)) > 0


def test_bad_arguments_are_named():
    res = _run('--device', 'tpu')
    assert res.returncode != 0 and "--device must be cuda or cpu, got 'tpu'" in res.stdout
    res = _run('--frobnicate')
    assert res.returncode != 0 and "unknown argument '--frobnicate'" in res.stdout


def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    if __import__('torch').cuda.is_available():
        pytest.skip('this machine has a GPU: the real check would run')
    res = _run('--device', 'cuda', '--out', str(tmp_path))
    assert res.returncode != 0
    assert 'torch.cuda.is_available() is False here' in res.stderr
