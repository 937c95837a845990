"""No checkpoint loader of paca_mm unpickles arbitrary objects unless explicitly trusted.

Each payload below creates a marker file when it is unpickled in full (checked by
``test_payloads_are_live``). Every loading path must refuse it with ``CheckpointError`` (or
the tool's one-line error exit) naming the refused global and the opt-in, and the marker
must never appear: paca_mm's own loader, ``init_cfg=dict(type='Pretrained')`` of PaCaViT,
the converter, the visualisation tools, mmengine's ``CheckpointLoader`` / ``load_checkpoint``
(local and http) after ``import paca_mm``, mmseg's ``init_model`` in a fresh process, every
script of tools/ that loads a checkpoint (``--trust-checkpoint`` off by default) and the
toolboxes' own tools/test.py. Runner checkpoints (HistoryBuffers, numpy scalars), official
files as timm's CheckpointSaver and mmengine's Runner write them (``state_dict`` taken, not
the EMA) and the converter's output load without the opt-in;
``trust=True`` / ``--trust-checkpoint`` / ``PACA_MM_TRUST_CHECKPOINTS=1`` load a trusted
file holding another (benign) class.

Both loading mechanisms are tested where the installed torch has them: torch's weights-only
unpickler with the allow-list (torch >= 2.4) and paca_mm's restricted unpickler (torch < 2.4;
forced here by hiding ``torch.serialization.add_safe_globals``).
"""
import argparse
import fractions
import json
import os
import os.path as osp
import shlex
import subprocess
import sys

import numpy as np
import pytest
import torch

import paca_mm  # noqa: F401  (installs safe checkpoint loading)
from paca_mm.checkpoint import TRUST_ENV, CheckpointError, load_checkpoint_file
from paca_mm.models.backbones import PaCaViT

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = osp.join(ROOT, 'tests', 'data', 'tools_tiny_seg.py')
ARCH = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))
OPT_IN = [TRUST_ENV, '--trust-checkpoint', 'trust=True']


# ---------------------------------------------------------------------------- payloads
class _System:
    """os.system('touch MARKER')"""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, ('touch ' + shlex.quote(self.marker),)


class _Open(_System):
    """open(MARKER, 'w')"""

    def __reduce__(self):
        return open, (self.marker, 'w')


class _Eval(_System):
    """eval("open(MARKER, 'w')")"""

    def __reduce__(self):
        return eval, (f'open({self.marker!r}, "w")',)


class _NdarrayTofile:
    """Pickles as builtins.getattr(numpy.ndarray, 'tofile')."""

    def __reduce__(self):
        return getattr, (np.ndarray, 'tofile')

    def __call__(self, *args):  # pickle wants a callable; never called here
        raise AssertionError


class _ViaGetattr(_System):
    """getattr(numpy.ndarray, 'tofile')(array, MARKER): writes the marker."""

    def __reduce__(self):
        return _NdarrayTofile(), (np.zeros(1), self.marker)


class _EvilNamespace(argparse.Namespace):
    """A Namespace subclass whose __setstate__ writes the marker."""

    def __setstate__(self, state):
        open(state['marker'], 'w').close()


class _NamespaceSlotstate(_System):
    """argparse.Namespace() completed by BUILD (state, slotstate): setattr of a payload."""

    def __reduce__(self):
        return argparse.Namespace, (), (None, {'evil': _System(self.marker)})


def _sd():
    return {'w': torch.ones(2)}


SYSTEM = f'the global {os.system.__module__}.system'
OPEN = f'the global {open.__module__}.open'
# where the payload sits -> (checkpoint object, what the error names: one of these)
PAYLOADS = {
    'meta': (lambda m: dict(state_dict=_sd(), meta=dict(evil=_System(m))), [SYSTEM]),
    'state_dict': (lambda m: dict(state_dict=dict(_sd(), evil=_Open(m)), meta={}), [OPEN]),
    'top_level': (lambda m: _System(m), [SYSTEM]),
    'eval': (lambda m: dict(state_dict=_sd(), meta=dict(x=_Eval(m))),
             ['the global builtins.eval', 'the global eval,']),  # torch names builtins bare
    # torch's weights-only unpickler already refuses the object dtype
    'numpy_object_array': (lambda m: dict(state_dict=_sd(), meta=dict(
        arr=np.array([_Open(m)], dtype=object))), [OPEN, 'ObjectDType']),
    'getattr': (lambda m: dict(state_dict=_sd(), meta=dict(x=_ViaGetattr(m))),
                ["builtins.getattr(<class 'numpy.ndarray'>, 'tofile')"]),
    # argparse.Namespace (timm's args) is allowed as plain data only: a payload in its
    # __dict__, in a BUILD slotstate, or a subclass with __setstate__ is refused
    'namespace_attr': (lambda m: dict(state_dict=_sd(), args=argparse.Namespace(
        lr=0.1, evil=_System(m))), [SYSTEM]),
    'namespace_slotstate': (lambda m: dict(state_dict=_sd(), args=_NamespaceSlotstate(m)),
                            [SYSTEM]),
    'namespace_subclass': (lambda m: dict(state_dict=_sd(), args=_EvilNamespace(
        marker=str(m))), [f'the global {_EvilNamespace.__module__}._EvilNamespace']),
}


