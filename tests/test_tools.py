"""tools/train.py, tools/test.py, tools/dist_train.sh and their helpers (paca_mm.engine).

Fast tests check the config/CLI handling and the CPU/torch>=2.6 helpers in-process; the
slow ones run the real tools as subprocesses on tests/data/tools_tiny_seg.py (a tiny
PaCaViT + FCN head on 32x32 synthetic images, 6 iterations, checkpoint every 3).
"""
import os
import os.path as osp
import pickle
import re
import socket
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config

import paca_mm  # noqa: F401
from paca_mm.checkpoint import allow_mmengine_checkpoint_globals, mmengine_checkpoint_globals
from paca_mm.engine.args import apply_test_args, apply_train_args
from paca_mm.engine.cpu import (CPUAmpOptimWrapper, CPUDistributedDataParallel,
                                adapt_cfg_to_device)
from paca_mm.registry import get_scope, register_toolbox_modules

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DATA = osp.join(ROOT, 'tests', 'data')
CONFIG = osp.join(DATA, 'tools_tiny_seg.py')
DIST_CONFIG = osp.join(DATA, 'tools_tiny_seg_dist.py')


def _cfg(**updates):
    cfg = Config.fromfile(CONFIG)
    cfg.merge_from_dict(updates)
    return cfg


def _norm_types(node, found):
    if isinstance(node, dict):
        if 'norm_cfg' in node:
            found.append(node['norm_cfg']['type'])
        for v in node.values():
            _norm_types(v, found)
    return found


# ----------------------------------------------------------------------------- fast
def test_scope_and_registration():
    from mmengine.registry import DefaultScope
    before = DefaultScope.get_current_instance()
    assert register_toolbox_modules(_cfg()) == 'mmseg'
    # registration only, as the toolboxes' tools do: the current default scope is untouched
    assert DefaultScope.get_current_instance() is before
    from mmseg.registry import MODELS
    assert MODELS.get('FCNHead') is not None and MODELS.get('PaCaViT') is not None
    cfg = _cfg()
    cfg.pop('default_scope')
    with pytest.raises(ValueError, match='default_scope'):
        get_scope(cfg)
    with pytest.raises(ValueError, match='one of'):
        get_scope(Config(dict(default_scope='mmocr')))


def test_adapt_cfg_to_cpu():
    cfg = _cfg(launcher='pytorch', sync_bn='torch',
               optim_wrapper=dict(type='AmpOptimWrapper', loss_scale='dynamic',
                                  dtype='float16'))
    assert _norm_types(cfg.model, []) == ['SyncBN']
    assert adapt_cfg_to_device(cfg.copy(), cuda=True) == []  # GPU: untouched
    notes = adapt_cfg_to_device(cfg, cuda=False)
    assert _norm_types(cfg.model, []) == ['BN']
    assert 'sync_bn' not in cfg
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    # the Runner's own default wrapper arguments (mmengine: broadcast_buffers=False)
    assert cfg.model_wrapper_cfg == dict(type='CPUDistributedDataParallel',
                                         broadcast_buffers=False, find_unused_parameters=False)
    cfg2 = _cfg(launcher='pytorch', find_unused_parameters=True)
    adapt_cfg_to_device(cfg2, cuda=False)
    assert cfg2.model_wrapper_cfg.find_unused_parameters is True
    assert cfg.optim_wrapper.type == 'CPUAmpOptimWrapper'
    assert cfg.optim_wrapper.dtype == 'bfloat16'
    text = '\n'.join(notes)
    assert 'SyncBN reverted to BN' in text and "'gloo'" in text and 'bfloat16' in text
    # not distributed: no wrapper, backend untouched
    cfg = _cfg()
    adapt_cfg_to_device(cfg, cuda=False)
    assert 'model_wrapper_cfg' not in cfg and cfg.env_cfg.dist_cfg.backend == 'nccl'
    # the config's own wrapper: MMDistributedDataParallel (named or by default) becomes the
    # CPU one with its arguments, another wrapper is left alone; no optim_wrapper (testing)
    for wrapper, expected in ((dict(type='MMDistributedDataParallel', find_unused_parameters=True),
                               'CPUDistributedDataParallel'),
                              (dict(find_unused_parameters=True), 'CPUDistributedDataParallel'),
                              (dict(type='MMFullyShardedDataParallel'),
                               'MMFullyShardedDataParallel')):
        cfg = _cfg(launcher='pytorch', model_wrapper_cfg=wrapper)
        cfg.pop('optim_wrapper')
        adapt_cfg_to_device(cfg, cuda=False)
        assert cfg.model_wrapper_cfg.get('type') == expected, wrapper
        assert cfg.model_wrapper_cfg.get('find_unused_parameters') == wrapper.get(
            'find_unused_parameters')


