"""PaCaViT reproduces the official implementation (shared/reference/fixtures)."""
import json
import os
import os.path as osp

import pytest
import torch

from paca_mm.models.backbones import PaCaViT
from paca_mm.models.layers import ConvFFN

FIXTURES = os.environ.get('PACA_FIXTURES', osp.join(
    osp.dirname(__file__), '..', '..', 'shared', 'reference', 'fixtures'))
INDEX = osp.join(FIXTURES, 'index.json')

if not osp.exists(INDEX):  # the fixtures live beside the repo, in shared/
    pytest.fail(f'reference fixtures not found at {FIXTURES}; set PACA_FIXTURES', pytrace=False)
CASES = json.load(open(INDEX))


def build_from_official(kwargs) -> PaCaViT:
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
        drop_path_rate=kwargs['drop_path_rate'], out_indices=kwargs['out_indices'])


@pytest.mark.parametrize('banded', [False, True], ids=['unbanded', 'banded_ffn'])
@pytest.mark.parametrize('name', sorted(CASES))
def test_fixture_reproduced(name, banded, monkeypatch):
    # banded: the CPU inference FFN runs one image row per band (ConvFFN.forward_banded)
    monkeypatch.setattr(ConvFFN, 'band_bytes', 1 if banded else 1 << 62)
    info = CASES[name]
    data = torch.load(osp.join(FIXTURES, name + '.pt'), weights_only=True)
    model = build_from_official(info['official_constructor_kwargs'])
    assert sum(p.numel() for p in model.parameters()) == info['num_params']
    assert list(model.state_dict()) == list(data['state_dict'])  # same keys, same order
    model.load_state_dict(data['state_dict'], strict=True)
    model.eval()
    with torch.no_grad():
        outs = model(data['input'])
    assert len(outs) == len(data['outputs'])
    for ours, ref, shape in zip(outs, data['outputs'], info['output_shapes']):
        assert list(ours.shape) == shape
        rel = ((ours - ref).norm() / ref.norm()).item()
        assert rel < 1e-5, f'{name}: relative error {rel:.2e}'
