"""Write the cluster explainer's figures for one image (used by tools/visualize_clusters.py)."""
import json
import os.path as osp
from typing import Dict, List, Optional

import torch
import torch.nn as nn

from ..fileio import atomic_write
from .cluster_explainer import (analyze_cluster_groups, cluster_heatmaps,
                                stage_cluster_logits)
from .drawing import (group_figure, heatmap_grid, overlay_heatmap, put_label, save_image,
                      to_bgr_image)


def explain_image(model: nn.Module, raw: torch.Tensor, out_dir: str, stage: int = 3,
                  groups: bool = False, topk: int = 5, label: Optional[int] = None,
                  tile: int = 128, per_cluster: bool = True, batch_size: int = 16,
                  class_names: Optional[List[str]] = None) -> Dict[str, object]:
    """Write into ``out_dir`` the heatmaps of one (3, H, W) raw image at the network input
    size, ``stage{s}_heatmaps.png`` (a grid), with ``per_cluster`` one
    ``stage{s}_clusters/cluster_XXX.png`` per cluster, and with ``groups`` (classifiers only)
    the positive/negative groups ``stage{s}_groups.png`` / ``.json`` (top ``topk`` each) of
    ``label`` (None: the prediction). Returns the paths, ``result`` (ClusterGroups or None)
    and ``logits`` (M, h, w)."""
    image = to_bgr_image(raw)
    logits = stage_cluster_logits(model, raw, stage)[0].cpu()  # (M, h, w)
    heat = cluster_heatmaps(logits)
    out = dict(logits=logits, clusters=[], groups=None, summary=None, result=None)
    out['heatmaps'] = save_image(osp.join(out_dir, f'stage{stage}_heatmaps.png'),
                                 heatmap_grid(image, heat, tile=tile))
    if per_cluster:
        folder = osp.join(out_dir, f'stage{stage}_clusters')
        for m in range(heat.shape[0]):
            img = put_label(overlay_heatmap(image, heat[m].numpy()), f'stage {stage} #{m}')
            out['clusters'].append(save_image(osp.join(folder, f'cluster_{m:03d}.png'), img))
    if groups:
        result = analyze_cluster_groups(model, raw, stage, label, batch_size, class_names)
        out['result'] = result
        out['groups'] = save_image(osp.join(out_dir, f'stage{stage}_groups.png'),
                                   group_figure(image, result, topk=topk, tile=tile))
        out['summary'] = osp.join(out_dir, f'stage{stage}_groups.json')
        atomic_write(json.dumps(result.summary(), indent=1), out['summary'])
    return out