def test_train_args():
    cfg = _cfg()
    apply_train_args(cfg, amp=True, resume='auto')
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.loss_scale == 'dynamic'
    assert cfg.resume is True and cfg.load_from is None
    cfg = _cfg()
    apply_train_args(cfg, resume='some/iter_3.pth')
    assert cfg.resume is True and cfg.load_from == 'some/iter_3.pth'
    with pytest.raises(ValueError, match='auto_scale_lr'):
        apply_train_args(_cfg(), auto_scale_lr=True)
    cfg = _cfg(auto_scale_lr=dict(enable=False, base_batch_size=16))
    apply_train_args(cfg, auto_scale_lr=True)
    assert cfg.auto_scale_lr.enable is True
    cfg = _cfg()
    cfg.optim_wrapper.type = 'ApexOptimWrapper'
    with pytest.raises(ValueError, match='OptimWrapper'):
        apply_train_args(cfg, amp=True)


def test_test_args_follow_each_toolbox():
    # mmseg: --out is a directory for IoUMetric, --show-dir goes to the visualizer
    cfg = _cfg()
    apply_test_args(cfg, 'mmseg', 'ckpt.pth', out='preds', show_dir='vis')
    assert cfg.load_from == 'ckpt.pth'
    assert cfg.test_evaluator.output_dir == 'preds' and cfg.test_evaluator.keep_results
    assert cfg.default_hooks.visualization.draw is True
    assert cfg.visualizer.save_dir == 'vis'
    with pytest.raises(ValueError, match='tta'):
        apply_test_args(_cfg(), 'mmseg', 'ckpt.pth', tta=True)
    cfg = _cfg(tta_model=dict(type='SegTTAModel'), tta_pipeline=[dict(type='LoadImageFromFile')])
    apply_test_args(cfg, 'mmseg', 'ckpt.pth', tta=True)
    assert cfg.model.type == 'SegTTAModel' and cfg.model.module.type == 'EncoderDecoder'
    assert cfg.test_dataloader.dataset.pipeline == [dict(type='LoadImageFromFile')]

    # mmdet: --out is a pickle (DumpDetResults), --show-dir is the hook's test_out_dir,
    # --tta falls back to DetTTAModel (no mask head) with a flip pipeline
    cfg = _cfg(default_scope='mmdet')
    apply_test_args(cfg, 'mmdet', 'ckpt.pth', out='r.pkl', show_dir='vis', tta=True)
    assert cfg.test_evaluator[-1] == dict(type='mmdet.DumpDetResults', out_file_path='r.pkl')
    assert cfg.default_hooks.visualization.test_out_dir == 'vis'
    assert cfg.model.type == 'DetTTAModel'
    assert cfg.test_dataloader.dataset.pipeline[-1]['type'] == 'TestTimeAug'
    with pytest.raises(ValueError, match='pkl'):
        apply_test_args(_cfg(), 'mmdet', 'ckpt.pth', out='r.json')

    # mmpretrain: --out pickle (DumpResults), VisualizationHook enable/out_dir
    cfg = _cfg(default_scope='mmpretrain')
    apply_test_args(cfg, 'mmpretrain', 'ckpt.pth', out='r.pkl', show_dir='vis', tta=True)
    assert cfg.test_evaluator[-1]['type'] == 'DumpResults'
    assert cfg.default_hooks.visualization.enable is True
    assert cfg.default_hooks.visualization.out_dir == 'vis'
    assert cfg.model.type == 'AverageClsScoreTTA'