def _payload(tmp_path, kind):
    marker = tmp_path / f'marker_{kind}'
    path = tmp_path / f'payload_{kind}.pth'
    torch.save(PAYLOADS[kind][0](marker), str(path))
    return str(path), marker


def _check_refusal(message, kind):
    assert 'refusing to load checkpoint' in message, message
    assert any(name in message for name in PAYLOADS[kind][1]), message
    for opt_in in OPT_IN:
        assert opt_in in message, message


def _runner_checkpoint(path):
    """A Runner checkpoint as mmengine writes it (message hub HistoryBuffers, numpy scalar)."""
    from mmengine.logging import MessageHub
    hub = MessageHub.get_instance('paca_mm_test_checkpoint_safety')
    for i in range(3):
        hub.update_scalar('train/loss', 1.0 / (i + 1))
    hub.update_info('best_score', np.float64(0.5))
    torch.save(dict(meta=dict(message_hub=hub.state_dict(), seed=0, iter=3),
                    state_dict=_sd(), optimizer={'state': {}, 'param_groups': [
                        dict(lr=0.1, betas=(0.9, 0.999), params=[0])]}), str(path))
    return str(path)


def _check_runner_checkpoint(ckpt):
    hub = ckpt['meta']['message_hub']
    assert hub['log_scalars']['train/loss'].current() == pytest.approx(1 / 3)
    assert hub['log_scalars']['train/loss'].mean() == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert hub['runtime_info']['best_score'] == 0.5
    assert torch.equal(ckpt['state_dict']['w'], torch.ones(2))


def _benign(path, state_dict=None):
    """A trusted file holding a class outside the allow-list (fractions.Fraction)."""
    torch.save(dict(state_dict=_sd() if state_dict is None else state_dict,
                    meta=dict(lr=fractions.Fraction(1, 10))), str(path))
    return str(path)


@pytest.fixture(autouse=True)
def _no_trust_env(monkeypatch):
    monkeypatch.setenv(TRUST_ENV, '0')  # so that teardown also removes one a tool set
    monkeypatch.delenv(TRUST_ENV)


def _mechanisms():
    """The loading mechanisms this torch has: torch's weights-only unpickler with the
    allow-list (torch >= 2.4), and paca_mm's restricted unpickler (the one torch < 2.4 uses;
    on newer torch it is tested by hiding add_safe_globals). Neither is skipped: a mechanism
    this torch cannot run is simply not one of its cases."""
    from torch import _weights_only_unpickler
    out = []
    if hasattr(torch.serialization, 'add_safe_globals'):
        out.append('torch_weights_only')
    if hasattr(_weights_only_unpickler, '_get_allowed_globals'):
        out.append('restricted_unpickler')
    assert out, 'this torch offers neither loading mechanism paca_mm supports'
    return out


@pytest.fixture(params=_mechanisms())
def mechanism(request, monkeypatch):
    """torch's weights-only unpickler + allow-list, or paca_mm's restricted unpickler."""
    if request.param == 'restricted_unpickler':
        monkeypatch.delattr(torch.serialization, 'add_safe_globals', raising=False)
    return request.param


# ------------------------------------------------------------------------------ tests
@pytest.mark.parametrize('kind', sorted(PAYLOADS))
def test_payloads_are_live(tmp_path, kind):
    """Control: unpickled in full, each payload does create its marker."""
    path, marker = _payload(tmp_path, kind)
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize('kind', sorted(PAYLOADS))
def test_paca_mm_loaders_refuse_payloads(tmp_path, kind, mechanism, load_tool):
    path, marker = _payload(tmp_path, kind)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint_file(path)
    _check_refusal(str(e.value), kind)
    # PaCaViT init_cfg=dict(type='Pretrained') -> init_weights
    model = PaCaViT(arch=ARCH, init_cfg=dict(type='Pretrained', checkpoint=path))
    with pytest.raises(CheckpointError) as e:
        model.init_weights()
    _check_refusal(str(e.value), kind)
    # mmengine, as the toolboxes use it after `import paca_mm`
    from mmengine.runner import CheckpointLoader, load_checkpoint
    with pytest.raises(CheckpointError) as e:
        CheckpointLoader.load_checkpoint(path, map_location='cpu')
    _check_refusal(str(e.value), kind)
    with pytest.raises(CheckpointError):
        load_checkpoint(torch.nn.Linear(2, 2), path, map_location='cpu')
    # the converter CLI: one error line, nothing written
    dst = tmp_path / 'converted.pth'
    with pytest.raises(SystemExit) as e:
        load_tool('convert_official_checkpoint').main([path, str(dst)])
    assert str(e.value.code).startswith('error: ')
    _check_refusal(str(e.value.code), kind)
    assert not dst.exists()
    assert not marker.exists()


