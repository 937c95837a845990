"""PaCaViT reproduces the official implementation: the outputs of five small random models
run by the official code (tests/data/fixtures, see its README).

The official outputs are reached to 8.4e-7 relative (float32 rounding of a different op
order); ``RTOL`` leaves a small margin over that, so a changed hyper-parameter such as a
LayerNorm eps of 1e-5 instead of 1e-6 fails. Every forward path is checked: eval mode
without and with autograd, and train mode (dropout and drop path are 0 here; the teacher's
BatchNorms use their running statistics via ``norm_eval``), which runs ConvFFN's
memory-efficient Function.
"""
import json
import os
import os.path as osp
from collections import OrderedDict

import numpy as np
import pytest
import torch

from paca_mm.models.backbones import PaCaViT

# PACA_FIXTURES: another folder of fixtures in the same format
FIXTURES = os.environ.get('PACA_FIXTURES', osp.join(osp.dirname(__file__), 'data', 'fixtures'))
RTOL = 2e-6

with open(osp.join(FIXTURES, 'index.json')) as f:
    CASES = json.load(f)


def build_from_official(kwargs, **extra) -> PaCaViT:
    """Our PaCaViT from the official constructor arguments recorded in index.json."""
    a, p = kwargs['arch_cfg'], kwargs['paca_cfg']
    sharing = [{0: 'stage', 1: 'block'}.get(o, o) for o in p['onsite_clustering']]
    t = kwargs.get('paca_teacher_cfg')
    return PaCaViT(
        arch=dict(embed_dims=a['embed_dims'], depths=a['depths'], num_heads=a['num_heads'],
                  mlp_ratios=a['mlp_ratios']),
        num_clusters=p['clusters'], clustering=p['type'], cluster_sharing=sharing,
        teacher=dict(depths=t['depths'], kernel_size=t['kernel_size']) if t else False,
        clustering_kernel_size=p['clustering_kernel_size'][0],
        drop_path_rate=kwargs['drop_path_rate'], out_indices=kwargs['out_indices'], **extra)


def load_case(name, **extra):
    """(our model with the fixture's weights, the fixture data)."""
    info = CASES[name]
    with np.load(osp.join(FIXTURES, name + '.npz')) as z:
        arrays = {k: torch.from_numpy(z[k]) for k in z.files}
    prefix = 'state_dict/'
    data = dict(input=arrays['input'],
                outputs=[arrays[f'output{i}'] for i in range(len(info['output_shapes']))],
                state_dict=OrderedDict((k[len(prefix):], v) for k, v in arrays.items()
                                       if k.startswith(prefix)))
    model = build_from_official(info['official_constructor_kwargs'], **extra)
    assert sum(p.numel() for p in model.parameters()) == info['num_params']
    assert list(model.state_dict()) == list(data['state_dict'])  # same keys, same order
    model.load_state_dict(data['state_dict'], strict=True)
    return model, data


def _run(model, data, path):
    model.train(path == 'train')
    with torch.set_grad_enabled(path in ('eval_autograd', 'train')):
        return model(data['input'])


@pytest.mark.parametrize('path', ['eval', 'eval_autograd', 'train'])
@pytest.mark.parametrize('name', sorted(CASES))
def test_fixture_reproduced(name, path):
    model, data = load_case(name, norm_eval=True)
    outs = _run(model, data, path)
    assert len(outs) == len(data['outputs'])
    for ours, ref, shape in zip(outs, data['outputs'], CASES[name]['output_shapes']):
        assert list(ours.shape) == shape
        rel = ((ours.detach() - ref).norm() / ref.norm()).item()
        assert rel < RTOL, f'{name} ({path}): relative error {rel:.2e}'


def _loss_and_grads(model, x, weights):
    """Parameter gradients of a fixed random projection of the outputs (not of their
    means: each stage ends in a LayerNorm, whose outputs' mean hardly depends on the
    weights)."""
    model.zero_grad(set_to_none=True)
    outs = model(x)
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize('name', sorted(CASES))
def test_fixture_gradients_equal_plain_autograd(name, plain_conv_ffn, grad_errors):
    """The training path's parameter gradients (memory-efficient ConvFFN backward) equal
    autograd's through the plain ops, on every fixture model in train mode, in float64
    (where the comparison measures the math, not float32 rounding, which the near-uniform
    attention of a random model amplifies ~1e5 times)."""
    model, data = load_case(name, norm_eval=True)
    model = model.double().train()
    x = data['input'].double()
    torch.manual_seed(0)
    weights = [torch.randn(s, dtype=torch.float64) for s in CASES[name]['output_shapes']]
    ours = _loss_and_grads(model, x, weights)
    with plain_conv_ffn():
        ref = _loss_and_grads(model, x, weights)
    worst = max(grad_errors(ours, ref).items(), key=lambda kv: kv[1])
    assert worst[1] < 1e-8, f'{name}: {worst}'