def test_show_and_interval_reach_the_visualization_hook():
    """--show turns on the hook's window with --wait-time; the drawing interval is every
    batch for mmpretrain (as its test.py) and the hook's own otherwise, unless given."""
    from paca_mm.engine.args import trigger_visualization
    for scope in ('mmseg', 'mmdet', 'mmpretrain'):
        cfg = _cfg(default_scope=scope)
        before = cfg.default_hooks.visualization.get('interval')
        trigger_visualization(cfg, scope, show=True)
        hook = cfg.default_hooks.visualization
        assert hook.show is True and hook.wait_time == 2., scope
        assert hook.get('interval') == (1 if scope == 'mmpretrain' else before), scope
        cfg = _cfg(default_scope=scope)
        trigger_visualization(cfg, scope, show_dir='d', wait_time=0.5, interval=7)
        hook = cfg.default_hooks.visualization
        assert hook.interval == 7 and hook.get('show') is not True, scope
    cfg = _cfg()
    del cfg.default_hooks['visualization']
    with pytest.raises(ValueError, match='visualization'):
        trigger_visualization(cfg, 'mmseg', show=True)


class _NotAllowed:
    pass


class _GetattrPayload:
    def __reduce__(self):  # pickles as getattr(numpy.ndarray, 'tofile')
        import numpy as np
        return getattr, (np.ndarray, 'tofile')


def test_runner_checkpoint_globals_load_weights_only(tmp_path):
    """A Runner-style checkpoint (message hub with HistoryBuffers, numpy scalar runtime
    info) loads with weights_only=True after the allow-list, and nothing else does (torch
    < 2.5, without the safe-globals API: through paca_mm's restricted unpickler)."""
    import numpy as np
    from mmengine.logging import MessageHub
    hub = MessageHub.get_instance('paca_mm_test_ckpt_globals')
    for i in range(3):
        hub.update_scalar('train/loss', 1.0 / (i + 1))
    hub.update_info('best_score', np.float64(0.5))
    ckpt = dict(meta=dict(message_hub=hub.state_dict(), seed=0),
                state_dict={'w': torch.ones(2)}, optimizer={'state': {}})
    path = tmp_path / 'ckpt.pth'
    torch.save(ckpt, path)
    if not hasattr(torch.serialization, 'get_safe_globals'):
        from paca_mm.checkpoint import CheckpointError, safe_torch_load
        loaded = safe_torch_load(str(path))
        buf = loaded['meta']['message_hub']['log_scalars']['train/loss']
        assert buf.current() == pytest.approx(1 / 3)
        assert loaded['meta']['message_hub']['runtime_info']['best_score'] == 0.5
        for name, obj in (('bad', _NotAllowed()), ('bad_getattr', _GetattrPayload())):
            torch.save(dict(obj=obj), tmp_path / f'{name}.pth')
            with pytest.raises(CheckpointError, match='refusing to load'):
                safe_torch_load(str(tmp_path / f'{name}.pth'))
        return

    # the allow-list is process-wide: start from torch's defaults (other tests may have
    # allow-listed already), restore afterwards
    saved = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        _check_runner_checkpoint_globals(path, tmp_path)
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(saved)


def _check_runner_checkpoint_globals(path, tmp_path):
    unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    allowed = {g[1] if isinstance(g, tuple) else f'{g.__module__}.{g.__qualname__}'
               for g in mmengine_checkpoint_globals()}
    assert any('HistoryBuffer' in name for name in unsafe)
    assert unsafe <= allowed, f'not allow-listed: {unsafe - allowed}'

    allow_mmengine_checkpoint_globals()
    loaded = torch.load(path, map_location='cpu', weights_only=True)
    buf = loaded['meta']['message_hub']['log_scalars']['train/loss']
    assert buf.current() == pytest.approx(1 / 3)
    assert loaded['meta']['message_hub']['runtime_info']['best_score'] == 0.5
    # weights-only protection is still on for anything else: unknown classes, and
    # getattr beyond HistoryBuffer's methods
    torch.save(dict(obj=_NotAllowed()), tmp_path / 'bad.pth')
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / 'bad.pth', weights_only=True)
    torch.save(dict(obj=_GetattrPayload()), tmp_path / 'bad_getattr.pth')
    with pytest.raises(pickle.UnpicklingError, match='HistoryBuffer methods only'):
        torch.load(tmp_path / 'bad_getattr.pth', weights_only=True)