def test_http_scheme_refuses_payloads(tmp_path, monkeypatch, mechanism):
    """mmengine's http(s) loader (load_from / init_cfg with a URL) is replaced too."""
    import shutil

    import torch.hub
    from mmengine.runner import CheckpointLoader
    path, marker = _payload(tmp_path, 'meta')
    good = _runner_checkpoint(tmp_path / 'runner.pth')
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    monkeypatch.setattr(torch.hub, 'download_url_to_file',
                        lambda url, dst, *a, **k: shutil.copy(
                            path if 'payload' in url else good, dst))
    with pytest.raises(CheckpointError) as e:
        CheckpointLoader.load_checkpoint('https://example.invalid/payload.pth')
    _check_refusal(str(e.value), 'meta')
    assert 'https://example.invalid/payload.pth' in str(e.value)
    with pytest.raises(CheckpointError):
        load_checkpoint_file('https://example.invalid/payload.pth')
    _check_runner_checkpoint(CheckpointLoader.load_checkpoint('https://example.invalid/r.pth'))
    assert not marker.exists()


def test_good_checkpoints_load_without_opt_in(tmp_path, mechanism, load_tool):
    from mmengine.runner import CheckpointLoader
    runner = _runner_checkpoint(tmp_path / 'runner.pth')
    _check_runner_checkpoint(load_checkpoint_file(runner))
    _check_runner_checkpoint(CheckpointLoader.load_checkpoint(runner, map_location='cpu'))

    # official-style plain state_dict (backbone keys + classifier head)
    torch.manual_seed(0)
    ref = PaCaViT(arch=ARCH)
    src = tmp_path / 'IMNET_224_tiny.pth'
    torch.save(dict(ref.state_dict(), **{'head.weight': torch.randn(5, 64),
                                         'head.bias': torch.randn(5)}), str(src))
    model = PaCaViT(arch=ARCH, init_cfg=dict(type='Pretrained', checkpoint=str(src),
                                             strict=True))
    model.init_weights()
    for k, v in ref.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k

    # the converter's output loads too, through init_cfg and mmengine
    dst = tmp_path / 'backbone.pth'
    load_tool('convert_official_checkpoint').main([str(src), str(dst)])
    assert load_checkpoint_file(str(dst))['meta']['converted_from'] == src.name
    model = PaCaViT(arch=ARCH, init_cfg=dict(type='Pretrained', checkpoint=str(dst),
                                             strict=True))
    model.init_weights()
    for k, v in ref.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    assert set(CheckpointLoader.load_checkpoint(str(dst))['state_dict']) == \
        set(ref.state_dict())


def test_opt_in_argument_and_env_var(tmp_path, monkeypatch, mechanism, load_tool):
    from mmengine.runner import CheckpointLoader
    path = _benign(tmp_path / 'trusted.pth')
    for load in (load_checkpoint_file, CheckpointLoader.load_checkpoint):
        with pytest.raises(CheckpointError) as e:
            load(path)
        assert 'fractions.Fraction' in str(e.value) and TRUST_ENV in str(e.value)
    # the argument
    assert load_checkpoint_file(path, trust=True)['meta']['lr'] == fractions.Fraction(1, 10)
    dst = tmp_path / 'converted.pth'
    tool = load_tool('convert_official_checkpoint')
    with pytest.raises(SystemExit, match='fractions.Fraction'):
        tool.main([path, str(dst)])
    tool.main([path, str(dst), '--trust-checkpoint'])
    assert torch.equal(load_checkpoint_file(str(dst))['state_dict']['w'], torch.ones(2))
    # never automatic: the file is still refused after a trusted load
    with pytest.raises(CheckpointError):
        load_checkpoint_file(path)
    # the environment variable: every loader, also mmengine's (the toolboxes' scripts)
    monkeypatch.setenv(TRUST_ENV, '1')
    assert load_checkpoint_file(path)['meta']['lr'] == fractions.Fraction(1, 10)
    assert CheckpointLoader.load_checkpoint(path)['meta']['lr'] == fractions.Fraction(1, 10)
    monkeypatch.setenv(TRUST_ENV, '0')
    with pytest.raises(CheckpointError):
        CheckpointLoader.load_checkpoint(path)
    from paca_mm.checkpoint import trust_checkpoints  # the API call behind --trust-checkpoint
    trust_checkpoints()
    assert load_checkpoint_file(path)['meta']['lr'] == fractions.Fraction(1, 10)
    monkeypatch.setenv(TRUST_ENV, '0')
    # init_cfg=dict(type='Pretrained', trust=True): the argument for the backbone's loader
    sd_path = _benign(tmp_path / 'trusted_backbone.pth', PaCaViT(arch=ARCH).state_dict())
    with pytest.raises(CheckpointError, match='fractions.Fraction'):
        PaCaViT(arch=ARCH, init_cfg=dict(type='Pretrained', checkpoint=sd_path)).init_weights()
    model = PaCaViT(arch=ARCH, init_cfg=dict(type='Pretrained', checkpoint=sd_path,
                                             trust=True))
    model.init_weights()
    ref = torch.load(sd_path, weights_only=False)['state_dict']
    assert all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())


def _seg_model_checkpoint(tmp_path, benign=False):
    from paca_mm.visualization.inference import build_model
    torch.manual_seed(0)
    model = build_model(CONFIG, None)
    path = tmp_path / ('seg_trusted.pth' if benign else 'seg.pth')
    if benign:
        return _benign(path, model.state_dict()), model
    torch.save(dict(state_dict=model.state_dict(), meta={}), str(path))
    return str(path), model


