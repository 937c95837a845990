"""torch.compile: the PaCa modules trace into one graph (no graph break) for every
clustering kind, sharing, the teacher and plain attention, alone and inside the PaCaHead
segmentor; and training works through mmengine's ``compile`` config option (the Runner
compiles ``train_step``), with the same weights as an eager run.

The training run uses the ``aot_eager`` backend (dynamo's capture and AOT autograd, the
same graphs inductor gets) to keep the suite's time; inductor's first iteration on this
tiny model takes minutes of C++ compilation on 2 cores. The graph breaks that remain in
such a run are outside paca_mm: mmseg's ``accuracy`` (``nonzero``) and mmengine's
optimizer wrapper (``loss.backward()``).

mmengine compiles ``train_step`` with the optimizer step in it, and torch's compiled Adam
writes NaN where the second moment is 0 when lr = 0 (pytorch/pytorch#126514): the tiny
config's PolyLR reaches 0 in its last iteration, so the run here keeps eta_min above 0, and
tools/train.py warns about such a schedule (tested below)."""
import os.path as osp

import pytest
import torch
import torch._dynamo

import paca_mm  # noqa: F401
from paca_mm.models.backbones import PaCaViT
from paca_mm.visualization.inference import build_model

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = osp.join(ROOT, 'tests', 'data', 'tools_tiny_seg.py')
SEG = osp.join(ROOT, 'demo', 'configs', 'pacahead_tiny_synthetic_seg.py')
ARCH = dict(embed_dims=(16, 24, 32, 40), depths=(1, 2, 1, 1), num_heads=(1, 2, 2, 4))


def _graph_breaks(fn, *args):
    torch._dynamo.reset()
    out = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    return out.graph_count, out.graph_break_count, [str(r.reason)[:300]
                                                    for r in out.break_reasons]


@pytest.mark.parametrize('kwargs', [
    dict(clustering='conv', num_clusters=(4, 4, 4, 0)),
    dict(clustering='mlp', num_clusters=(4, 4, 4, 0)),
    dict(clustering='linear', num_clusters=(5, 4, 3, 2), cluster_sharing='stage'),
    dict(num_clusters=(4, 4, 4, 4), cluster_sharing='block'),
    dict(num_clusters=(4, 4, 4, 4), teacher=dict(depths=(1,) * 4)),
    dict(num_clusters=(0, 0, 0, 0)),
    dict(num_clusters=(4, 4, 4, 0), drop_path_rate=0.1, layer_scale=1e-5),
], ids=['conv', 'mlp', 'linear-stage', 'block-sharing', 'teacher', 'plain', 'droppath-ls'])
@pytest.mark.parametrize('train', [True, False], ids=['train', 'eval'])
def test_backbone_has_no_graph_break(kwargs, train):
    torch.manual_seed(0)
    model = PaCaViT(arch=ARCH, **kwargs).train(train)
    graphs, breaks, reasons = _graph_breaks(model, torch.randn(2, 3, 45, 61))
    assert (graphs, breaks) == (1, 0), reasons


def test_inductor_inference_equals_eager():
    """Inference through inductor, as ``dev/benchmark.py``'s compile engine and deployments
    run it (static shapes, weights frozen into the graph): the same feature maps as eager,
    for conv clustering and a plain-attention stage, on a small model (inductor's C++ code
    generation is the cost of this test)."""
    torch.manual_seed(0)
    model = PaCaViT(arch=dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                              num_heads=[1, 2, 2, 4], mlp_ratios=[2, 2, 2, 2]),
                    num_clusters=(4, 4, 4, 0)).eval()
    x = torch.randn(1, 3, 64, 64)
    torch._dynamo.reset()
    with torch.no_grad():
        ref = model(x)
        outs = torch.compile(model, dynamic=False, options={'freezing': True})(x)
    for out, r in zip(outs, ref):
        torch.testing.assert_close(out, r, rtol=1e-4, atol=1e-5)


def test_segmentor_forward_has_no_graph_break():
    """Backbone + PaCaHead (mmseg's ``_forward``: features -> logits) in one graph."""
    torch.manual_seed(0)
    model = build_model(SEG).train()
    graphs, breaks, reasons = _graph_breaks(model._forward, torch.randn(2, 3, 64, 80))
    assert (graphs, breaks) == (1, 0), reasons