def test_cpu_amp_optim_wrapper():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                 loss_scale='dynamic', dtype='bfloat16')
    before = model.weight.detach().clone()
    with wrapper.optim_context(model):
        out = model(torch.randn(3, 4))
    assert out.dtype == torch.bfloat16
    wrapper.update_params(out.float().pow(2).mean())
    assert not torch.equal(before, model.weight)
    state = wrapper.state_dict()
    state['loss_scaler'] = {'scale': 65536.0}  # as written by AmpOptimWrapper on GPU
    wrapper.load_state_dict(state)
    with pytest.raises(ValueError, match='bfloat16'):
        CPUAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                           dtype='float16')


def test_cpu_ddp_wrapper_reverts_syncbn(tmp_path):
    import torch.distributed as dist
    assert not dist.is_initialized()
    dist.init_process_group('gloo', init_method=f'file://{tmp_path / "pg"}', rank=0,
                            world_size=1)
    try:
        model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.SyncBatchNorm(4))
        ddp = CPUDistributedDataParallel(model, device_ids=[0], broadcast_buffers=False)
        assert not any(isinstance(m, nn.SyncBatchNorm) for m in ddp.modules())
        ddp(torch.randn(2, 3, 4, 4)).sum().backward()
        assert model[0].weight.grad is not None
    finally:
        dist.destroy_process_group()


def test_tool_cli_errors(tmp_path, monkeypatch, load_tool):
    monkeypatch.setenv('LOCAL_RANK', '0')  # parse_args exports it; restored afterwards
    test_tool, train_tool = load_tool('test'), load_tool('train')
    with pytest.raises(FileNotFoundError, match='does not exist'):
        test_tool.main([CONFIG, str(tmp_path / 'missing.pth')])
    args = train_tool.parse_args([CONFIG, '--resume'])
    assert args.resume == 'auto'
    # the toolboxes' defaults: no AMP, 2 s between shown images, LOCAL_RANK 0 if unset
    assert train_tool.parse_args([CONFIG]).amp is False
    assert test_tool.parse_args([CONFIG, 'x.pth']).wait_time == 2
    for tool, argv in ((train_tool, [CONFIG]), (test_tool, [CONFIG, 'x.pth'])):
        monkeypatch.delenv('LOCAL_RANK')
        assert tool.parse_args(argv).local_rank == 0 and os.environ['LOCAL_RANK'] == '0'
    args = train_tool.parse_args([CONFIG, '--resume', 'x.pth', '--amp', '--launcher', 'pytorch',
                                  '--cfg-options', 'a.b=1'])
    assert (args.resume, args.amp, args.launcher, args.cfg_options) == \
        ('x.pth', True, 'pytorch', {'a.b': 1})
    with pytest.raises(SystemExit):
        train_tool.parse_args([CONFIG, '--launcher', 'ssh'])


