"""tools/get_flops.py: attention FLOPs are counted, PaCa-Tiny matches the paper's 3.2 GFLOPs,
the tool runs on a detector config, and its --markdown tables take the paper's numbers from
the metafiles."""
import os.path as osp
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


@pytest.fixture(scope='module')
def get_flops(load_tool):
    return load_tool('get_flops')


class _Attn(nn.Module):
    """(B, N, C) -> (B, N, C) multi-head attention over M keys, SDPA or explicit matmuls."""

    def __init__(self, sdpa: bool, heads=4, dim=32):
        super().__init__()
        self.sdpa, self.heads = sdpa, heads
        self.kv = nn.Parameter(torch.randn(1, 7, dim))

    def forward(self, x):
        B, N, C = x.shape
        h, d = self.heads, C // self.heads
        q = x.view(B, N, h, d).transpose(1, 2)
        k = v = self.kv.expand(B, -1, -1).reshape(B, 7, h, d).transpose(1, 2)
        if self.sdpa:
            return F.scaled_dot_product_attention(q, k, v)
        attn = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * d ** -0.5, -1)
        return torch.matmul(attn, v)


def test_sdpa_counted_like_explicit_attention(get_flops):
    x = torch.randn(2, 50, 32)
    explicit = get_flops.count(_Attn(False), (x, ))
    fused = get_flops.count(_Attn(True), (x, ))
    expected = 2 * 4 * 50 * 7 * (8 + 8)  # B * h * N * M * (d_qk + d_v)
    assert explicit['flops'] == expected
    assert fused['flops'] == expected
    assert not fused['unsupported'].get('aten::scaled_dot_product_attention')


class _JitValue:
    """What a FLOP handle receives: a traced value, of known shape or not (None)."""

    def __init__(self, shape):
        self.shape = shape

    def isCompleteTensor(self):
        return self.shape is not None

    def type(self):
        return SimpleNamespace(sizes=lambda: list(self.shape))


def test_sdpa_handle_any_rank_and_unknown_shapes():
    """Eq.: prod(leading dims of the output) * N_q * N_kv * (d + d_v), for 3-D inputs as for
    4-D; an input of unknown shape is an error, not a guess."""
    from paca_mm.flops import sdpa_flop_jit
    shapes = [(6, 10, 8), (6, 7, 8), (6, 7, 4), (6, 10, 4)]  # q, k, v, out
    values = [_JitValue(s) for s in shapes]
    assert sdpa_flop_jit(values[:3], values[3:]) == 6 * 10 * 7 * (8 + 4)
    values = [_JitValue((2, ) + s) for s in shapes]
    assert sdpa_flop_jit(values[:3], values[3:]) == 2 * 6 * 10 * 7 * (8 + 4)
    for i in range(4):
        values = [_JitValue(None if j == i else s) for j, s in enumerate(shapes)]
        with pytest.raises(ValueError, match='unknown input shapes'):
            sdpa_flop_jit(values[:3], values[3:])


def test_count_reports_every_child_and_stays_quiet(get_flops, capsys):
    """Every top-level child is in the result (0 for one without MACs or parameters), and
    the analyzer's warnings (unsupported ops, uncalled modules) are off by default."""
    from paca_mm.flops import install_flop_handles

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act, self.unused = nn.Linear(4, 3), nn.ReLU(), nn.Linear(2, 2)

        def forward(self, x):
            return self.act(self.fc(x)).cumsum(-1)  # cumsum: an op without a handle

    res = get_flops.count(M(), (torch.randn(5, 4), ))
    assert res['by_module'] == dict(fc=60, act=0, unused=0)
    assert res['params_by_module'] == dict(fc=15, act=0, unused=6)
    assert res['unsupported'] == {'aten::cumsum': 1}
    out = capsys.readouterr()
    assert 'cumsum' not in out.out + out.err and 'unused' not in out.out + out.err
    assert install_flop_handles() is True  # this mmengine has the handle table


def test_baddbmm_counted(get_flops):
    class M(nn.Module):
        def forward(self, a, b):
            return torch.baddbmm(torch.zeros(3, 5, 6), a, b)

    res = get_flops.count(M(), (torch.randn(3, 5, 4), torch.randn(3, 4, 6)))
    assert res['flops'] == 3 * 5 * 4 * 6


def test_paca_tiny_matches_paper(get_flops):
    """PaCa-Tiny + GAP + 1000-way linear head at 224x224: paper 3.2 GFLOPs (3.237 G MACs
    measured from the official code), 12.2M params (12,200,680)."""
    res = get_flops.measure(backbone='tiny', shape=(224, 224))
    assert res['params'] == 12_200_680
    assert abs(res['flops'] / 1e9 - 3.237) / 3.237 < 0.03
    assert abs(res['flops'] / 1e9 - 3.2) / 3.2 < 0.03
    # the attention matmuls are in there: without them the count drops by > 7 %
    assert res['flops'] - res['by_module']['head'] == res['by_module']['backbone']
    from mmengine.analysis import FlopAnalyzer
    without = FlopAnalyzer(get_flops.PaCaClassifier('tiny'), (torch.randn(1, 3, 224, 224), ))
    without.set_op_handle('aten::scaled_dot_product_attention', lambda inputs, outputs: 0)
    without.unsupported_ops_warnings(False)
    without.uncalled_modules_warnings(False)
    assert without.total() < 0.93 * res['flops']


