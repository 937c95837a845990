"""ONNX export (paca_mm/deployment.py, tools/deployment/pytorch2onnx.py) checked on ONNX
Runtime against PyTorch: the backbone (every clustering kind, the teacher, plain
attention), the mmseg segmentor with PaCaHead and with UperNet, the mmpretrain classifier,
and the mmdet detector's backbone + neck; all with dynamic N, H, W, at sizes that are not
multiples of 32."""
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import paca_mm  # noqa: F401
from paca_mm.deployment import (_FixedSizeAdaptivePool, check_onnx, default_kind,
                                export_module, export_onnx)
from paca_mm.models.backbones.paca_vit import PaCaViT
from paca_mm.visualization.inference import build_model

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'demo', 'configs')
SEG = osp.join(DEMO, 'pacahead_tiny_synthetic_seg.py')
CLS = osp.join(DEMO, 'paca_tiny_synthetic_cls.py')
DET = osp.join(DEMO, 'mask_rcnn_tiny_synthetic_coco.py')
# (N, H, W): the export size and two others, none a multiple of 32
SHAPES = [(1, 72, 104), (2, 50, 66), (1, 97, 41)]
ARCH = dict(embed_dims=(16, 24, 32, 40), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4))


@pytest.mark.parametrize('kwargs', [
    dict(clustering='conv', num_clusters=(4, 4, 4, 0)),
    dict(clustering='mlp', num_clusters=(4, 4, 4, 0)),
    dict(clustering='linear', num_clusters=(5, 4, 3, 2), cluster_sharing='stage'),
    dict(num_clusters=(4, 4, 4, 4), teacher=dict(depths=(1,) * 4)),
    dict(num_clusters=(0, 0, 0, 0)),
], ids=['conv', 'mlp', 'linear-stage', 'teacher', 'plain-attention'])
def test_backbone_onnx_matches_pytorch(tmp_path, kwargs):
    torch.manual_seed(0)
    model = PaCaViT(arch=ARCH, **kwargs).eval()
    out = str(tmp_path / 'backbone.onnx')
    names = export_onnx(model, out, 'backbone', shape=SHAPES[0][1:])
    assert names == ['feat0', 'feat1', 'feat2', 'feat3']
    assert os.listdir(tmp_path) == ['backbone.onnx']  # atomic: no temporary file left
    report = check_onnx(model, out, 'backbone', SHAPES, rtol=1e-4)
    assert [r['shape'][2:] for r in report] == [s[1:] for s in SHAPES]
    assert max(max(r['errors'].values()) for r in report) < 1e-4


