"""The tools apply the CPU inference pass (paca_mm.fuse_for_cpu_inference) on the CPU, and
``--no-fuse`` turns it off: tools/test.py (through PaCaCPUInferenceHook), image_demo.py,
visualize_clusters.py and benchmark.py.

The pass has no inference piece today (docs/benchmarks.md), so each test plants a spy
piece in ``INFERENCE_PIECES``: it wraps every ConvFFN and counts the forwards that went
through the fused model, which proves that the tool's own inference ran on it."""
import os.path as osp

import pytest
import torch
import torch.nn as nn

import paca_mm  # noqa: F401
from paca_mm import cpu_inference
from paca_mm.models.layers.common import ConvFFN
from paca_mm.visualization.inference import build_model

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CONFIG = osp.join(ROOT, 'tests', 'data', 'tools_tiny_seg.py')
CLS_CFG = osp.join(ROOT, 'demo', 'configs', 'paca_tiny_synthetic_cls.py')


class _SpyFFN(nn.Module):
    """Inference piece that counts its forwards and computes what the ConvFFN does."""
    calls = 0

    def __init__(self, ffn: nn.Module):
        super().__init__()
        self.ffn = ffn

    def forward(self, *args):
        _SpyFFN.calls += 1
        return self.ffn(*args)


@pytest.fixture
def spy(monkeypatch):
    """Plants the spy piece; returns the messages the pass logs."""
    _SpyFFN.calls = 0
    monkeypatch.setitem(cpu_inference.INFERENCE_PIECES, ConvFFN, _SpyFFN)
    messages = []
    real = cpu_inference.print_log

    def log(msg, *args, **kwargs):
        messages.append(msg)
        real(msg, *args, **kwargs)

    monkeypatch.setattr(cpu_inference, 'print_log', log)
    return messages


def _n_ffn(model):
    return sum(isinstance(m, ConvFFN) for m in model.modules())


def test_apply_pass_logs_and_skips(spy):
    model = build_model(CLS_CFG)
    n = _n_ffn(model)
    assert not cpu_inference.apply_cpu_inference_pass(model, enabled=False)
    assert spy[-1] == 'CPU inference pass off (--no-fuse)' and _n_ffn(model) == n
    model.train()
    assert cpu_inference.apply_cpu_inference_pass(model)  # puts the model in eval mode
    assert not model.training and sum(isinstance(m, _SpyFFN) for m in model.modules()) == n
    assert spy[-1].startswith('CPU inference pass applied (paca_mm.fuse_for_cpu_inference) '
                              f'to 1 PaCaViT backbone(s): {n} inference piece(s) swapped in')
    plain = nn.Sequential(nn.Conv2d(3, 4, 3))
    assert not cpu_inference.apply_cpu_inference_pass(plain)
    assert spy[-1] == 'CPU inference pass not applied: Sequential contains no PaCaViT'
    meta = build_model(CLS_CFG).to('meta')
    assert not cpu_inference.apply_cpu_inference_pass(meta)
    assert spy[-1] == "CPU inference pass not applied: the model is on ['meta']"


@pytest.fixture(scope='module')
def seg_data(tmp_path_factory):
    from demo.datasets.synthetic_seg import generate_synthetic_seg
    root = tmp_path_factory.mktemp('fuse_seg_data')
    return generate_synthetic_seg(str(root), num_train=2, num_val=2, size=(32, 32), seed=0)


@pytest.mark.parametrize('no_fuse', [False, True], ids=['fused', 'no-fuse'])
def test_test_tool(tmp_path, seg_data, spy, no_fuse, load_tool):
    """tools/test.py: the test loop's forwards run through the fused model on the CPU."""
    torch.manual_seed(0)
    model = build_model(SEG_CONFIG)
    n = _n_ffn(model)
    ckpt = str(tmp_path / 'model.pth')
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, ckpt)
    args = [SEG_CONFIG, ckpt, '--work-dir', str(tmp_path / 'work'), '--cfg-options'] + \
        [f'{s}_dataloader.dataset.data_root={seg_data}' for s in ('train', 'val', 'test')]
    metrics = load_tool('test').main(args + (['--no-fuse'] if no_fuse else []))
    assert 'mIoU' in metrics
    if no_fuse:
        assert _SpyFFN.calls == 0 and 'CPU inference pass off (--no-fuse)' in spy
    else:
        assert _SpyFFN.calls == 2 * n  # 2 test images, batch 1, each FFN once per image
        assert any(m.startswith('CPU inference pass applied') for m in spy)


@pytest.mark.parametrize('no_fuse', [False, True], ids=['fused', 'no-fuse'])
def test_image_demo_and_visualize_clusters(tmp_path, spy, no_fuse, load_tool):
    cv2 = pytest.importorskip('cv2')
    img = str(tmp_path / 'img.png')
    cv2.imwrite(img, (torch.rand(40, 48, 3) * 255).byte().numpy())
    flag = ['--no-fuse'] if no_fuse else []
    load_tool('image_demo').main([CLS_CFG, 'none', img, '--out', str(tmp_path / 'out.png')] + flag)
    demo_calls = _SpyFFN.calls
    load_tool('visualize_clusters').main([CLS_CFG, 'none', img, '--out', str(tmp_path / 'vis'),
                                      '--no-per-cluster'] + flag)
    if no_fuse:
        assert demo_calls == _SpyFFN.calls == 0
        assert spy.count('CPU inference pass off (--no-fuse)') == 2
    else:
        n = _n_ffn(build_model(CLS_CFG))
        assert demo_calls == n  # one image, one forward
        assert _SpyFFN.calls == 2 * n  # the cluster heatmaps: one more forward
        assert sum(m.startswith('CPU inference pass applied') for m in spy) == 2


@pytest.mark.parametrize('no_fuse', [False, True], ids=['fused', 'no-fuse'])
def test_benchmark_forward_figures(tmp_path, spy, no_fuse, capsys, load_tool):
    """benchmark.py times the forwards of the fused PaCa model and the forward+backward of
    the unfused one (the pass works in place and is for inference only)."""
    tool = load_tool('benchmark')
    tool.main(['--models', 'paca_tiny', '--sizes', '32', '--repeats', '2', '--warmup', '1',
               '--settle', '1', '--threads', '1', '--skip-memory', '--out', str(tmp_path)]
              + (['--no-fuse'] if no_fuse else []))
    out = capsys.readouterr().out
    md = (tmp_path / 'benchmark.md').read_text()
    n = _n_ffn(tool.build('paca_tiny', 'cpu'))
    if no_fuse:
        assert _SpyFFN.calls == 0
        assert 'forward figures without the CPU inference pass (--no-fuse)' in out
        assert 'CPU inference pass off (--no-fuse)' in md
    else:
        # 1 warm-up + 2 rounds of (1 settling + 1 timed) forwards; no fwd+bwd call
        assert _SpyFFN.calls == 5 * n
        assert 'fused: the CPU inference pass changed paca_tiny;' in out
        assert 'fused: forwards after the CPU inference pass' in md
