"""Resume after a real interruption gives the same weights as an uninterrupted run.

The tiny segmentation config (tests/data/tools_tiny_seg.py: PaCaViT + FCN head, 32x32
synthetic images, deterministic mode, seed 0, no dropout/drop path) trains for 6
iterations with a checkpoint every 3:

* run A trains 6 iterations uninterrupted;
* run B is the same training with a test-only hook that pauses right after the
  checkpoint of iteration 3; the test SIGKILLs the process there;
* run C is ``tools/train.py --resume`` in B's work dir (latest checkpoint = iteration 3),
  with the plain config, and finishes iterations 4-6.

The final weights of A and C must be bitwise equal (CPU, one thread).
"""
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DATA = osp.join(ROOT, 'tests', 'data')
CONFIG = osp.join(DATA, 'tools_tiny_seg.py')
PAUSE_CONFIG = osp.join(DATA, 'tools_tiny_seg_pause.py')


def _env():
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1',
               CUDA_VISIBLE_DEVICES='')
    env['PYTHONPATH'] = os.pathsep.join(
        [ROOT, DATA] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    return env


def _train_cmd(config, work_dir, data_root, *extra):
    return [sys.executable, osp.join(ROOT, 'tools', 'train.py'), config,
            '--work-dir', str(work_dir), *extra, '--cfg-options',
            f'train_dataloader.dataset.data_root={data_root}',
            f'val_dataloader.dataset.data_root={data_root}',
            f'test_dataloader.dataset.data_root={data_root}']


def _run(cmd, cwd, timeout=300):
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f'{cmd}\nstdout:\n{proc.stdout[-3000:]}\n' \
                                 f'stderr:\n{proc.stderr[-5000:]}'
    return proc.stdout + proc.stderr


def _state_dict(path):
    from paca_mm.utils import allow_mmengine_checkpoint_globals
    allow_mmengine_checkpoint_globals()
    return torch.load(path, map_location='cpu')['state_dict']


@pytest.mark.slow
def test_resume_after_kill_matches_uninterrupted_run(tmp_path):
    from paca_mm.datasets.synthetic_seg import generate_synthetic_seg
    data_root = generate_synthetic_seg(str(tmp_path / 'data'), num_train=4, num_val=2,
                                       size=(32, 32), seed=0)
    run_a, run_b = tmp_path / 'a', tmp_path / 'b'

    # A: uninterrupted
    _run(_train_cmd(CONFIG, run_a, data_root), cwd=tmp_path)
    assert (run_a / 'iter_6.pth').is_file()

    # B: paused after the checkpoint of iteration 3, then killed (SIGKILL)
    log = open(tmp_path / 'b.log', 'w')
    proc = subprocess.Popen(_train_cmd(PAUSE_CONFIG, run_b, data_root), cwd=tmp_path,
                            env=_env(), stdout=log, stderr=subprocess.STDOUT)
    marker = run_b / 'paused_at_iter_3'
    deadline = time.time() + 240
    try:
        while not marker.exists():
            if proc.poll() is not None:
                log.close()
                pytest.fail(f'run B exited with {proc.returncode} before pausing:\n'
                            + (tmp_path / 'b.log').read_text()[-5000:])
            if time.time() > deadline:
                pytest.fail('run B did not reach the checkpoint of iteration 3 in 240 s')
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert (run_b / 'iter_3.pth').is_file()
    assert not (run_b / 'iter_6.pth').exists()
    assert (run_b / 'last_checkpoint').read_text().strip().endswith('iter_3.pth')

    # C: resume in B's work dir from its latest checkpoint, plain config
    out = _run(_train_cmd(CONFIG, run_b, data_root, '--resume'), cwd=tmp_path)
    assert 'Auto resumed from the latest checkpoint' in out, out[-3000:]
    assert 'resumed epoch: 0, iter: 3' in out, out[-3000:]
    assert (run_b / 'iter_6.pth').is_file()

    final_a = _state_dict(run_a / 'iter_6.pth')
    final_c = _state_dict(run_b / 'iter_6.pth')
    at_3 = _state_dict(run_b / 'iter_3.pth')
    assert final_a.keys() == final_c.keys()
    # the comparison is meaningful: iterations 4-6 changed the weights
    assert any(not torch.equal(at_3[k], final_a[k]) for k in final_a
               if final_a[k].is_floating_point())
    different = [k for k in final_a if not torch.equal(final_a[k], final_c[k])]
    assert not different, f'resumed run differs from the uninterrupted one in {different}'
