"""dev/zoo_benchmark.py and dev/zoo_chart.py on tiny configs: published accuracy read from
the metafiles (both layouts the toolboxes use), one eager round per model, the chart's
front and table (the figures themselves are not asserted)."""
import json
import os.path as osp
import shutil

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_META = """Models:
- Name: tiny_seg
  Results:
    Task: Semantic Segmentation
    Metrics:
      mIoU: 41.5
      mIoU(ms+flip): 42.0
  Config: configs/seg/tools_tiny_seg.py
"""
DET_META = """Collections:
  - Name: tiny
Models:
  - Name: other
    Config: configs/det/other.py
    Results:
      - Task: Object Detection
        Metrics:
          box AP: 1.0
  - Name: tiny_det
    Config: configs/det/image_demo_tiny_mask_rcnn.py
    Results:
      - Task: Object Detection
        Dataset: COCO
        Metrics:
          box AP: 38.2
      - Task: Instance Segmentation
        Dataset: COCO
        Metrics:
          mask AP: 35.1
"""


@pytest.fixture
def zoo_configs(tmp_path):
    """The tiny seg config beside an mmseg-style metafile.yaml (Results a dict), the tiny
    Mask R-CNN beside an mmdet-style metafile.yml (Results a list)."""
    paths = []
    for kind, name, meta, text in (('seg', 'tools_tiny_seg.py', 'metafile.yaml', SEG_META),
                                   ('det', 'image_demo_tiny_mask_rcnn.py', 'metafile.yml',
                                    DET_META)):
        folder = tmp_path / kind
        folder.mkdir()
        shutil.copy(osp.join(ROOT, 'tests', 'data', name), folder / name)
        (folder / meta).write_text(text)
        paths.append(str(folder / name))
    return paths


def test_published_accuracy_from_metafiles(zoo_configs, tmp_path, load_tool):
    zoo = load_tool('dev/zoo_benchmark')
    seg, det = zoo_configs
    assert zoo.published(seg) == {'mIoU': 41.5, 'mIoU(ms+flip)': 42.0}
    assert zoo.published(det) == {'box AP': 38.2, 'mask AP': 35.1}
    # ours and a toolbox's zoo config, as the default model list names them
    assert zoo.published(zoo.resolve(zoo.SEG['PaCa-T + PaCa head']))['mIoU'] == 45.65
    assert zoo.published(zoo.resolve(zoo.DET['Swin-T Mask R-CNN']))['box AP'] == 42.7
    lonely = tmp_path / 'det' / 'not_listed.py'
    shutil.copy(det, lonely)
    with pytest.raises(ValueError, match='no entry whose Config is not_listed.py'):
        zoo.published(str(lonely))
    with pytest.raises(SystemExit, match='no such config file'):
        zoo.resolve('mmseg::segformer/nope.py')


def test_zoo_benchmark_and_chart(zoo_configs, tmp_path, load_tool, capfd):
    zoo = load_tool('dev/zoo_benchmark')
    chart = load_tool('dev/zoo_chart')
    out = tmp_path / 'zoo.json'
    zoo.main([*zoo_configs, '--size', '64x64', '--engine', 'eager', '--rounds', '1',
              '--warmup', '0', '--settle', '0', '--skip-memory', '--threads', '1',
              '--out', str(out)])
    assert 'torch.Size' not in ''.join(capfd.readouterr())  # no per-parameter init log
    data = json.loads(out.read_text())
    seg, det = data['records']
    assert (seg['task'], det['task']) == ('seg', 'det')
    assert seg['published']['mIoU'] == 41.5 and det['published']['box AP'] == 38.2
    assert seg['ms']['logits']['eager'] > 0
    assert det['ms']['backbone+neck']['eager'] > 0 and det['ms']['predict']['eager'] > 0
    assert seg['params_m'] > 0 and seg['gmacs'] > 0 and not seg['errors']
    assert (tmp_path / 'zoo.csv').read_text().count('\n') == 3
    md = chart.main([str(out), '--png', str(tmp_path / 'zoo.png')])
    assert '| tools_tiny_seg | 41.5 |' in md and '| image_demo_tiny_mask_rcnn | 38.2 | 35.1 |' in md
    assert (tmp_path / 'zoo.png').stat().st_size > 0


def test_detector_keeps_max_per_img_boxes(zoo_configs, load_tool):
    """With random weights every score is below the configs' threshold: the harness sets it
    to 0 so predict does the work of a busy image (max_per_img boxes and masks)."""
    zoo = load_tool('dev/zoo_benchmark')
    config = zoo_configs[1]
    with open(config) as f:
        text = f.read()
    assert 'score_thr=0.05' in text
    with open(config, 'w') as f:  # no random score passes this one
        f.write(text.replace('score_thr=0.05', 'score_thr=0.999'))
    model, task = zoo.build(config, 'cpu')
    assert task == 'det'
    with torch.no_grad():
        res = zoo.det_predict(model, (64, 64), 'cpu')(torch.rand(1, 3, 64, 64) * 255)
    assert len(res[0].pred_instances) == 20  # the config's max_per_img


def test_front_gaps(load_tool):
    chart = load_tool('dev/zoo_chart')
    gaps = chart.front_gaps([('a', 10., 40.), ('b', 20., 45.), ('c', 30., 44.),
                             ('d', 40., 45.)])
    # c: b is faster and more accurate; d: b is as accurate and faster
    assert gaps == {'a': 1.0, 'b': 1.0, 'c': 1.5, 'd': 2.0}


def test_profile_by_op_type_eager_and_onnxruntime(zoo_configs, tmp_path, load_tool):
    """``--profile``: op types of the eager run (torch.profiler) and of the ONNX Runtime run
    (its trace); the ORT node times of one run add up to most of that run's own time (not
    more: a second run or the session set-up counted in would exceed it)."""
    pytest.importorskip('onnxruntime')
    zoo = load_tool('dev/zoo_benchmark')
    out = tmp_path / 'zoo.json'
    # 128x128: at 64x64 the executor's few microseconds between nodes are a third of the run
    zoo.main([zoo_configs[0], '--size', '128x128', '--engine', 'eager', 'onnxruntime',
              '--rounds', '1', '--warmup', '0', '--settle', '0', '--skip-memory',
              '--threads', '1', '--profile', '1000', '--out', str(out)])
    rec = json.loads(out.read_text())['records'][0]
    assert not rec['errors']
    eager, ort = rec['profile']['logits']['eager'], rec['profile']['logits']['onnxruntime']
    assert any(op.startswith('aten::') for op, _, _ in eager['ops'])
    names = [op for op, _, _ in ort['ops']]
    assert {'Conv', 'MatMul', 'Softmax'} <= set(names) and len(names) == len(set(names))
    assert all(ms > 0 and share == pytest.approx(ms / ort['ms']) for _, ms, share in ort['ops'])
    assert 0.5 * ort['ms'] < sum(ms for _, ms, _ in ort['ops']) <= ort['ms'] * 1.001
    md = load_tool('dev/zoo_chart').main([str(out)])
    assert '- tools_tiny_seg, logits, onnxruntime, top op types by time: ' in md
    top = zoo.top_ops({'a': 1., 'b': 3., 'c': 2.}, 8., 2)
    assert top == dict(ms=8., ops=[['b', 3., 0.375], ['c', 2., 0.25]])
