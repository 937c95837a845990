"""Behaviours users hit directly, pinned so that each test fails when its behaviour breaks:
eval determinism under every dropout knob, activation checkpointing under drop path,
``init_cfg`` strictness, ``--resume`` picking the newest complete checkpoint, the safe
unpickler's exact allow-list."""
import copy
import logging
import os.path as osp

import pytest
import torch
from mmengine.config import Config

import paca_mm  # noqa: F401
from paca_mm.models.backbones import PaCaViT

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TINY_ARCH = dict(embed_dims=(16, 32, 48, 64), depths=(1, 2, 1, 1), num_heads=(1, 2, 4, 8))
# every dropout knob of the constructor, all > 0
DROPS = dict(drop_rate=0.3, attn_drop_rate=0.3, drop_path_rate=0.3)


def _tiny(**kwargs):
    torch.manual_seed(0)  # same weights for every call
    kw = dict(arch=TINY_ARCH, num_clusters=(4, 4, 4, 0))
    kw.update(kwargs)
    return PaCaViT(**kw)


# --------------------------------------------------------------- dropout knobs
@pytest.mark.parametrize('knob', sorted(DROPS) + ['all'])
def test_eval_forward_is_deterministic_with_dropout_knobs(knob):
    drops = DROPS if knob == 'all' else {knob: DROPS[knob]}
    model = _tiny(**drops)
    x = torch.randn(2, 3, 32, 32)
    model.train()  # the knob acts in training: two forwards differ
    torch.manual_seed(1)
    a = model(x)
    b = model(x)
    assert any(not torch.equal(p, q) for p, q in zip(a, b)), f'{drops} did nothing in train'
    model.eval()
    torch.manual_seed(1)
    a = model(x)
    b = model(x)
    for p, q in zip(a, b):
        assert torch.equal(p, q), f'eval forward is random with {drops}'
    # and eval equals the model without any dropout
    ref = _tiny(drop_path_rate=0.).eval()
    ref.load_state_dict(model.state_dict())
    for p, q in zip(a, ref(x)):
        torch.testing.assert_close(p, q)


# --------------------------------------------------------- checkpointing + RNG
def test_with_cp_gradients_equal_with_drop_path_and_dropout(grad_errors):
    a = _tiny(**DROPS).train()
    b = copy.deepcopy(a)
    b.with_cp = True
    x = torch.randn(2, 3, 32, 32)

    def grads(model, seed):
        model.zero_grad()
        torch.manual_seed(seed)
        # a sum, not a mean: gradients well above assert_close's absolute tolerance
        sum((o ** 2).sum() for o in model(x)).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref = grads(a, 3)
    errors = grad_errors(grads(b, 3), ref)
    assert max(errors.values()) < 1e-4, {n: e for n, e in errors.items() if e >= 1e-4}
    # the seed matters (drop path and dropout do act): another seed, other gradients
    assert max(grad_errors(grads(a, 4), ref).values()) > 0.1


# ----------------------------------------------------------- init_cfg strict
def _checkpoint_missing_a_key(tmp_path):
    src = _tiny()
    sd = src.state_dict()
    dropped = 'stage1.0.attn.q.weight'
    sd.pop(dropped)
    path = str(tmp_path / 'backbone.pth')
    torch.save({'state_dict': sd}, path)
    return src, path, dropped


def test_init_cfg_strict_reaches_the_loader(tmp_path):
    from paca_mm.checkpoint import CheckpointError
    _, path, dropped = _checkpoint_missing_a_key(tmp_path)
    model = _tiny(init_cfg=dict(type='Pretrained', checkpoint=path, strict=True))
    with pytest.raises(CheckpointError, match=dropped.replace('.', r'\.')):
        model.init_weights()


def test_init_cfg_not_strict_loads_and_warns(tmp_path):
    from mmengine.logging import MMLogger
    src, path, dropped = _checkpoint_missing_a_key(tmp_path)
    for strict in (False, None):  # None: the default
        cfg = dict(type='Pretrained', checkpoint=path)
        if strict is not None:
            cfg['strict'] = strict
        model = _tiny(init_cfg=cfg)
        with torch.no_grad():  # to tell the random init from the loaded weights
            for p in model.parameters():
                p.add_(1.)
        logger = MMLogger.get_current_instance()
        lines = []

        class Collect(logging.Handler):
            def emit(self, record):
                lines.append((record.levelno, record.getMessage()))
        handler = Collect()
        logger.addHandler(handler)
        try:
            model.init_weights()
        finally:
            logger.removeHandler(handler)
        assert any(level == logging.WARNING and dropped in msg for level, msg in lines), lines
        for k, v in src.state_dict().items():
            if k != dropped:
                assert torch.equal(model.state_dict()[k], v), k


# ------------------------------------------------------------------- --resume
def _runner_checkpoint(path, step):
    """A small file in mmengine Runner checkpoint layout."""
    torch.save({'meta': {'iter': step, 'epoch': 0}, 'state_dict': {'w': torch.full((64,), step)},
                'optimizer': {'state': {}, 'param_groups': []}, 'message_hub': {}}, path)