def test_backbone_only_and_cli(get_flops, capsys):
    res = get_flops.main(['--backbone', 'tiny', '--num-classes', '0', '--shape', '64', '96'])
    out = capsys.readouterr().out
    assert res['params'] == 11_815_680  # backbone without head (the official code's count)
    assert res['shape'] == (64, 96) and 'FLOPs (MACs)' in out
    with pytest.raises(ValueError, match='exactly one'):
        get_flops.measure(config=None, backbone=None)
    with pytest.raises(FileNotFoundError):
        get_flops.measure(config='no/such/config.py')


def test_detector_config(get_flops):
    """A Mask R-CNN config at a small size: backbone + FPN + RPN + RoI heads all counted;
    the backbone part equals the standalone backbone count."""
    cfg = osp.join(ROOT, 'configs', 'mask_rcnn',
                   'mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.py')
    res = get_flops.measure(config=cfg, shape=(120, 160),
                            cfg_options={'model.test_cfg.rpn.max_per_img': 10})
    assert res['kind'] == 'detector'
    assert tuple(res['input_shape']) == (128, 160)  # padded to 32
    assert res['params'] == 11_815_680 + 20_159_216  # backbone + Mask R-CNN parts (official code)
    assert res['num_rois'] == 10
    for part in ('backbone', 'neck', 'rpn_head', 'roi_head'):
        assert res['by_module'][part] > 0, part
    bb = get_flops.measure(backbone='tiny', num_classes=0, shape=(128, 160))
    assert res['by_module']['backbone'] == bb['flops']
    # RoI heads: 10 RoIs through the 2-fc bbox head, min(10, 100) through the mask head
    bbox_head = 10 * (256 * 7 * 7 * 1024 + 1024 * 1024 + 1024 * 81 + 1024 * 320)
    mask_head = 10 * (4 * 256 * 256 * 9 * 14 * 14 + 256 * 256 * 4 * 14 * 14
                      + 256 * 80 * 28 * 28)
    assert res['by_module']['roi_head'] == bbox_head + mask_head


def test_markdown_rows_come_from_the_metafiles(get_flops, monkeypatch):
    """--markdown: one row per metafile model that holds the paper's numbers (Tables 1-4),
    in model-index order, next to what was measured (a stand-in here)."""
    measured = dict(flops=2 * 10**9, params=10**6, by_module={'backbone': 10**9}, num_rois=1000)
    calls = []

    def measure(**kwargs):
        calls.append(kwargs)
        return dict(measured)

    monkeypatch.setattr(get_flops, 'measure', measure)
    text = get_flops.markdown(log=lambda line: None)
    rows = [ln for ln in text.splitlines() if ln.startswith('| ') and not ln.startswith('| model')]
    assert len(rows) == len(calls) == 12 + 12 + 9
    assert rows[0] == ('| PaCa-Tiny (`pacavit_tiny_p2cconv_100_0`) | 1,000,000 | 12.2 M / '
                       '12,200,680 | 2.000 | 3.2 / 3.237 | params -91.8%, FLOPs -38.2% |')
    assert calls[0] == dict(backbone='pacavit_tiny_p2cconv_100_0', shape=(224, 224))
    assert rows[12] == ('| PaCa-Tiny | 1.00 M | 32.0 M / 31.97 M | 2.0 / 1.0 (official code '
                        '65.6) | 252 | params -96.9% (vs code), FLOPs -99.2% | 1000 |')
    assert calls[12]['config'] == osp.join(ROOT, 'configs', 'mask_rcnn', 'mask_rcnn_pacavit_tiny_'
                                           'p2cconv_100_0_mstrain_480_800_1x_coco.py')
    assert rows[-1] == ('| Base + UperNet (`configs/upernet/upernet_pacavit_base_p2cconv_100_0_'
                        '512x512_160k_ade20k.py`) | 1.00 M | 77.2 M / 77.18 M | 2.00 | 264.1 / - '
                        '| params -98.7%, FLOPs -99.2% (vs paper) |')
    assert get_flops.markdown(['seg'], log=lambda line: None).startswith('## Table 3')


def test_zoo_root_in_an_installed_package(get_flops, tmp_path, monkeypatch):
    """The metafiles are found beside tools/ (a checkout, or paca_mm/.mim where mim runs the
    tool) or else in the installed package's paca_mm/.mim."""
    assert get_flops.zoo_root() == ROOT
    mim = tmp_path / 'site-packages' / 'paca_mm' / '.mim'
    mim.mkdir(parents=True)
    (mim / 'model-index.yml').write_text('Import: []\n')
    monkeypatch.setattr(get_flops, '__file__', str(tmp_path / 'elsewhere' / 'get_flops.py'))
    import paca_mm.apis
    monkeypatch.setattr(paca_mm.apis, '__file__', str(mim.parent / 'apis.py'))
    assert get_flops.zoo_root() == str(mim)
    assert get_flops.paper_models('Object Detection') == []
    (mim / 'model-index.yml').unlink()
    with pytest.raises(FileNotFoundError, match='model-index.yml is neither in'):
        get_flops.zoo_root()