def test_visualization_loaders(tmp_path, mechanism, load_tool):
    """paca_mm.visualization.inference (tools/visualize_clusters.py, tools/image_demo.py)."""
    pytest.importorskip('mmseg')
    cv2 = pytest.importorskip('cv2')
    from paca_mm.visualization.image_demo import run_image_demo
    from paca_mm.visualization.inference import build_model
    image = str(tmp_path / 'img.png')
    cv2.imwrite(image, np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    for kind in ('meta', 'getattr'):
        path, marker = _payload(tmp_path, kind)
        with pytest.raises(CheckpointError) as e:
            build_model(CONFIG, path)
        _check_refusal(str(e.value), kind)
        with pytest.raises(CheckpointError):
            load_tool('visualize_clusters').main([CONFIG, path, image, '--out',
                                              str(tmp_path / 'vis')])
        with pytest.raises(CheckpointError):
            load_tool('image_demo').main([CONFIG, path, image, '--out', str(tmp_path / 'o.png')])
        with pytest.raises(CheckpointError):  # the API behind it: trust is off by default
            run_image_demo(CONFIG, path, image, str(tmp_path / 'o.png'))
        assert not marker.exists()
    trusted, ref = _seg_model_checkpoint(tmp_path, benign=True)
    with pytest.raises(CheckpointError, match='fractions.Fraction'):
        build_model(CONFIG, trusted)
    torch.manual_seed(1)  # another random init: the weights must come from the file
    model = build_model(CONFIG, trusted, trust=True)
    for k, v in ref.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    out = load_tool('image_demo').main([CONFIG, trusted, image, '--out', str(tmp_path / 'o.png'),
                                    '--trust-checkpoint'])
    assert out['task'] == 'seg' and osp.isfile(out['out_file'])


# ------------------------------------------------------------- fresh processes (slow)
def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='')
    env.pop(TRUST_ENV, None)
    env['PYTHONPATH'] = os.pathsep.join(
        [ROOT] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    env.update(extra)
    return env


_TOOLBOX_SCRIPT = r'''
import json, sys
from mmseg.apis import init_model  # the config's custom_imports imports paca_mm
config, paths = sys.argv[1], json.loads(sys.argv[2])
out = {}
try:
    init_model(config, paths.pop('init_model_payload'), device='cpu')
    out['init_model_payload'] = 'loaded'
except Exception as e:
    out['init_model_payload'] = f'{type(e).__name__}: {e}'
model = init_model(config, paths.pop('init_model_runner'), device='cpu')
out['init_model_runner'] = 'loaded'
import torch  # a plain torch.load as toolbox code does (torch >= 2.6: weights-only default)
ckpt = torch.load(paths.pop('torch_load_runner'), map_location='cpu')
out['torch_load_runner'] = ckpt['meta']['message_hub']['log_scalars']['train/loss'].current()
from mmengine.runner import CheckpointLoader
for name, path in paths.items():
    try:
        ckpt = CheckpointLoader.load_checkpoint(path, map_location='cpu')
        out[name] = 'loaded: ' + repr(ckpt['meta']['message_hub']['log_scalars']
                                      ['train/loss'].current())
    except Exception as e:
        out[name] = f'{type(e).__name__}: {e}'
print('RESULT ' + json.dumps(out))
'''


@pytest.mark.slow
def test_toolbox_scripts_after_import_paca_mm(tmp_path):
    """A fresh process that only gets paca_mm through the config's custom_imports (as
    mmseg's own tools/test.py and init_model do) loads checkpoints safely."""
    pytest.importorskip('mmseg')
    paths = {kind: _payload(tmp_path, kind)[0] for kind in PAYLOADS}
    paths['init_model_payload'] = paths['meta']
    paths['runner'] = paths['init_model_runner'] = paths['torch_load_runner'] = \
        _runner_checkpoint(tmp_path / 'r.pth')
    proc = subprocess.run([sys.executable, '-c', _TOOLBOX_SCRIPT, CONFIG, json.dumps(paths)],
                          cwd=str(tmp_path), env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.split('RESULT ', 1)[1])
    for kind in list(PAYLOADS) + ['init_model_payload']:
        assert out[kind].startswith('CheckpointError: '), (kind, out[kind])
        _check_refusal(out[kind], 'meta' if kind == 'init_model_payload' else kind)
    assert out['runner'] == 'loaded: ' + repr(1 / 3)
    assert out['init_model_runner'] == 'loaded'
    assert out['torch_load_runner'] == pytest.approx(1 / 3)
    assert not [f for f in os.listdir(str(tmp_path)) if f.startswith('marker')]


@pytest.fixture(scope='module')
def tiny_seg_data(tmp_path_factory):
    from demo.datasets.synthetic_seg import generate_synthetic_seg
    root = tmp_path_factory.mktemp('safety_seg_data')
    return generate_synthetic_seg(str(root), num_train=2, num_val=1, size=(32, 32), seed=0)


def _run_tool(tool, args, data_root, cwd):
    cmd = [sys.executable, osp.join(ROOT, 'tools', f'{tool}.py'), CONFIG, *args,
           '--work-dir', str(cwd / 'work'), '--cfg-options'] + \
        [f'{split}_dataloader.dataset.data_root={data_root}'
         for split in ('train', 'val', 'test')]
    proc = subprocess.run(cmd, cwd=str(cwd), env=_env(), capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout + proc.stderr, proc.stderr


@pytest.mark.slow
def test_tools_test_trust_checkpoint(tmp_path, tiny_seg_data):
    trusted, _ = _seg_model_checkpoint(tmp_path, benign=True)
    rc, out, err = _run_tool('test', [trusted], tiny_seg_data, tmp_path)
    assert rc != 0 and 'fractions.Fraction' in err, out[-3000:]
    rc, out, _ = _run_tool('test', [trusted, '--trust-checkpoint'], tiny_seg_data, tmp_path)
    assert rc == 0, out[-3000:]
    assert 'Load checkpoint from' in out and 'mIoU' in out


def test_getattr_stand_in_allows_public_history_buffer_methods_only():
    """The unpickler's ``builtins.getattr`` resolves HistoryBuffer's public methods and
    nothing else: not another object's attribute of the same name, not a private one."""
    import pickle

    from mmengine.logging import HistoryBuffer

    from paca_mm.checkpoint.loading import _history_buffer_getattr
    assert _history_buffer_getattr(HistoryBuffer, 'mean') is HistoryBuffer.__dict__['mean']
    for obj, name in [(dict, 'update'), (np.ndarray, 'mean'), (HistoryBuffer, '__init__'),
                      (HistoryBuffer, 'no_such_method'), (HistoryBuffer, 1)]:
        with pytest.raises(pickle.UnpicklingError, match='is not allowed in a checkpoint'):
            _history_buffer_getattr(obj, name)


def test_refusal_description():
    """What a refused load reports: the refused global, or for a file that refused
    nothing (corrupt), the first line of torch's message, at most 300 characters."""
    from paca_mm.checkpoint.loading import _refused
    assert _refused('Weights only load failed ... GLOBAL os.system was not an allowed '
                    'global by default') == ('the global os.system', True)
    assert _refused('Weights only load failed.\nWeightsUnpickler error: Unsupported '
                    'operand 149\nCheck the docs') == ('Unsupported operand 149', False)
    assert _refused('invalid load key, x.\nmore') == ('invalid load key, x.', False)
    assert _refused('') == ('?', False)
    text, refused = _refused('x' * 400)
    assert text == 'x' * 300 and not refused


def test_trusted_load_warns(tmp_path, monkeypatch):
    """Loading with the opt-in says so, as a warning."""
    import logging

    from paca_mm.checkpoint import loading
    path, marker = _payload(tmp_path, 'meta')
    logged = []
    monkeypatch.setattr(loading, 'print_log',
                        lambda msg, logger=None, level=logging.INFO: logged.append((msg, level)))
    loading.safe_torch_load(str(path), trust=True)
    assert marker.exists()  # the payload ran: that is what trusting means
    assert [lv for msg, lv in logged if 'trusted checkpoint' in msg] == [logging.WARNING]


@pytest.mark.parametrize('rank', [0, 1])
def test_download_in_a_distributed_run(tmp_path, monkeypatch, rank):
    """http(s) checkpoints: rank 0 downloads before the barrier, the other ranks after it
    (only if the file is still missing); a cached file is not downloaded again."""
    import mmengine.dist
    import torch.distributed
    import torch.hub

    from paca_mm.checkpoint.loading import _download
    events = []

    def download(url, dst, progress=True):
        events.append('download')
        with open(dst, 'wb'):
            pass

    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(tmp_path / 'hub'))
    monkeypatch.setattr(mmengine.dist, 'get_dist_info', lambda: (rank, 2))
    monkeypatch.setattr(torch.distributed, 'barrier', lambda: events.append('barrier'))
    monkeypatch.setattr(torch.hub, 'download_url_to_file', download)
    cached = str(tmp_path / 'hub' / 'checkpoints' / 'w.pth')
    assert _download('https://example.invalid/w.pth') == cached
    assert events == (['download', 'barrier'] if rank == 0 else ['barrier', 'download'])
    del events[:]
    _download('https://example.invalid/other.pth')  # the folder exists already
    _download('https://example.invalid/w.pth')  # cached
    assert events.count('download') == 1 and events.count('barrier') == 2


def test_load_backbone_checkpoint_is_safe_by_default(tmp_path):
    """The backbone loader, called without ``trust``, refuses a payload."""
    from paca_mm.checkpoint import load_backbone_checkpoint
    path, marker = _payload(tmp_path, 'meta')
    with pytest.raises(CheckpointError):
        load_backbone_checkpoint(PaCaViT(arch='tiny'), str(path))
    assert not marker.exists()


# ------------------------------------------------- every tool: no trust unless asked
def _image(tmp_path):
    cv2 = pytest.importorskip('cv2')
    image = str(tmp_path / 'img.png')
    cv2.imwrite(image, np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    return image


def _data_opts(data_root):
    return ['--cfg-options'] + [f'{split}_dataloader.dataset.data_root={data_root}'
                                for split in ('train', 'val', 'test')]


# each tool that loads a checkpoint -> its arguments (CKPT: the file, IMG: an image, OUT: an
# output it must not write, DATA: --cfg-options pointing the dataloaders at tiny data)
TOOL_ARGS = {
    'train': [CONFIG, '--resume', 'CKPT', '--work-dir', 'OUT', 'DATA'],
    'train_load_from': [CONFIG, '--work-dir', 'OUT', 'DATA', 'load_from=CKPT'],
    'test': [CONFIG, 'CKPT', '--work-dir', 'OUT', 'DATA'],
    'convert_official_checkpoint': ['CKPT', 'OUT'],
    'visualize_clusters': [CONFIG, 'CKPT', 'IMG', '--out', 'OUT'],
    'image_demo': [CONFIG, 'CKPT', 'IMG', '--out', 'OUT'],
    'deployment/pytorch2onnx': [CONFIG, 'CKPT', '--out', 'OUT', '--shape', '32', '32'],
}


def _tool_argv(tool, tmp_path, ckpt, data_root=None):
    fill = dict(CKPT=[ckpt], OUT=[str(tmp_path / 'out')],
                IMG=[_image(tmp_path)] if 'IMG' in TOOL_ARGS[tool] else [],
                DATA=_data_opts(data_root) if data_root else [])
    argv = [a for arg in TOOL_ARGS[tool] for a in fill.get(arg, [arg])]
    return [a.replace('CKPT', ckpt) if a.endswith('=CKPT') else a for a in argv]


@pytest.mark.parametrize('tool', sorted(TOOL_ARGS))
def test_trust_flag_is_off_by_default(tool, tmp_path, load_tool, monkeypatch):
    """Every tool that loads a checkpoint has ``--trust-checkpoint``, off unless given."""
    monkeypatch.setenv('LOCAL_RANK', '0')  # train/test parse_args export it
    parse = load_tool(tool.replace('_load_from', '')).parse_args
    argv = _tool_argv(tool, tmp_path, 'x.pth', 'data')
    assert parse(argv).trust_checkpoint is False
    assert parse(argv + ['--trust-checkpoint']).trust_checkpoint is True
    assert TRUST_ENV not in os.environ


@pytest.mark.parametrize('tool', sorted(TOOL_ARGS))
def test_every_tool_refuses_payloads_by_default(tool, tmp_path, monkeypatch, tiny_seg_data):
    """Each tool, run as a script (in-process: ``runpy``, ``__name__ == '__main__'``)
    without the opt-in, stops on a payload checkpoint with one ``error: refusing ...`` line
    that names the refused global and the opt-in, before writing any output; the payload
    never runs. (The toolboxes' own scripts: test_toolbox_own_scripts_refuse_payloads.)"""
    import runpy
    pytest.importorskip('mmseg')
    monkeypatch.setenv('LOCAL_RANK', '0')
    monkeypatch.chdir(tmp_path)
    path, marker = _payload(tmp_path, 'meta')
    script = osp.join(ROOT, 'tools', tool.replace('_load_from', '') + '.py')
    monkeypatch.setattr(sys, 'argv', [script] + _tool_argv(tool, tmp_path, path, tiny_seg_data))
    with pytest.raises(SystemExit) as e:
        runpy.run_path(script, run_name='__main__')
    message = str(e.value.code)
    assert message.startswith('error: refusing to load checkpoint'), message
    _check_refusal(message, 'meta')
    assert not marker.exists()
    out = tmp_path / 'out'
    assert not out.exists() or not [p for p in out.rglob('*') if p.suffix in (
        '.pth', '.onnx', '.png', '.jpg')], sorted(out.rglob('*'))


def test_get_flops_never_loads_init_cfg_checkpoints(tmp_path, load_tool, capsys):
    """tools/get_flops.py counts a config whose backbone init_cfg names a payload without
    loading it (the counts do not depend on weights); loading nothing, it has no
    --trust-checkpoint."""
    pytest.importorskip('mmseg')
    with pytest.raises(SystemExit):
        load_tool('get_flops').parse_args([CONFIG, '--trust-checkpoint'])
    path, marker = _payload(tmp_path, 'meta')
    load_tool('get_flops').main([CONFIG, '--shape', '32', '--cfg-options',
                                 'model.backbone.init_cfg.type=Pretrained',
                                 f'model.backbone.init_cfg.checkpoint={path}'])
    assert 'params: ' in capsys.readouterr().out
    assert not marker.exists()


def _toolbox_script(package, name):
    """``<package>/.mim/tools/<name>``: the script an installed toolbox wheel ships."""
    import importlib
    path = osp.join(osp.dirname(importlib.import_module(package).__file__), '.mim', 'tools',
                    name)
    assert osp.isfile(path), path
    return path


DET_CFG = osp.join(ROOT, 'demo', 'configs', 'mask_rcnn_tiny_synthetic_coco.py')
CLS_CFG = osp.join(ROOT, 'demo', 'configs', 'paca_tiny_synthetic_cls.py')


def _toolbox_run(toolbox, tmp_path, ckpt, tiny_seg_data):
    """(script, argv) of a toolbox's own test.py on a config that brings paca_mm through
    custom_imports only."""
    if toolbox == 'mmdet':
        from demo.datasets.synthetic_coco import generate_synthetic_coco
        data = generate_synthetic_coco(str(tmp_path / 'det'), num_train=1, num_val=1,
                                       image_size=(48, 64), max_objects=1,
                                       object_size=(16, 24), seed=0)
        root = data['data_root'].rstrip('/') + '/'
        return 'test.py', [DET_CFG, ckpt, '--cfg-options',
                           f'test_dataloader.dataset.data_root={root}',
                           f'test_evaluator.ann_file={root}{data["val_ann"]}']
    if toolbox == 'mmpretrain':
        return 'test.py', [CLS_CFG, ckpt, '--cfg-options'] + [
            f'test_dataloader.dataset.{k}' for k in (
                f'data_root={tmp_path / "cls"}', 'train_per_class=1', 'val_per_class=1',
                'img_size=32')]
    return 'test.py', [CONFIG, ckpt] + _data_opts(tiny_seg_data)


@pytest.mark.slow
@pytest.mark.parametrize('toolbox', ['mmdet', 'mmpretrain', 'mmseg'])
def test_toolbox_own_scripts_refuse_payloads(toolbox, tmp_path, tiny_seg_data):
    """The tools/test.py that each toolbox ships, in a fresh process where paca_mm comes
    only from the config's custom_imports, refuses a payload checkpoint with paca_mm's
    refusal (not just torch's weights-only error), before writing anything."""
    pytest.importorskip(toolbox)
    path, marker = _payload(tmp_path, 'namespace_attr')
    script, argv = _toolbox_run(toolbox, tmp_path, path, tiny_seg_data)
    cmd = [sys.executable, _toolbox_script(toolbox, script)] + argv + [
        'work_dir=' + str(tmp_path / 'work')]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert 'CheckpointError: refusing to load checkpoint' in proc.stderr, proc.stderr[-3000:]
    _check_refusal(proc.stderr, 'namespace_attr')
    assert not marker.exists()
    assert not list((tmp_path / 'work').rglob('*.pth'))


# ------------------------------------------------ the official files as they are written
# timm's train.py arguments as its CheckpointSaver pickles them (an argparse.Namespace of
# plain values)
TIMM_ARGS = dict(model='pacavit_tiny_p2cconv_100_0', data_dir='/data/imagenet', dataset='',
                 num_classes=5, img_size=None, input_size=(3, 224, 224), crop_pct=None,
                 mean=None, std=None, interpolation='', batch_size=128, epochs=300,
                 opt='adamw', opt_eps=1e-8, opt_betas=None, momentum=0.9, weight_decay=0.05,
                 clip_grad=None, sched='cosine', lr=1e-3, lr_noise=None, warmup_lr=1e-6,
                 min_lr=1e-5, scale=[0.08, 1.0], ratio=[3. / 4., 4. / 3.], hflip=0.5,
                 aa='rand-m9-mstd0.5-inc1', reprob=0.25, remode='pixel', mixup=0.8,
                 cutmix=1.0, cutmix_minmax=None, smoothing=0.1, drop_path=0.1,
                 model_ema=True, model_ema_decay=0.99996, model_ema_force_cpu=False,
                 amp=True, apex_amp=False, native_amp=True, channels_last=False,
                 pin_mem=True, prefetcher=True, distributed=True, world_size=8, rank=0,
                 local_rank=0, device='cuda:0', seed=42, output='', experiment='',
                 eval_metric='top1', resume='', no_resume_opt=False, initial_checkpoint='',
                 log_wandb=False)


def _official_weights():
    """(backbone state_dict, classifier head of an ImageNet model with 5 classes)."""
    torch.manual_seed(0)
    backbone = PaCaViT(arch=ARCH).state_dict()
    return backbone, {'head.weight': torch.randn(5, 64), 'head.bias': torch.randn(5)}


def _adamw_state():
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.999))
    net(torch.ones(1, 4)).sum().backward()
    opt.step()
    return net, opt