def test_resume_picks_the_newest_complete_checkpoint(tmp_path):
    from paca_mm.engine.checkpoints import check_resume_checkpoint
    cfg = Config.fromfile(osp.join(ROOT, 'tests', 'data', 'tools_tiny_seg.py'))
    cfg.default_hooks.checkpoint.by_epoch = False
    cfg.default_hooks.checkpoint.pop('filename_tmpl', None)
    cfg.work_dir = str(tmp_path)
    cfg.resume = True
    cfg.load_from = None
    for step in (1, 2, 3):
        _runner_checkpoint(str(tmp_path / f'iter_{step}.pth'), step)
    newest = tmp_path / 'iter_3.pth'
    data = newest.read_bytes()
    newest.write_bytes(data[:len(data) // 2])  # killed while saving
    (tmp_path / 'last_checkpoint').write_text(str(newest))
    warnings = check_resume_checkpoint(cfg)
    chosen = str(tmp_path / 'iter_2.pth')
    assert cfg.load_from == chosen
    assert len(warnings) == 1 and chosen in warnings[0] and str(newest) in warnings[0], warnings
    assert str(tmp_path / 'iter_1.pth') not in warnings[0] and 'also skipped' not in warnings[0]


def test_resume_by_epoch_names_and_a_named_checkpoint(tmp_path):
    """The hook without by_epoch saves epoch_*.pth (mmengine's default), so those are the
    fallbacks; ``--resume CKPT``: a broken local file is an error, a complete one or a
    path mmengine will report (missing, remote) passes unchanged."""
    from paca_mm.checkpoint import CheckpointError
    from paca_mm.engine.checkpoints import check_resume_checkpoint
    cfg = Config.fromfile(osp.join(ROOT, 'tests', 'data', 'tools_tiny_seg.py'))
    for key in ('by_epoch', 'filename_tmpl'):
        cfg.default_hooks.checkpoint.pop(key, None)
    cfg.merge_from_dict(dict(work_dir=str(tmp_path), resume=True, load_from=None))
    for step in (1, 2):
        _runner_checkpoint(str(tmp_path / f'epoch_{step}.pth'), step)
    _runner_checkpoint(str(tmp_path / 'iter_9.pth'), 9)  # not this hook's name
    newest = tmp_path / 'epoch_2.pth'
    newest.write_bytes(newest.read_bytes()[:100])
    (tmp_path / 'last_checkpoint').write_text(str(newest))
    check_resume_checkpoint(cfg)
    assert cfg.load_from == str(tmp_path / 'epoch_1.pth')
    for path in (str(tmp_path / 'epoch_1.pth'), str(tmp_path / 'nope.pth'), 's3://b/x.pth'):
        cfg.load_from = path
        assert check_resume_checkpoint(cfg) == [] and cfg.load_from == path
    cfg.load_from = str(newest)
    with pytest.raises(CheckpointError, match='cannot resume from .*epoch_2.pth'):
        check_resume_checkpoint(cfg)


def test_resume_skips_every_broken_checkpoint_and_names_them(tmp_path):
    """The two newest broken (truncated, empty): the oldest is taken and the warning names
    both skipped files; none complete: the error names every file tried."""
    from paca_mm.checkpoint import CheckpointError
    from paca_mm.engine.checkpoints import check_resume_checkpoint
    cfg = Config.fromfile(osp.join(ROOT, 'tests', 'data', 'tools_tiny_seg.py'))
    cfg.default_hooks.checkpoint.by_epoch = False
    cfg.default_hooks.checkpoint.pop('filename_tmpl', None)
    cfg.merge_from_dict(dict(work_dir=str(tmp_path), resume=True, load_from=None))
    for step in (1, 2, 3):
        _runner_checkpoint(str(tmp_path / f'iter_{step}.pth'), step)
    newest = tmp_path / 'iter_3.pth'
    newest.write_bytes(newest.read_bytes()[:100])
    (tmp_path / 'iter_2.pth').write_bytes(b'')
    (tmp_path / 'last_checkpoint').write_text(str(newest))
    warnings = check_resume_checkpoint(cfg)
    assert cfg.load_from == str(tmp_path / 'iter_1.pth')
    assert len(warnings) == 1 and 'also skipped' in warnings[0], warnings
    assert str(tmp_path / 'iter_2.pth') + ' is empty' in warnings[0], warnings
    (tmp_path / 'iter_1.pth').write_bytes(b'x')
    cfg.load_from = None
    with pytest.raises(CheckpointError, match='no complete checkpoint') as e:
        check_resume_checkpoint(cfg)
    assert all(str(tmp_path / f'iter_{i}.pth') in str(e.value) for i in (1, 2, 3))
    # an empty last_checkpoint: the newest complete file of the work dir
    _runner_checkpoint(str(tmp_path / 'iter_2.pth'), 2)
    (tmp_path / 'last_checkpoint').write_text('')
    cfg.load_from = None
    warnings = check_resume_checkpoint(cfg)
    assert cfg.load_from == str(tmp_path / 'iter_2.pth')
    assert 'last_checkpoint is empty' in warnings[0], warnings


# ------------------------------------------------------------ the allow-list
def _expected_globals():
    import argparse

    import numpy as np
    from mmengine.logging import HistoryBuffer

    from paca_mm.checkpoint import loading
    try:
        from numpy._core import multiarray
    except ImportError:
        from numpy.core import multiarray
    kinds = ('bool', 'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32', 'uint64',
             'float16', 'float32', 'float64')
    # argparse.Namespace: timm's CheckpointSaver pickles the training args as one (the
    # official ImageNet files); it has no __setstate__, so unpickling only fills its
    # __dict__, with values that pass this same allow-list
    return ([HistoryBuffer, (loading._history_buffer_getattr, 'builtins.getattr'),
             argparse.Namespace, multiarray._reconstruct, multiarray.scalar, np.ndarray,
             np.dtype],
            {type(np.dtype(k)) for k in kinds})


def test_safe_unpickler_allow_list_is_pinned():
    from paca_mm.checkpoint import loading
    fixed, dtype_classes = _expected_globals()
    got = loading.mmengine_checkpoint_globals()
    assert got[:len(fixed)] == fixed
    assert len(got) == len(fixed) + len(dtype_classes)
    assert set(got[len(fixed):]) == dtype_classes
    if hasattr(torch.serialization, 'add_safe_globals'):
        assert loading.allow_mmengine_checkpoint_globals() == got
        safe = torch.serialization.get_safe_globals()
        for g in ('builtins.eval', 'builtins.exec', 'os.system', 'posix.system'):
            assert not any((s[1] if isinstance(s, tuple) else
                            f'{getattr(s, "__module__", "")}.{getattr(s, "__qualname__", "")}')
                           == g for s in safe), g
    # the restricted unpickler of torch < 2.4: our globals resolve, others are refused
    import io
    import pickle
    module = loading._restricted_pickle_module()
    unpickler = module.Unpickler(io.BytesIO(b''))
    assert unpickler.find_class('builtins', 'getattr') is loading._history_buffer_getattr
    assert unpickler.find_class('collections', 'OrderedDict') is not None
    import argparse
    assert unpickler.find_class('argparse', 'Namespace') is argparse.Namespace
    assert not hasattr(argparse.Namespace, '__setstate__')  # unpickling fills __dict__ only
    for mod, name in (('builtins', 'eval'), ('builtins', 'exec'), ('os', 'system'),
                      ('posix', 'system'), ('subprocess', 'Popen'), ('builtins', 'open'),
                      ('builtins', '__import__'), ('numpy', 'load')):
        with pytest.raises(pickle.UnpicklingError, match='not an allowed global'):
            unpickler.find_class(mod, name)


# ------------------------------------------------------ tools/test.py outputs
@pytest.mark.parametrize('config, scope', [
    ('demo/configs/pacahead_tiny_synthetic_seg.py', 'mmseg'),
    ('demo/configs/mask_rcnn_tiny_synthetic_coco.py', 'mmdet')])
def test_test_tool_work_dir_and_out_land_where_asked(load_tool, monkeypatch, tmp_path,
                                                     config, scope):
    tool = load_tool('test')
    monkeypatch.setenv('LOCAL_RANK', '0')  # parse_args sets it otherwise: restored after
    built = []

    class SpyRunner:
        def test(self):
            return 'tested'

    def spy_build_runner(cfg):
        built.append(cfg)
        return SpyRunner()

    monkeypatch.setattr(tool, 'build_runner', spy_build_runner)
    ckpt = tmp_path / 'model.pth'
    torch.save({'state_dict': {}}, str(ckpt))
    config = osp.join(ROOT, config)
    work_dir = str(tmp_path / 'my_work_dir')
    out = str(tmp_path / ('maps' if scope == 'mmseg' else 'preds.pkl'))
    assert tool.main([config, str(ckpt), '--work-dir', work_dir, '--out', out]) == 'tested'
    cfg = built[-1]
    assert cfg.work_dir == work_dir
    assert cfg.load_from == str(ckpt)
    evaluators = cfg.test_evaluator if isinstance(cfg.test_evaluator, list) else [
        cfg.test_evaluator]
    if scope == 'mmseg':  # a directory of prediction maps, kept
        assert [(e['output_dir'], e['keep_results']) for e in evaluators] == [(out, True)]
    else:  # a .pkl of the predictions, after the config's own metrics
        assert evaluators[-1] == dict(type='mmdet.DumpDetResults', out_file_path=out)
        assert len(evaluators) > 1
    # without --work-dir: ./work_dirs/<config name>; without --out: nothing dumped
    monkeypatch.chdir(tmp_path)
    tool.main([config, str(ckpt)])
    cfg = built[-1]
    name = osp.splitext(osp.basename(config))[0]
    assert osp.normpath(cfg.work_dir) == osp.join('work_dirs', name)
    evaluators = cfg.test_evaluator if isinstance(cfg.test_evaluator, list) else [
        cfg.test_evaluator]
    assert not any('output_dir' in e or 'out_file_path' in e for e in evaluators)