@pytest.mark.parametrize('launcher,env,expected', [
    ('pytorch', dict(RANK='1', WORLD_SIZE='2', LOCAL_RANK='1', MASTER_ADDR='127.0.0.1',
                     MASTER_PORT='29512'), (1, 2, '1', '29512')),
    ('slurm', dict(SLURM_PROCID='3', SLURM_NTASKS='4', SLURM_LOCALID='1',
                   SLURM_NODELIST='node1', MASTER_ADDR='node1'), (3, 4, '1', '29601')),
    ('mpi', dict(OMPI_COMM_WORLD_RANK='2', OMPI_COMM_WORLD_SIZE='3',
                 OMPI_COMM_WORLD_LOCAL_RANK='0', MASTER_ADDR='10.0.0.1'), (2, 3, '0', '29500')),
])
def test_init_cpu_distributed_reads_launcher_env(monkeypatch, launcher, env, expected):
    import paca_mm.engine.cpu as rt
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    calls = []
    monkeypatch.setattr(rt.torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(rt.torch_dist, 'is_initialized', lambda: False)
    monkeypatch.setattr(rt.torch_dist, 'init_process_group', lambda **kw: calls.append(kw))
    # dist_cfg.port: the Slurm port, as mmengine's init_dist (torchrun sets its own)
    assert rt.init_cpu_distributed(launcher, dict(backend='nccl', timeout=60, port=29601))
    (kwargs, ) = calls
    rank, world_size, local_rank, port = expected
    assert kwargs['backend'] == 'gloo' and kwargs['init_method'] == 'env://'
    assert (kwargs['rank'], kwargs['world_size']) == (rank, world_size)
    assert kwargs['timeout'].total_seconds() == 60
    assert os.environ['RANK'] == str(rank) and os.environ['LOCAL_RANK'] == local_rank
    assert os.environ['MASTER_PORT'] == port
    assert not rt.init_cpu_distributed('none')


def test_init_cpu_distributed_missing_env(monkeypatch):
    import paca_mm.engine.cpu as rt
    monkeypatch.setattr(rt.torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(rt.torch_dist, 'is_initialized', lambda: False)
    monkeypatch.delenv('RANK', raising=False)
    with pytest.raises(KeyError, match='RANK.*torchrun'):
        rt.init_cpu_distributed('pytorch')
    for key, value in dict(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0').items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv('MASTER_ADDR', raising=False)
    monkeypatch.setattr(rt.subprocess, 'getoutput', lambda cmd: 'host-from-scontrol')
    with pytest.raises(KeyError, match='MASTER_ADDR'):  # only Slurm asks scontrol
        rt.init_cpu_distributed('pytorch')
    with pytest.raises(ValueError, match='launcher'):
        rt.init_cpu_distributed('ssh')
    # Slurm without SLURM_LOCALID: local rank 0
    for key, value in dict(SLURM_PROCID='0', SLURM_NTASKS='1', MASTER_ADDR='node1').items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv('SLURM_LOCALID', raising=False)
    monkeypatch.delenv('MASTER_PORT', raising=False)  # restored after the test: set below
    monkeypatch.setattr(rt.torch_dist, 'init_process_group', lambda **kw: None)
    assert rt.init_cpu_distributed('slurm') and os.environ['LOCAL_RANK'] == '0'
    # with CUDA the toolboxes' own init_dist runs: nothing here
    monkeypatch.setattr(rt.torch.cuda, 'is_available', lambda: True)
    assert rt.init_cpu_distributed('slurm') is False


def test_rng_state_hook_restores_on_resume_only():
    from types import SimpleNamespace

    from mmengine.logging import MMLogger

    from paca_mm.engine.checkpoints import add_rng_state_hook
    from paca_mm.hooks import RNGStateHook
    runner = SimpleNamespace(iter=0, logger=MMLogger.get_instance('paca_mm_test_rng'))
    hook = RNGStateHook()
    torch.manual_seed(123)
    checkpoint = dict(meta=dict(iter=2))
    hook.before_save_checkpoint(runner, checkpoint)
    expected = torch.rand(3)  # what the interrupted run draws next

    # validation in between does not move the training stream
    torch.manual_seed(123)
    hook.before_val(runner)
    torch.rand(100)
    hook.after_val(runner)
    assert torch.equal(torch.rand(3), expected)

    # resume (loop iteration set from the checkpoint): restored
    torch.manual_seed(0)
    hook.after_load_checkpoint(runner, checkpoint)
    runner.iter = 2
    hook.before_train(runner)
    assert torch.equal(torch.rand(3), expected)
    # load_from (training starts at iteration 0): nothing restored
    torch.manual_seed(0)
    reference = torch.rand(3)
    torch.manual_seed(0)
    hook.after_load_checkpoint(runner, checkpoint)
    runner.iter = 0
    hook.before_train(runner)
    assert torch.equal(torch.rand(3), reference)

    # CUDA's generators are saved only once CUDA is in use (saving must not initialise it)
    import unittest.mock as mock
    with mock.patch.object(torch.cuda, 'is_available', lambda: True), \
            mock.patch.object(torch.cuda, 'is_initialized', lambda: False), \
            mock.patch.object(torch.cuda, 'get_rng_state_all', side_effect=AssertionError):
        assert set(RNGStateHook._get_state()) == {'torch'}
    # a checkpoint's CUDA states are set only where the same number of GPUs exists
    state = dict(torch=torch.get_rng_state(), cuda=[torch.zeros(8, dtype=torch.uint8)] * 2)
    for available, count, expected in ((False, 2, 0), (True, 1, 0), (True, 2, 1)):
        with mock.patch.object(torch.cuda, 'is_available', lambda: available), \
                mock.patch.object(torch.cuda, 'device_count', lambda: count), \
                mock.patch.object(torch.cuda, 'set_rng_state_all') as set_cuda:
            RNGStateHook._set_state(state)
        assert set_cuda.call_count == expected, (available, count)
    # a checkpoint of iteration 0 cannot be told from load_from, and a loop at another
    # iteration than the checkpoint's is not its resume: nothing restored
    for ckpt_iter, loop_iter in ((0, 0), (5, 2)):
        torch.manual_seed(0)
        hook.after_load_checkpoint(runner, dict(meta=dict(iter=ckpt_iter, rng_state=state)))
        runner.iter = loop_iter
        hook.before_train(runner)
        assert torch.equal(torch.rand(3), reference), (ckpt_iter, loop_iter)
    # resumed at iteration 1: restored
    torch.manual_seed(0)
    hook.after_load_checkpoint(runner, dict(meta=dict(iter=1, rng_state=state)))
    runner.iter = 1
    hook.before_train(runner)
    assert not torch.equal(torch.rand(3), reference)

    cfg = _cfg()
    assert add_rng_state_hook(cfg) and cfg.custom_hooks == [dict(type='RNGStateHook')]
    assert add_rng_state_hook(cfg) == [] and len(cfg.custom_hooks) == 1


# ----------------------------------------------------------------------------- slow
def _env():
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1',
               CUDA_VISIBLE_DEVICES='', PYTHON=sys.executable)
    env['PYTHONPATH'] = os.pathsep.join(
        [ROOT, DATA] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    return env


def _data_options(data_root):
    return ['--cfg-options'] + [f'{split}_dataloader.dataset.data_root={data_root}'
                                for split in ('train', 'val', 'test')]


def _run(cmd, cwd, timeout=300):
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f'{cmd} failed ({proc.returncode}):\n{out[-6000:]}'
    return out


@pytest.fixture(scope='module')
def tiny_data(tmp_path_factory):
    from demo.datasets.synthetic_seg import generate_synthetic_seg
    root = tmp_path_factory.mktemp('tools_seg_data')
    return generate_synthetic_seg(str(root), num_train=4, num_val=2, size=(32, 32), seed=0)


@pytest.mark.slow
def test_train_then_test_tools(tmp_path, tiny_data):
    work = tmp_path / 'work'
    out = _run([sys.executable, osp.join(ROOT, 'tools', 'train.py'), CONFIG, '--work-dir',
                str(work), '--amp'] + _data_options(tiny_data), cwd=tmp_path)
    assert (work / 'iter_3.pth').is_file() and (work / 'iter_6.pth').is_file()
    assert 'SyncBN reverted to BN' in out
    assert 'CPUAmpOptimWrapper' in out
    assert re.search(r'Iter\(train\) \[6/6\]', out)
    val = re.search(r'Iter\(val\) \[2/2\].*mIoU: ([0-9.]+)', out)  # validation at iter 6
    assert val, out[-3000:]

    preds, vis = tmp_path / 'preds', tmp_path / 'vis'
    out = _run([sys.executable, osp.join(ROOT, 'tools', 'test.py'), CONFIG,
                str(work / 'iter_6.pth'), '--work-dir', str(tmp_path / 'test'), '--out',
                str(preds), '--show-dir', str(vis), '--interval', '1']
               + _data_options(tiny_data), cwd=tmp_path)
    assert 'Load checkpoint from' in out
    m = re.search(r'Iter\(test\) \[2/2\].*mIoU: ([0-9.]+)', out)
    assert m, out[-3000:]
    # the same checkpoint on the same 2 images as the validation at iteration 6: the same mIoU
    assert m.group(1) == val.group(1), (m.group(0), val.group(0))
    assert len(os.listdir(preds)) == 2  # one prediction map per validation image
    assert len(os.listdir(vis / 'vis_data' / 'vis_image')) == 2  # painted predictions



def _load_runner_checkpoint(path):
    from paca_mm.checkpoint import load_checkpoint_file  # weights-only + Runner allow-list
    return load_checkpoint_file(str(path))


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _run_dist(cmd, cwd, env):
    """Run a 2-process torchrun command on a fresh port; faulthandler prints every
    thread's Python stack if a rank dies of a signal."""
    env = dict(env, PORT=str(_free_port()), PYTHONFAULTHANDLER='1')
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_dist_train_two_cpu_processes(tmp_path, tiny_data):
    work = tmp_path / 'work'
    env = _env()
    env['PORT'] = str(_free_port())
    cmd = ['bash', osp.join(ROOT, 'tools', 'dist_train.sh'), DIST_CONFIG, '2', '--work-dir',
           str(work)] + _data_options(tiny_data) + ['train_cfg.max_iters=3',
                                                    'train_cfg.val_interval=3']
    proc = _run_dist(cmd, tmp_path, env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    # both ranks joined one gloo group and trained
    assert '[paca_mm] rank 0/2 ready (backend gloo)' in out
    assert '[paca_mm] rank 1/2 ready (backend gloo)' in out
    assert "distributed backend 'nccl' -> 'gloo'" in out
    assert 'CPUDistributedDataParallel' in out
    assert re.search(r'Iter\(train\) \[3/3\]', out)
    assert 'Distributed training: True' in out
    # the 2 validation images are split over the 2 ranks: one batch each
    assert re.search(r'Iter\(val\) \[1/1\]', out)
    assert (work / 'iter_3.pth').is_file() and (work / 'last_checkpoint').is_file()
    # DDP kept the ranks in step: both end with the same parameters, which are the
    # checkpoint's (tests/data/tools_rank_weights_hook.py saves each rank's). BN running
    # statistics are per rank (SyncBN has no CPU implementation, so the tools revert it to
    # BN), and the checkpoint holds rank 0's.
    rank0, rank1 = (torch.load(str(work / f'rank{r}_weights.pth'), weights_only=True)
                    for r in (0, 1))
    ckpt = _load_runner_checkpoint(work / 'iter_3.pth')['state_dict']
    assert rank0['params'].keys() == rank1['params'].keys()
    # (the data preprocessor's mean/std are non-persistent buffers: not in checkpoints)
    assert set(rank0['params']) | set(rank0['buffers']) - {
        'data_preprocessor.mean', 'data_preprocessor.std'} == set(ckpt)
    for k, v in rank0['params'].items():
        assert torch.equal(v, rank1['params'][k]), f'ranks differ in {k}'
        assert torch.equal(v, ckpt[k]), f'rank 0 differs from iter_3.pth in {k}'
    for k, v in rank0['buffers'].items():
        assert k not in ckpt or torch.equal(v, ckpt[k]), f'rank 0 differs from iter_3.pth in {k}'
    assert any(not torch.equal(v, rank1['buffers'][k]) for k, v in rank0['buffers'].items()
               if k.endswith('running_mean')), 'BN statistics are expected to be per rank'

    # dist_test.sh on that checkpoint: 2 ranks, results gathered on rank 0
    cmd = ['bash', osp.join(ROOT, 'tools', 'dist_test.sh'), CONFIG, str(work / 'iter_3.pth'),
           '2', '--work-dir', str(tmp_path / 'test')] + _data_options(tiny_data)
    proc = _run_dist(cmd, tmp_path, env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert '[paca_mm] rank 1/2 ready (backend gloo)' in out
    assert re.search(r'Iter\(test\) \[1/1\].*mIoU: [0-9.]+', out), out[-3000:]
