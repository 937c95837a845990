"""Single-image inference + drawing with the toolboxes' own APIs and visualizers: mmdet's
``inference_detector`` + ``DetLocalVisualizer``, mmseg's ``inference_model`` +
``SegLocalVisualizer``, mmpretrain: the test pipeline + ``UniversalVisualizer``."""
import itertools
import os
import os.path as osp
from typing import Optional

import numpy as np
import torch

from ..registry import get_scope
from .drawing import save_image
from .inference import build_model, load_image

_COUNTER = itertools.count()


def _unique_name(prefix: str) -> str:
    # mmengine visualizers are named singletons; a fresh name per call avoids reusing one
    return f'{prefix}_{os.getpid()}_{next(_COUNTER)}'


def _read_rgb(image: str) -> np.ndarray:
    import mmcv
    if not osp.isfile(image):
        raise FileNotFoundError(f'image not found: {image!r}')
    return mmcv.imread(image, channel_order='rgb')


def _palette(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [tuple(int(c) for c in rng.integers(0, 256, size=3)) for _ in range(n)]


def run_image_demo(config, checkpoint: Optional[str], image: str, out_file: str,
                   device: str = 'cpu', score_thr: float = 0.3, topk: int = 5,
                   cfg_options: Optional[dict] = None, trust: bool = False) -> dict:
    """Predict on ``image`` and write the painted result to ``out_file`` (atomically).
    Returns dict(task='det'|'seg'|'cls', out_file=..., result=<DataSample or probs>), plus
    ``top`` [(class, prob)] for classification and ``num_instances`` (above ``score_thr``)
    for detection. ``trust``: see :func:`~paca_mm.visualization.inference.build_model`."""
    model = build_model(config, checkpoint, device, cfg_options, trust=trust)
    scope = get_scope(model.cfg)
    meta = dict(model.dataset_meta or {})
    if scope == 'mmdet':
        from mmdet.apis import inference_detector
        from mmdet.visualization import DetLocalVisualizer
        result = inference_detector(model, image)
        vis = DetLocalVisualizer(name=_unique_name('paca_det_demo'))
        vis.dataset_meta = meta
        n = int((result.pred_instances.scores > score_thr).sum())  # as drawn
        extra, out = dict(pred_score_thr=score_thr), dict(task='det', num_instances=n)
    elif scope == 'mmseg':
        from mmseg.apis import inference_model
        from mmseg.visualization import SegLocalVisualizer
        result = inference_model(model, image)
        num_classes = getattr(getattr(model, 'decode_head', None), 'num_classes', None)
        classes = meta.get('classes') or [str(i) for i in range(num_classes or 256)]
        vis = SegLocalVisualizer(name=_unique_name('paca_seg_demo'), alpha=0.5)
        vis.set_dataset_meta(classes=classes, palette=meta.get('palette') or _palette(len(classes)))
        extra, out = {}, dict(task='seg')
    if scope != 'mmpretrain':
        vis.add_datasample('result', _read_rgb(image), data_sample=result, draw_gt=False,
                           show=False, **extra)
        save_image(out_file, vis.get_image()[..., ::-1])
        return dict(out, out_file=out_file, result=result)
    # mmpretrain
    from mmpretrain.structures import DataSample
    from mmpretrain.visualization import UniversalVisualizer

    from .cluster_explainer import classify
    probs = classify(model, load_image(model.cfg, image)[None])[0]
    classes = list(meta['classes']) if meta.get('classes') else None
    sample = DataSample().set_pred_score(probs).set_pred_label(int(probs.argmax()))
    vis = UniversalVisualizer(name=_unique_name('paca_cls_demo'))
    drawn = vis.visualize_cls(_read_rgb(image), sample, classes=classes, draw_gt=False,
                              show=False)
    save_image(out_file, drawn[..., ::-1])
    k = min(topk, probs.numel())
    vals, idx = torch.topk(probs, k)
    top = [(classes[i] if classes else int(i), float(v)) for v, i in zip(vals, idx.tolist())]
    return dict(task='cls', out_file=out_file, result=probs, top=top)