@pytest.mark.slow
def test_training_through_mmengine_compile(tmp_path, load_tool):
    from torch._dynamo.utils import counters

    from paca_mm.checkpoint import load_checkpoint_file
    from demo.datasets.synthetic_seg import generate_synthetic_seg
    root = generate_synthetic_seg(str(tmp_path / 'data'), num_train=4, num_val=2,
                                  size=(32, 32), seed=0)
    # paramwise_cfg: per-parameter groups, which mmengine makes ConfigDicts; traced, the
    # optimizer step fails on them (torch 2.14.1) without EagerOptimizerStepHook
    data = [f'{s}_dataloader.dataset.data_root={root}' for s in ('train', 'val', 'test')] + \
        ['param_scheduler.0.eta_min=1e-5', 'optim_wrapper.paramwise_cfg.norm_decay_mult=0.']
    train = load_tool('train')
    torch._dynamo.reset()
    counters.clear()
    try:
        train.main([CONFIG, '--work-dir', str(tmp_path / 'compiled'), '--cfg-options',
                    'compile.backend=aot_eager'] + data)
        graphs = counters['stats']['unique_graphs']
    finally:
        torch._dynamo.reset()
    assert graphs > 0  # the Runner's torch.compile really traced train_step
    train.main([CONFIG, '--work-dir', str(tmp_path / 'eager'), '--cfg-options'] + data)
    compiled = load_checkpoint_file(str(tmp_path / 'compiled' / 'iter_6.pth'))['state_dict']
    eager = load_checkpoint_file(str(tmp_path / 'eager' / 'iter_6.pth'))['state_dict']
    assert compiled.keys() == eager.keys()
    initial = build_model(CONFIG).state_dict()  # (seeded init differs: only a sanity check)
    moved = 0
    for k, v in eager.items():
        torch.testing.assert_close(compiled[k], v, rtol=1e-4, atol=1e-5)
        moved += k in initial and v.is_floating_point() and not torch.equal(v, initial[k])
    assert moved > 0


def test_eager_optimizer_step_hook():
    """tools/train.py adds the hook (once) when compile is on. In before_train it keeps each
    optimizer wrapper's update_params (also inside an OptimWrapperDict) out of a compiled
    train step: no optimizer op in any captured graph, and the same parameters as eager
    (with ConfigDict groups from paramwise_cfg, which dynamo 2.14 cannot trace)."""
    from types import SimpleNamespace

    from mmengine.config import Config, ConfigDict
    from mmengine.optim import OptimWrapperDict, build_optim_wrapper

    from paca_mm.engine.compile import add_eager_optimizer_step_hook
    from paca_mm.hooks import EagerOptimizerStepHook
    cfg = Config.fromfile(CONFIG)
    assert add_eager_optimizer_step_hook(cfg) == [] and not cfg.get('custom_hooks')
    cfg.compile = dict(disable=True)
    assert add_eager_optimizer_step_hook(cfg) == [] and not cfg.get('custom_hooks')
    cfg.compile = dict()  # mmengine compiles with the defaults
    assert add_eager_optimizer_step_hook(cfg) and add_eager_optimizer_step_hook(cfg) == []
    assert [h['type'] for h in cfg.custom_hooks] == ['EagerOptimizerStepHook']

    def wrapper_and_model(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
        optim_cfg = ConfigDict(type='OptimWrapper',
                               optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.01),
                               paramwise_cfg=dict(norm_decay_mult=0.))
        return build_optim_wrapper(model, optim_cfg), model

    ops = []

    def backend(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes
                   if n.op in ('call_function', 'call_method', 'call_module'))
        return gm

    x = torch.randn(4, 3)
    for seed, as_dict in ((0, False), (1, True)):
        eager_wrapper, eager_model = wrapper_and_model(seed)
        wrapper, model = wrapper_and_model(seed)
        assert all(type(g) is ConfigDict for g in wrapper.optimizer.param_groups)
        runner = SimpleNamespace(
            optim_wrapper=OptimWrapperDict(m=wrapper) if as_dict else wrapper)
        EagerOptimizerStepHook().before_train(runner)

        def train_step(x, wrapper=wrapper, model=model):
            loss = model(x).pow(2).mean()
            wrapper.update_params(loss)
            return loss

        torch._dynamo.reset()
        ops.clear()
        compiled = torch.compile(train_step, backend=backend)
        for lr in (1e-2, 5e-3, 2e-3):  # a schedule: the learning rate changes every step
            for w in (wrapper, eager_wrapper):
                for group in w.optimizer.param_groups:
                    group['lr'] = lr
            compiled(x)
            eager_wrapper.update_params(eager_model(x).pow(2).mean())
        torch._dynamo.reset()
        assert ops and not any('addcdiv' in op or 'foreach' in op or 'lerp' in op
                               for op in ops), ops
        for p, q in zip(model.parameters(), eager_model.parameters()):
            torch.testing.assert_close(p, q)