def _timm_checkpoint(path):
    """What timm's CheckpointSaver writes (timm/utils/checkpoint_saver.py ``_save``): the
    weights, their EMA (--model-ema), optimizer, AMP scaler, epoch, arch, version, the
    metric, and the args Namespace."""
    backbone, head = _official_weights()
    state = dict(backbone, **head)
    torch.save(dict(epoch=299, arch=TIMM_ARGS['model'], state_dict=state,
                    optimizer=_adamw_state()[1].state_dict(), version=2,
                    args=argparse.Namespace(**TIMM_ARGS),
                    amp_scaler={'scale': 32768.0, 'growth_factor': 2.0, 'backoff_factor': 0.5,
                                'growth_interval': 2000, '_growth_tracker': 154},
                    state_dict_ema={k: v + 1 for k, v in state.items()}, metric=82.91),
               str(path))
    return str(path), state


def _mmengine_checkpoint(path):
    """What mmengine's ``Runner.save_checkpoint`` writes (0.7 to 0.10 alike): ``meta``
    (epoch, iter, cfg as text, seed, experiment_name, time, mmengine_version, dataset_meta),
    ``state_dict``, ``message_hub`` (``MessageHub.state_dict()``: HistoryBuffers of the
    logged scalars, the runtime info), ``optimizer`` and ``param_schedulers``."""
    from mmengine.config import Config
    from mmengine.logging import MessageHub
    from mmengine.optim import LinearLR, OptimWrapper, PolyLR
    net, opt = _adamw_state()
    wrapper = OptimWrapper(opt)
    schedulers = [LinearLR(wrapper, start_factor=1e-6, by_epoch=False, begin=0, end=1500),
                  PolyLR(wrapper, eta_min=0.0, power=1.0, by_epoch=False, begin=1500,
                         end=160000)]
    for s in schedulers:
        s.step()
    dataset_meta = dict(classes=('wall', 'building', 'sky'),
                        palette=[[120, 120, 120], [180, 120, 120], [6, 230, 230]],
                        label_map=None, reduce_zero_label=True)
    hub = MessageHub.get_instance('paca_mm_test_official_mmengine')
    for i in range(3):
        hub.update_scalar('train/loss', 1.0 / (i + 1))
        hub.update_scalar('train/lr', 6e-5)
    hub.update_info_dict(dict(loop_stage='train', epoch=0, iter=160000, max_epochs=1,
                              max_iters=160000, dataset_meta=dataset_meta, eta=12.5,
                              last_ckpt='work_dirs/x/iter_160000.pth',
                              keep_ckpt_ids=[144000, 160000], best_score=np.float64(46.32),
                              best_ckpt='work_dirs/x/best_mIoU_iter_160000.pth'))
    backbone, _ = _official_weights()
    state = dict({'backbone.' + k: v for k, v in backbone.items()},
                 **{'decode_head.conv_seg.weight': torch.randn(3, 8, 1, 1)})
    meta = dict(epoch=0, iter=160000, cfg=Config.fromfile(CONFIG).pretty_text, seed=1234,
                experiment_name='upernet_pacavit_tiny_20230612_101010',
                time='20230612_101010', mmengine_version='0.7.4',
                dataset_meta=dataset_meta)
    torch.save(dict(meta=meta, state_dict=state, message_hub=hub.state_dict(),
                    optimizer=dict(wrapper.state_dict(), loss_scaler={'scale': 512.0}),
                    param_schedulers=[s.state_dict() for s in schedulers]), str(path))
    return str(path), backbone