def test_segmentor_export_equals_mmseg_predict():
    """The exported graph computes what mmseg's own predict gives (same normalisation,
    logits at the input size)."""
    from mmseg.structures import SegDataSample
    torch.manual_seed(0)
    model = build_model(SEG)
    img = (torch.rand(3, 70, 90) * 255).round()
    data = model.data_preprocessor(dict(inputs=[img], data_samples=[SegDataSample(
        metainfo=dict(img_shape=(70, 90), ori_shape=(70, 90)))]), False)
    with torch.no_grad():
        ref = model.predict(data['inputs'], data['data_samples'])[0].seg_logits.data
        got = export_module(model, 'segmentor')(img[None])[0]
    assert got.shape == ref.shape == (model.decode_head.num_classes, 70, 90)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # a wrong channel order (BGR vs RGB) is caught by this comparison
    model.data_preprocessor.channel_conversion = not model.data_preprocessor.channel_conversion
    with torch.no_grad():
        wrong = export_module(model, 'segmentor')(img[None])[0]
    assert not torch.allclose(wrong, ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize('config,kind,cfg_options', [
    (SEG, 'segmentor', None),
    (SEG, 'segmentor', 'upernet'),
    (CLS, 'classifier', None),
    (DET, 'backbone', None),
], ids=['pacahead', 'upernet', 'classifier', 'detector-backbone-neck'])
def test_model_onnx_matches_pytorch(tmp_path, config, kind, cfg_options):
    if cfg_options == 'upernet':
        # the demo segmentor with mmseg's UperNet head instead of PaCaHead
        cfg_options = {'model.decode_head': dict(_delete_=True,
            type='UPerHead', in_channels=[96, 192, 320, 384], in_index=[0, 1, 2, 3],
            pool_scales=(1, 2, 3, 6), channels=32, dropout_ratio=0.1, num_classes=4,
            norm_cfg=dict(type='BN', requires_grad=True), align_corners=False,
            loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0))}
    torch.manual_seed(0)
    model = build_model(config, cfg_options=cfg_options)
    assert default_kind(model) == kind
    out = str(tmp_path / 'model.onnx')
    shapes = SHAPES
    if cfg_options is not None:
        # UperNet's pyramid pooling (adaptive pooling to 2x2, 3x3, 6x6) needs a known input
        # size: a dynamic export is refused with the fix named, a static one checks out
        with pytest.raises(ValueError, match=r'decode_head\.psp_modules\.1\.0 \(output_size=2\)'
                           r'.*dynamic_hw=False; --static-hw'):
            export_onnx(model, out, kind, shape=SHAPES[0][1:])
        assert not osp.exists(out)
        export_onnx(model, out, kind, shape=SHAPES[0][1:], dynamic_hw=False)
        shapes = [SHAPES[0], (2,) + SHAPES[0][1:]]
    else:
        export_onnx(model, out, kind, shape=SHAPES[0][1:])
    report = check_onnx(model, out, kind, shapes, rtol=1e-4)
    assert len(report) == len(shapes)
    # the declared shapes (what TensorRT & co. read; ONNX Runtime does not check outputs)
    dims = _declared_dims(out)
    static = cfg_options is not None
    hw = list(SHAPES[0][1:]) if static else ['height', 'width']
    assert dims.pop('img') == ['batch', 3] + hw
    for name, d in dims.items():
        if kind == 'classifier':
            assert d == ['batch', model.head.num_classes], (name, d)
        elif static:  # (the exporter may still leave a Resize's output dims symbolic)
            assert d[0] == 'batch' and f'{name}_height' not in d, (name, d)
        else:
            assert d[0] == 'batch' and d[2:] == [f'{name}_height', f'{name}_width'], (name, d)
    if kind == 'segmentor' and cfg_options is None:  # logits at every input size
        import onnxruntime as ort
        sess = ort.InferenceSession(out, providers=['CPUExecutionProvider'])
        logits = sess.run(None, {'img': torch.rand(2, 3, 50, 66).numpy() * 255})[0]
        assert logits.shape[0] == 2 and logits.shape[2:] == (50, 66)


def _declared_dims(onnx_file):
    """{input or output name: its declared dims, a name (dynamic) or a number each}."""
    import onnx
    graph = onnx.load(onnx_file).graph
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(graph.input) + list(graph.output)}


def test_export_defaults_and_exporter_choice(tmp_path, monkeypatch):
    """export_onnx's defaults (one 512x512 image of pixel values, opset 17) reach the
    exporter; the TorchScript exporter is asked for by name from torch 2.5 (which added
    ``dynamo=``) on."""
    import paca_mm.deployment as deployment
    calls = []

    def export(module, args, f, **kwargs):
        calls.append((args[0], kwargs))
        open(f, 'wb').close()
    monkeypatch.setattr(torch.onnx, 'export', export)
    export_onnx(PaCaViT(arch=ARCH, num_clusters=(4, 4, 4, 0)).eval(),
                str(tmp_path / 'x.onnx'), 'backbone')
    ((example, kwargs), ) = calls
    assert example.shape == (1, 3, 512, 512) and kwargs['opset_version'] == 17
    assert 1 < float(example.max()) <= 255 and float(example.min()) >= 0
    for version, expected in (((2, 4), {}), ((2, 5), {'dynamo': False}),
                              ((2, 14), {'dynamo': False})):
        monkeypatch.setattr(deployment, 'torch_version', lambda: version)
        assert deployment.exporter_kwargs() == expected, version


