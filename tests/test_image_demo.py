"""tools/image_demo.py: detection, segmentation and classification with random tiny models
saved to checkpoints (the tool must load them: its predictions equal the saved model's)."""
import glob
import os.path as osp

import numpy as np
import pytest
import torch

cv2 = pytest.importorskip('cv2')

import paca_mm  # noqa: E402,F401
from paca_mm.visualization.inference import build_model  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_CFG = osp.join(ROOT, 'demo', 'configs', 'pacahead_tiny_synthetic_seg.py')
CLS_CFG = osp.join(ROOT, 'demo', 'configs', 'paca_tiny_synthetic_cls.py')
OWN_DET_CFG = osp.join(ROOT, 'tests', 'data', 'image_demo_tiny_mask_rcnn.py')


def _det_cfg():
    """The detection demo config of demo/configs if there is one, else the test's own."""
    found = sorted(f for f in glob.glob(osp.join(ROOT, 'demo', 'configs', '*.py'))
                   if 'rcnn' in osp.basename(f) or 'coco' in osp.basename(f))
    return found[0] if found else OWN_DET_CFG


def _image(path, h, w, seed=0):
    """A dark noisy image with a bright disc and square (BGR, written as PNG)."""
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 60, size=(h, w, 3)).astype(np.uint8)
    cv2.circle(img, (w // 3, h // 2), min(h, w) // 5, (40, 40, 230), -1)
    cv2.rectangle(img, (w // 2, h // 4), (w // 2 + w // 5, h // 4 + h // 4), (40, 200, 40), -1)
    cv2.imwrite(path, img)
    return img


def _save(model, path, meta):
    torch.save({'state_dict': model.state_dict(), 'meta': {'dataset_meta': meta}}, path)


def _check_png(path, shape):
    assert osp.isfile(path) and osp.getsize(path) > 100
    img = cv2.imread(path)
    assert img is not None and img.shape[:2] == shape
    return img


@pytest.fixture
def atomic_writes(monkeypatch):
    """The paths written through paca_mm.fileio.atomic_write by the drawing helper."""
    from paca_mm.visualization import drawing
    paths, real = [], drawing.atomic_write
    monkeypatch.setattr(drawing, 'atomic_write', lambda data, path: (paths.append(path),
                                                                      real(data, path)))
    return paths


def test_image_demo_segmentation(tmp_path, load_tool, atomic_writes):
    pytest.importorskip('mmseg')
    from mmseg.apis import inference_model
    torch.manual_seed(0)
    model = build_model(SEG_CFG, None)
    classes = ('background', 'disc', 'square', 'triangle')
    palette = [[120, 120, 120], [220, 20, 60], [0, 90, 255], [0, 190, 60]]
    ckpt = str(tmp_path / 'seg.pth')
    _save(model, ckpt, dict(classes=classes, palette=palette))
    img_path = str(tmp_path / 'img.png')
    img = _image(img_path, 96, 128)
    out_file = str(tmp_path / 'out' / 'seg.png')
    out = load_tool('image_demo').main([SEG_CFG, ckpt, img_path, '--out', out_file])
    assert out['task'] == 'seg' and atomic_writes == [out_file]
    drawn = _check_png(out_file, img.shape[:2])
    assert not np.array_equal(drawn, img)  # the colourised map was blended in
    pred = out['result'].pred_sem_seg.data
    assert pred.shape == (1, 96, 128) and int(pred.max()) < len(classes)
    # the tool's model is the saved one
    ref = inference_model(model, img_path)
    torch.testing.assert_close(out['result'].seg_logits.data, ref.seg_logits.data)


def test_image_demo_segmentation_names_and_colours(tmp_path, monkeypatch):
    """The visualizer gets the checkpoint's classes and palette; without any, one name per
    class of the head ('0', '1', ...) and a fixed palette of RGB triples."""
    from mmseg.visualization import SegLocalVisualizer

    import paca_mm.visualization.image_demo as demo
    seen = []
    real = SegLocalVisualizer.set_dataset_meta

    def spy(self, *args, **kwargs):
        if kwargs:  # run_image_demo's call (mmseg's __init__ passes positional Nones)
            seen.append(kwargs)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(SegLocalVisualizer, 'set_dataset_meta', spy)
    drawn, get_image = [], SegLocalVisualizer.get_image
    monkeypatch.setattr(SegLocalVisualizer, 'get_image',
                        lambda self: drawn.append(get_image(self)) or drawn[-1])
    torch.manual_seed(0)
    model = build_model(SEG_CFG, None)
    img_path = str(tmp_path / 'img.png')
    _image(img_path, 64, 64)
    ckpt = str(tmp_path / 'seg.pth')
    classes, palette = ('a', 'b', 'c', 'd'), [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]]
    _save(model, ckpt, dict(classes=classes, palette=palette))
    demo.run_image_demo(SEG_CFG, ckpt, img_path, str(tmp_path / 'o.png'))
    assert seen[-1] == dict(classes=classes, palette=palette)
    # the visualizer draws RGB; the file is BGR (cv2)
    assert np.array_equal(cv2.imread(str(tmp_path / 'o.png')), drawn[-1][..., ::-1])
    real_build = demo.build_model

    def build_without_meta(*args, **kwargs):
        built = real_build(*args, **kwargs)
        built.dataset_meta = {}
        return built
    monkeypatch.setattr(demo, 'build_model', build_without_meta)
    demo.run_image_demo(SEG_CFG, None, img_path, str(tmp_path / 'o.png'))
    num_classes = model.decode_head.num_classes
    assert seen[-1] == dict(classes=[str(i) for i in range(num_classes)],
                            palette=demo._palette(num_classes))
    assert demo._palette(3) == demo._palette(3) and len(demo._palette(5)) == 5
    assert all(len(c) == 3 and all(0 <= v <= 255 for v in c) for c in demo._palette(50))


def test_image_demo_detection(tmp_path, load_tool, atomic_writes):
    pytest.importorskip('mmdet')
    from mmdet.apis import inference_detector
    cfg = _det_cfg()
    torch.manual_seed(0)
    model = build_model(cfg, None)
    ckpt = str(tmp_path / 'det.pth')
    _save(model, ckpt, dict(classes=('circle', 'square', 'triangle')))
    img_path = str(tmp_path / 'img.png')
    img = _image(img_path, 112, 144, seed=1)
    out_file = str(tmp_path / 'det.png')
    out = load_tool('image_demo').main([cfg, ckpt, img_path, '--out', out_file, '--score-thr', '0'])
    assert out['task'] == 'det' and atomic_writes == [out_file]
    drawn = _check_png(out_file, img.shape[:2])
    inst = out['result'].pred_instances
    assert out['num_instances'] == len(inst) > 0
    assert not np.array_equal(drawn, img)  # boxes/masks drawn
    assert float(inst.bboxes[:, 2].max()) <= 144 + 1e-3
    assert float(inst.bboxes[:, 3].max()) <= 112 + 1e-3
    assert inst.masks.shape[1:] == (112, 144)
    ref = inference_detector(model, img_path).pred_instances
    torch.testing.assert_close(inst.scores, ref.scores)
    torch.testing.assert_close(inst.bboxes, ref.bboxes)
    # num_instances counts what mmdet's visualizer draws: scores > score_thr (default 0.3)
    from paca_mm.visualization.image_demo import run_image_demo
    scores = sorted(inst.scores.tolist(), reverse=True)
    thr = scores[1]
    out = run_image_demo(cfg, ckpt, img_path, out_file, score_thr=thr)
    assert out['num_instances'] == sum(s > thr for s in scores) == 1
    from mmdet.visualization import DetLocalVisualizer
    drawn_thr, add = [], DetLocalVisualizer.add_datasample

    def spy(self, *args, **kwargs):
        drawn_thr.append(kwargs['pred_score_thr'])
        return add(self, *args, **kwargs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DetLocalVisualizer, 'add_datasample', spy)
        out = run_image_demo(cfg, ckpt, img_path, out_file)
    assert out['num_instances'] == sum(s > 0.3 for s in scores) and drawn_thr == [0.3]


def test_image_demo_classification(tmp_path, load_tool, atomic_writes):
    pytest.importorskip('mmpretrain')
    from paca_mm.visualization import classify
    from paca_mm.visualization.inference import load_image
    torch.manual_seed(0)
    model = build_model(CLS_CFG, None)
    ckpt = str(tmp_path / 'cls.pth')
    _save(model, ckpt, dict(classes=('c0', 'c1', 'c2', 'c3')))
    img_path = str(tmp_path / 'img.png')
    img = _image(img_path, 64, 64, seed=2)
    out_file = str(tmp_path / 'cls.png')
    out = load_tool('image_demo').main([CLS_CFG, ckpt, img_path, '--out', out_file, '--topk', '3'])
    assert out['task'] == 'cls' and atomic_writes == [out_file]
    drawn = _check_png(out_file, img.shape[:2])
    # outside the printed text the image is the input, in its own channel order
    assert (drawn == img).all(axis=2).mean() > 0.2  # 0.36 on the torch 2.1 stack; ~0.02 if flipped
    ref = classify(model, load_image(model.cfg, img_path)[None])[0]
    torch.testing.assert_close(out['result'], ref)
    assert [c for c, _ in out['top']] == [f'c{i}' for i in ref.argsort(descending=True)[:3]]
    assert sum(p for _, p in out['top']) <= 1.0 + 1e-6


def test_image_demo_errors(tmp_path, load_tool):
    with pytest.raises(FileNotFoundError):
        load_tool('image_demo').main([CLS_CFG, 'none', str(tmp_path / 'missing.png'), '--out',
                      str(tmp_path / 'x.png')])