@pytest.mark.parametrize('layout', ['timm', 'mmengine'])
def test_official_files_load_without_opt_in(tmp_path, layout, mechanism, load_tool):
    """An ImageNet release as timm's CheckpointSaver writes it and a COCO/ADE release as
    mmengine's Runner writes it load, without the opt-in, through the loader (metadata
    intact), init_cfg=dict(type='Pretrained') and the converter, and the weights taken
    are ``state_dict``'s (not timm's EMA)."""
    from mmengine.runner import CheckpointLoader
    backbone, _ = _official_weights()
    path, _ = (_timm_checkpoint if layout == 'timm' else _mmengine_checkpoint)(
        tmp_path / f'{layout}.pth')
    for ckpt in (load_checkpoint_file(path), CheckpointLoader.load_checkpoint(path)):
        if layout == 'timm':
            assert type(ckpt['args']) is argparse.Namespace
            assert vars(ckpt['args']) == TIMM_ARGS
            assert (ckpt['epoch'], ckpt['metric'], ckpt['version']) == (299, 82.91, 2)
        else:
            hub = ckpt['message_hub']
            assert hub['log_scalars']['train/loss'].current() == pytest.approx(1 / 3)
            assert hub['runtime_info']['best_score'] == np.float64(46.32)
            assert hub['runtime_info']['dataset_meta']['classes'] == ('wall', 'building',
                                                                      'sky')
            assert ckpt['meta']['mmengine_version'] == '0.7.4'
            assert [s['end'] for s in ckpt['param_schedulers']] == [1500, 160000]
        assert ckpt['optimizer']['param_groups'][0]['betas'] == (0.9, 0.999)

    def check(model_sd):
        assert model_sd.keys() == backbone.keys()
        for k, v in backbone.items():
            assert torch.equal(model_sd[k], v), k  # state_dict, not state_dict_ema

    model = PaCaViT(arch=ARCH, init_cfg=dict(type='Pretrained', checkpoint=path, strict=True))
    model.init_weights()
    check(model.state_dict())
    dst = str(tmp_path / 'converted.pth')
    load_tool('convert_official_checkpoint').main([path, dst])
    check(load_checkpoint_file(dst)['state_dict'])