@pytest.mark.parametrize('version, cuda, compile_cfg, warns', [
    ('2.1.2+cu121', False, True, True),
    ('2.2.0', False, dict(backend='inductor'), True),
    ('2.1.2', False, dict(backend='aot_eager'), False),
    ('2.1.2', False, None, False),
    ('2.1.2', False, dict(), True),
    ('2.1.2', False, dict(disable=True), False),
    ('2.1.2', True, True, False),
    ('2.3.0', False, True, False),
    ('2.14.1+cu130', False, True, False),
])
def test_warning_for_compiled_cpu_attention_before_torch_23(monkeypatch, version, cuda,
                                                            compile_cfg, warns):
    from mmengine.config import Config

    from paca_mm.engine.compile import compiled_cpu_attention_torch_bug
    monkeypatch.setattr(torch, '__version__', version)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: cuda)
    cfg = Config.fromfile(CONFIG)
    cfg.compile = compile_cfg
    msg = compiled_cpu_attention_torch_bug(cfg)
    assert bool(msg) == warns
    assert not warns or ('#121174' in msg and version in msg and 'aot_eager' in msg)


def test_warning_for_compiled_adam_at_lr_zero():
    from mmengine.config import Config

    from paca_mm.engine.compile import compiled_adam_lr_zero
    cfg = Config.fromfile(CONFIG)  # AdamW, PolyLR to eta_min=0
    assert compiled_adam_lr_zero(cfg) is None  # no compile
    cfg.compile = True
    msg = compiled_adam_lr_zero(cfg)
    assert msg and 'AdamW and PolyLR takes the learning rate to 0' in msg and '#126514' in msg
    cfg.param_scheduler[0].eta_min = 1e-8
    assert compiled_adam_lr_zero(cfg) is None
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=1.0, end_factor=0.0)]
    assert 'LinearLR takes' in compiled_adam_lr_zero(cfg)
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=1e-6),  # a warmup to 1.0
                           dict(type='MultiStepLR', milestones=[8], end_factor=0.)]
    assert compiled_adam_lr_zero(cfg) is None
    cfg.optim_wrapper.optimizer = dict(type='SGD', lr=0.01)
    assert compiled_adam_lr_zero(cfg) is None


@pytest.mark.parametrize('compile_cfg, expected, says', [
    (None, None, ''),
    (dict(disable=True), dict(disable=True), ''),
    (dict(backend='aot_eager'), dict(backend='aot_eager'), ''),
    (True, dict(dynamic=False), 'note'),
    (dict(), dict(dynamic=False), 'note'),
    (dict(mode='max-autotune'), dict(mode='max-autotune', dynamic=False), 'note'),
    (dict(dynamic=False), dict(dynamic=False), ''),
    (dict(dynamic=True), dict(dynamic=True), 'warning'),
    (dict(backend='inductor', dynamic=None), dict(backend='inductor', dynamic=None), 'warning'),
])
def test_compile_static_shapes(compile_cfg, expected, says):
    """With inductor, tools/train.py compiles static shapes unless the config chooses: with
    symbolic sizes inductor fails on PaCa's channels_last views saved for the backward
    (pytorch/pytorch#172204; Mask R-CNN's multi-scale training stopped in iteration 3)."""
    from mmengine.config import Config

    from paca_mm.engine.compile import compile_static_shapes
    cfg = Config.fromfile(CONFIG)
    cfg.compile = compile_cfg
    notes, warnings = compile_static_shapes(cfg)
    assert cfg.compile == expected
    assert (len(notes), len(warnings)) == {'': (0, 0), 'note': (1, 0), 'warning': (0, 1)}[says]
    assert all('#172204' in m and 'dynamic' in m for m in notes + warnings)


def test_train_tool_compiles_static_shapes(monkeypatch, tmp_path, load_tool):
    """tools/train.py hands the Runner compile.dynamic=False."""
    from paca_mm.engine import args as engine_args

    class Built(Exception):
        pass

    seen = {}

    def build_runner(cfg):
        seen['compile'] = cfg.compile
        raise Built

    monkeypatch.setattr(engine_args, 'build_runner', build_runner)
    with pytest.raises(Built):
        load_tool('train').main([CONFIG, '--work-dir', str(tmp_path), '--cfg-options',
                                 'compile=True'])
    assert seen['compile'] == dict(dynamic=False)
