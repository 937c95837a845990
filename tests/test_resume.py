"""Resume after a real interruption gives the same weights as an uninterrupted run.

For each CPU demo, the segmentation one (demo/configs/pacahead_tiny_synthetic_seg.py:
PaCa-Tiny + PaCa head, random flips/crops/resizes, dropout 0.1) and the detection one
(demo/configs/mask_rcnn_tiny_synthetic_coco.py: PaCa-Tiny Mask R-CNN, random flips and
multi-scale resizes, a data-loader worker process, RPN/RoI sampling), training runs on a
small synthetic set for 4 iterations with a checkpoint every 2, in deterministic mode with
seed 0:

* run A trains 4 iterations uninterrupted;
* run B is the same training plus a test-only hook that pauses right after the checkpoint
  of iteration 2 (tests/data/tools_demo_{seg,det}_pause.py); the test SIGKILLs it there;
* run C is ``tools/train.py --resume`` in B's work dir with the demo config; it resumes
  from the latest checkpoint (iteration 2) and finishes iterations 3-4.

The final weights and optimizer state of A and C must be bitwise equal (CPU, one thread).
The data augmentation is reproduced by mmengine's replay of the skipped iterations; the
dropout and proposal-sampling streams by the RNGStateHook that tools/train.py adds.
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
DEMOS = {
    'seg': (osp.join(ROOT, 'demo', 'configs', 'pacahead_tiny_synthetic_seg.py'),
            osp.join(DATA, 'tools_demo_seg_pause.py')),
    'det': (osp.join(ROOT, 'demo', 'configs', 'mask_rcnn_tiny_synthetic_coco.py'),
            osp.join(DATA, 'tools_demo_det_pause.py')),
}
MAX_ITERS, CKPT_EVERY = 4, 2


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
            f'test_dataloader.dataset.data_root={data_root}',
            f'train_cfg.max_iters={MAX_ITERS}',
            f'default_hooks.checkpoint.interval={CKPT_EVERY}',
            'default_hooks.logger.interval=1',
            'randomness.seed=0', 'randomness.deterministic=True']


def _run(cmd, cwd, timeout=300):
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f'{cmd}\nstdout:\n{proc.stdout[-3000:]}\n' \
                                 f'stderr:\n{proc.stderr[-5000:]}'
    return proc.stdout + proc.stderr


def _checkpoint(path):
    from paca_mm.checkpoint import allow_mmengine_checkpoint_globals
    allow_mmengine_checkpoint_globals()
    return torch.load(path, map_location='cpu')


def _make_data(task, root):
    if task == 'seg':
        from demo.datasets.synthetic_seg import generate_synthetic_seg
        return generate_synthetic_seg(root, num_train=8, num_val=1, size=(128, 128), seed=0)
    from demo.datasets.synthetic_coco import generate_synthetic_coco
    return generate_synthetic_coco(root, num_train=8, num_val=1, seed=0)['data_root']


@pytest.mark.slow
@pytest.mark.parametrize('task', sorted(DEMOS))
def test_resume_after_kill_matches_uninterrupted_run(tmp_path, task):
    CONFIG, PAUSE_CONFIG = DEMOS[task]
    data_root = _make_data(task, str(tmp_path / 'data'))
    run_a, run_b = tmp_path / 'a', tmp_path / 'b'

    # A: uninterrupted
    _run(_train_cmd(CONFIG, run_a, data_root), cwd=tmp_path)
    assert (run_a / f'iter_{MAX_ITERS}.pth').is_file()

    # B: paused after the checkpoint of iteration 2, then killed (SIGKILL)
    log = open(tmp_path / 'b.log', 'w')
    proc = subprocess.Popen(_train_cmd(PAUSE_CONFIG, run_b, data_root), cwd=tmp_path,
                            env=_env(), stdout=log, stderr=subprocess.STDOUT)
    marker = run_b / f'paused_at_iter_{CKPT_EVERY}'
    deadline = time.time() + 240
    try:
        while not marker.exists():
            if proc.poll() is not None:
                log.close()
                pytest.fail(f'run B exited with {proc.returncode} before pausing:\n'
                            + (tmp_path / 'b.log').read_text()[-5000:])
            if time.time() > deadline:
                pytest.fail(f'run B did not reach the checkpoint of iteration {CKPT_EVERY} '
                            'in 240 s')
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert (run_b / f'iter_{CKPT_EVERY}.pth').is_file()
    assert not (run_b / f'iter_{MAX_ITERS}.pth').exists()
    last = (run_b / 'last_checkpoint').read_text().strip()
    assert last.endswith(f'iter_{CKPT_EVERY}.pth')

    # C: resume in B's work dir from its latest checkpoint, demo config
    out = _run(_train_cmd(CONFIG, run_b, data_root, '--resume'), cwd=tmp_path)
    assert 'Auto resumed from the latest checkpoint' in out, out[-3000:]
    assert f'resumed epoch: 0, iter: {CKPT_EVERY}' in out, out[-3000:]
    assert f'restored the torch RNG state of iteration {CKPT_EVERY}' in out, out[-3000:]
    assert (run_b / f'iter_{MAX_ITERS}.pth').is_file()

    ckpt_a = _checkpoint(run_a / f'iter_{MAX_ITERS}.pth')
    ckpt_c = _checkpoint(run_b / f'iter_{MAX_ITERS}.pth')
    final_a, final_c = ckpt_a['state_dict'], ckpt_c['state_dict']
    mid = _checkpoint(run_b / f'iter_{CKPT_EVERY}.pth')
    assert 'rng_state' in mid['meta']
    assert final_a.keys() == final_c.keys()
    # the comparison is meaningful: the resumed iterations changed the weights
    assert any(not torch.equal(mid['state_dict'][k], final_a[k]) for k in final_a
               if final_a[k].is_floating_point())
    different = [k for k in final_a if not torch.equal(final_a[k], final_c[k])]
    assert not different, (f'resumed run differs from the uninterrupted one in '
                           f'{len(different)} tensors, e.g. {different[:5]}')
    # optimizer moments too
    state_a, state_c = ckpt_a['optimizer']['state'], ckpt_c['optimizer']['state']
    assert state_a.keys() == state_c.keys()
    for k in state_a:
        for name, value in state_a[k].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(state_c[k][name])), \
                (k, name)