def test_timm_ema_weights_only_when_asked(tmp_path, load_tool):
    """``--ema`` (``state_dict_of(ckpt, ema=True)``) takes a timm file's state_dict_ema,
    also for the classifier head; a file without one is an error, not a silent fallback."""
    from paca_mm.checkpoint import state_dict_of
    path, state = _timm_checkpoint(tmp_path / 'timm.pth')
    tool = load_tool('convert_official_checkpoint')
    for ema in (False, True):
        dst = str(tmp_path / f'cls_{ema}.pth')
        tool.main([path, dst, '--to', 'classifier'] + (['--ema'] if ema else []))
        got = load_checkpoint_file(dst)['state_dict']
        assert len(got) == len(state)
        for k, v in state.items():
            key = 'head.fc.' + k[5:] if k.startswith('head.') else 'backbone.' + k
            assert torch.equal(got[key], v + 1 if ema else v), (ema, k)
    assert torch.equal(state_dict_of(load_checkpoint_file(path), ema=True)['head.bias'],
                       state['head.bias'] + 1)
    mm_path, _ = _mmengine_checkpoint(tmp_path / 'mmengine.pth')
    with pytest.raises(SystemExit, match='no state_dict_ema'):
        tool.main([mm_path, str(tmp_path / 'x.pth'), '--ema'])
    with pytest.raises(CheckpointError, match='no state_dict_ema'):
        state_dict_of(load_checkpoint_file(mm_path), ema=True)
