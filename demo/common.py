"""Helpers shared by the CPU demos (:mod:`demo.seg`, :mod:`demo.det`)."""
import os
import os.path as osp
import subprocess
import sys
import time
from typing import List, Optional

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def run_tool(args: List[str], log_path: str, timeout: Optional[float],
             threads: Optional[int] = None) -> float:
    """Run ``python <args>`` from the repo root, output to ``log_path``; return seconds."""
    env = dict(os.environ)
    if threads is not None:
        env['OMP_NUM_THREADS'] = env['MKL_NUM_THREADS'] = str(threads)
    env['PYTHONPATH'] = REPO_ROOT + (os.pathsep + env['PYTHONPATH']
                                     if env.get('PYTHONPATH') else '')
    start = time.time()
    with open(log_path, 'w') as log:
        proc = subprocess.run([sys.executable] + args, cwd=REPO_ROOT, env=env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = ''.join(f.readlines()[-40:])
        raise RuntimeError(f'{" ".join(args[:2])} failed (exit {proc.returncode}); '
                           f'log: {log_path}\n{tail}')
    return time.time() - start


def config_iters(config: str) -> int:
    """``train_cfg.max_iters`` of an iteration-based config."""
    from mmengine.config import Config
    return int(Config.fromfile(config).train_cfg.max_iters)
