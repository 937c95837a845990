"""tools/get_flops.py: attention FLOPs are counted, PaCa-Tiny matches the paper's 3.2 GFLOPs,
and the tool runs on a detector config."""
import os.path as osp

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
    assert res['params'] == 11_815_680  # backbone without head (official code)
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
    assert res['params'] == 11_815_680 + 20_159_216  # official code: backbone + Mask R-CNN parts
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
