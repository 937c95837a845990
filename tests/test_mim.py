"""openmim end to end on a non-editable install of paca_mm (``installed_paca_mm`` in
tests/conftest.py): ``mim train`` and ``mim test`` of the demo classifier, ``mim download``
of a released checkpoint (served on 127.0.0.1) and ``mim run paca_mm get_flops``.

The subprocesses import paca_mm from the install only (``PYTHONPATH`` = the install and a
folder holding a copy of demo/, which is not packaged: the demo configs import
``demo.datasets``); mim finds the tools and configs under ``paca_mm/.mim``.
"""
import os
import os.path as osp
import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CLS_CFG = osp.join(ROOT, 'demo', 'configs', 'paca_tiny_synthetic_cls.py')
IMAGENET = 'configs/paca_vit_imagenet'
TINY_CLS = 'pacavit_tiny_p2cconv_100_0_8xb128_in1k'
RELEASE = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/'
_NUM = r'-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?'


@pytest.fixture(scope='module')
def mim_env(installed_paca_mm, tmp_path_factory):
    """(base folder, environment, install) for running mim against the install."""
    base = tmp_path_factory.mktemp('mim')
    shutil.copytree(osp.join(ROOT, 'demo'), str(base / 'path' / 'demo'),
                    ignore=shutil.ignore_patterns('__pycache__'))
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='',
               PYTHONPATH=os.pathsep.join([str(installed_paca_mm), str(base / 'path')]))
    return base, env, installed_paca_mm


def _run(args, mim_env, python_args=('-m', 'mim')):
    base, env, _ = mim_env
    cmd = [sys.executable, *python_args] + [str(a) for a in args]
    proc = subprocess.run(cmd, cwd=str(base), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert proc.returncode == 0, f'{cmd} failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}'
    return proc.stdout


def _cls_options(base):
    """--cfg-options shrinking the demo run: 32x32 images, 8 train / 4 val images."""
    opts = []
    for split in ('train', 'val', 'test'):
        opts += [f'{split}_dataloader.dataset.data_root={base / "data"}',
                 f'{split}_dataloader.dataset.train_per_class=2',
                 f'{split}_dataloader.dataset.val_per_class=1',
                 f'{split}_dataloader.dataset.img_size=32', f'{split}_dataloader.batch_size=4']
    return ['--cfg-options'] + opts + [
        'train_dataloader.dataset.pipeline.1.scale=32', 'default_hooks.logger.interval=1',
        'train_cfg.max_epochs=1', 'custom_hooks=[]']


@pytest.fixture(scope='module')
def trained(mim_env):
    base = mim_env[0]
    out = _run(['train', 'paca_mm', CLS_CFG, '--gpus', '0', '--work-dir', base / 'work'] +
               _cls_options(base), mim_env)
    return out, base / 'work' / 'epoch_1.pth'


def _script(mim_env, name):
    return re.escape(osp.join(str(mim_env[2]), 'paca_mm', '.mim', 'tools', name))


def test_mim_train(trained, mim_env):
    out, ckpt = trained
    assert re.search(r'Training command is \S+ ' + _script(mim_env, 'train.py'), out), out[-3000:]
    assert re.search(r'Epoch\(train\) \[1\]\[2/2\]', out), out[-3000:]
    assert ckpt.is_file()


def test_mim_test(trained, mim_env):
    base, ckpt = mim_env[0], trained[1]
    out = _run(['test', 'paca_mm', CLS_CFG, '--checkpoint', ckpt, '--gpus', '0',
                '--work-dir', base / 'test'] + _cls_options(base), mim_env)
    assert re.search(r'Testing command is \S+ ' + _script(mim_env, 'test.py'), out), out[-3000:]
    assert f'Load checkpoint from {ckpt}' in out
    line = re.findall(r'Epoch\(test\) \[1/1\]\s+(.*)', out)
    assert line, out[-3000:]
    metrics = dict(re.findall(rf'(\S+): ({_NUM})(?=\s|$)', line[-1]))
    # 4 test images: the accuracies are multiples of 25 %
    assert float(metrics['accuracy/top1']) % 25 == 0 and float(metrics['accuracy/top2']) % 25 == 0


def _tiny_cls_entry():
    with open(osp.join(ROOT, IMAGENET, 'metafile.yml')) as f:
        (model, ) = [m for m in yaml.safe_load(f)['Models'] if m['Name'] == TINY_CLS]
    return model


# `mim download` with its own download function (requests) and a local server standing in
# for the release host: argv = served folder, the URL prefix it serves, mim's arguments.
SERVE_AND_RUN_MIM = r'''
import functools, http.server, sys, threading
import requests
served, prefix = sys.argv[1:3]
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=served)
server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
real_get = requests.get

def get(url, *args, **kwargs):
    assert url.startswith(prefix), 'no network in tests: ' + url
    print('fetched', url)
    local = 'http://127.0.0.1:%d/%s' % (server.server_port, url[len(prefix):])
    return real_get(local, *args, **kwargs)

requests.get = get
import paca_mm
print('paca_mm from', paca_mm.__file__)
from mim.cli import cli
sys.argv = ['mim'] + sys.argv[3:]
cli()
'''


def test_mim_download(mim_env, tmp_path):
    url = _tiny_cls_entry()['Weights']
    assert url.startswith(RELEASE)
    served = tmp_path / 'served'
    served.mkdir()
    torch.save({'patch_embed.proj.weight': torch.randn(2, 3)}, str(served / osp.basename(url)))
    dest = tmp_path / 'dest'
    out = _run([served, RELEASE, 'download', 'paca_mm', '--config', TINY_CLS, '--dest', dest],
               mim_env, python_args=('-c', SERVE_AND_RUN_MIM))
    install = str(mim_env[2])
    assert f'paca_mm from {osp.join(install, "paca_mm", "__init__.py")}' in out
    assert re.findall(r'^fetched (\S+)$', out, re.M) == [url]
    with open(str(served / osp.basename(url)), 'rb') as a, \
            open(str(dest / osp.basename(url)), 'rb') as b:
        assert a.read() == b.read()
    cfg = Config.fromfile(str(dest / f'{TINY_CLS}.py'))  # the config, dumped
    assert cfg.model.backbone.arch == 'pacavit_tiny_p2cconv_100_0'


def test_mim_run_get_flops(mim_env):
    config = osp.join(str(mim_env[2]), 'paca_mm', '.mim', IMAGENET, f'{TINY_CLS}.py')
    out = _run(['run', 'paca_mm', 'get_flops', config], mim_env)
    assert 'Use the script ' + osp.join(str(mim_env[2]), 'paca_mm', '.mim', 'tools',
                                        'get_flops.py') in out
    md = _tiny_cls_entry()['Metadata']  # what tools/get_flops.py measured for the metafile
    assert f'params: {md["Parameters"]:,} ' in out, out[-2000:]
    assert f'FLOPs (MACs): {md["FLOPs"]:,} ' in out, out[-2000:]