def test_check_onnx_catches_a_wrong_graph(tmp_path):
    """The ORT check fails when the exported graph differs from the PyTorch model."""
    torch.manual_seed(0)
    model = PaCaViT(arch=ARCH, num_clusters=(4, 4, 4, 0)).eval()
    out = str(tmp_path / 'backbone.onnx')
    export_onnx(model, out, 'backbone', shape=(64, 64))
    with torch.no_grad():
        model.stage4[0].attn.proj.weight.mul_(1.01)  # type: ignore[index]
    with pytest.raises(AssertionError, match=r'feat3 .* differs from PyTorch .*\(> 0\.0001\)'):
        check_onnx(model, out, 'backbone', [(1, 64, 64)])  # default rtol 1e-4
    # the error is relative to the output's scale: twice the output is 0.5 off
    export_onnx(model, out, 'backbone', shape=(64, 64))
    with torch.no_grad():
        model.norm4.weight.mul_(2.)
        model.norm4.bias.mul_(2.)
    report = check_onnx(model, out, 'backbone', [(1, 64, 64)], rtol=0.51)
    assert report[0]['errors']['feat3'] == pytest.approx(0.5, abs=1e-5)


def test_export_errors(tmp_path):
    model = PaCaViT(arch=ARCH, num_clusters=(4, 4, 4, 0)).eval()
    with pytest.raises(ValueError, match="unknown export kind 'detector'"):
        export_onnx(model, str(tmp_path / 'x.onnx'), 'detector')
    with pytest.raises(ValueError, match="kind=segmentor needs an mmseg segmentor.*"
                                         "use kind='backbone'"):
        export_onnx(model, str(tmp_path / 'x.onnx'), 'segmentor')
    with pytest.raises(ValueError, match=r'kind=backbone needs a PaCaViT .*, got Linear$'):
        export_onnx(nn.Linear(2, 2), str(tmp_path / 'x.onnx'), 'backbone')
    assert not list(tmp_path.iterdir())  # nothing written


def test_pytorch2onnx_tool(tmp_path):
    out = tmp_path / 'seg.onnx'
    proc = subprocess.run(
        [sys.executable, osp.join(ROOT, 'tools', 'deployment', 'pytorch2onnx.py'), SEG, 'none',
         '--out', str(out), '--shape', '64', '96', '--check', '2', '45', '70'],
        capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert out.is_file()
    assert 'exported segmentor of pacahead_tiny_synthetic_seg.py' in proc.stdout
    checks = [line for line in proc.stdout.splitlines() if line.startswith('onnxruntime check')]
    assert [c.split(':')[0] for c in checks] == ['onnxruntime check (1, 3, 64, 96)',
                                                 'onnxruntime check (2, 3, 45, 70)']
    bad = subprocess.run(
        [sys.executable, osp.join(ROOT, 'tools', 'deployment', 'pytorch2onnx.py'), SEG, 'none',
         '--out', str(out), '--check', '2', '45'], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and '--check takes N H W triples, got 2 numbers' in bad.stderr


@pytest.mark.parametrize('pool', [nn.AdaptiveAvgPool2d(6), nn.AdaptiveAvgPool2d((2, 3)),
                                  nn.AdaptiveAvgPool2d((None, 4)), nn.AdaptiveMaxPool2d(3)])
@pytest.mark.parametrize('hw', [(7, 11), (16, 16), (3, 5)])
@pytest.mark.parametrize('batched', [True, False])
def test_fixed_size_adaptive_pool_equals_torch(pool, hw, batched):
    """The per-bin pooling that replaces adaptive pooling in a static export equals
    PyTorch's adaptive pooling at sizes that are not multiples of the grid, for (N, C, H, W)
    and (C, H, W) inputs."""
    x = torch.randn(2, 3, *hw) if batched else torch.randn(3, *hw)
    torch.testing.assert_close(_FixedSizeAdaptivePool(pool)(x), pool(x), rtol=1e-6, atol=1e-6)
