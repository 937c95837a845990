"""Flip / multi-scale test-time augmentation of Mask R-CNN boxes *and* masks.

mmdet's ``DetTTAModel`` merges boxes only (it refuses instance masks). This model merges
the boxes the same way, then predicts the masks of the merged boxes on every view and
averages them, as Detectron2's ``GeneralizedRCNNWithTTA`` does.
"""
from typing import List

import torch
from mmdet.models.test_time_augs import DetTTAModel
from mmdet.structures.bbox import bbox2roi, bbox_flip
from torch import Tensor

_FLIP_DIMS = {'horizontal': [-1], 'vertical': [-2], 'diagonal': [-2, -1]}


class MaskRCNNTTAModel(DetTTAModel):
    """Test-time augmentation of a two-stage detector with a mask head (``module``:
    e.g. ``MaskRCNN``) over the views of ``TestTimeAug`` (resize and flip only; the
    views' ``PackDetInputs`` must keep the ``flip`` and ``flip_direction`` meta keys).

    For each image, with V views and RoI mask size M (28):

    1. every view runs the backbone, the RPN and the box head; its boxes (n_v, 4) are
       mapped back to the original image (unscaled and unflipped), and the V sets are
       merged per class with NMS (``tta_cfg.nms``, ``tta_cfg.max_per_img``), exactly as
       ``DetTTAModel`` does -> N boxes (N, 4) with scores (N,) and labels (N,);
    2. the N merged boxes are mapped into each view (flipped, then scaled by its
       ``scale_factor``) and the mask head predicts on that view's features:
       probabilities (N, C, M, M) (C = 1 when class-agnostic), flipped back for flipped
       views;
    3. the V probability maps are averaged, pasted into the original image and
       thresholded at ``test_cfg.rcnn.mask_thr_binary`` -> masks (N, H, W) bool.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if not (getattr(self.module, 'with_rpn', False) and self.module.roi_head.with_mask):
            raise ValueError(f'MaskRCNNTTAModel needs a two-stage detector with an RPN and a '
                             f'mask head (e.g. MaskRCNN), got {type(self.module).__name__}; '
                             'use DetTTAModel for detectors without masks')

    def test_step(self, data: dict) -> list:
        det = self.module
        views = [{k: v[i] for k, v in data.items()} for i in range(len(data['inputs']))]
        feats, samples = [], []
        for view in views:  # 1. boxes of every view, in original image coordinates
            view = det.data_preprocessor(view, False)
            x = det.extract_feat(view['inputs'])
            metas = [s.metainfo for s in view['data_samples']]
            rpn = det.rpn_head.predict(x, view['data_samples'], rescale=False)
            boxes = det.roi_head.predict_bbox(x, metas, rpn, det.roi_head.test_cfg,
                                              rescale=True)
            for sample, pred in zip(view['data_samples'], boxes):
                sample.pred_instances = pred
            feats.append(x)
            samples.append(view['data_samples'])
        merged = self.merge_preds(list(zip(*samples)))  # DetTTAModel: NMS across views
        num = [len(s.pred_instances) for s in merged]
        probs = torch.zeros(0)
        if sum(num):  # 2. mask probabilities of the merged boxes on every view
            probs = sum(self._view_masks(x, merged, view_samples, num)
                        for x, view_samples in zip(feats, samples)) / len(feats)
        metas = [dict(ori_shape=s.ori_shape, scale_factor=(1., 1.)) for s in merged]
        results = det.roi_head.mask_head.predict_by_feat(  # 3. paste, threshold
            probs.split(num), [s.pred_instances for s in merged], metas,
            det.roi_head.test_cfg, rescale=True, activate_map=True)
        for sample, result in zip(merged, results):
            sample.pred_instances = result
        return merged

    def _view_masks(self, x: tuple, merged: list, view_samples: list,
                    num: List[int]) -> Tensor:
        """Mask probabilities (N, C, M, M) of the merged boxes on one view."""
        boxes = []
        for sample, view in zip(merged, view_samples):
            b, meta = sample.pred_instances.bboxes, view.metainfo
            if meta.get('flip'):
                b = bbox_flip(b, meta['ori_shape'], meta['flip_direction'])
            boxes.append(b * b.new_tensor(meta['scale_factor']).repeat(2))
        probs = self.module.roi_head._mask_forward(x, bbox2roi(boxes))['mask_preds'].sigmoid()
        return torch.cat([p.flip(_FLIP_DIMS[v.flip_direction]) if v.metainfo.get('flip')
                          else p for p, v in zip(probs.split(num), view_samples)])
