"""Cluster explainer (paper Sec. 3.3): heatmaps of the learned clusters and the
positive/negative cluster groups of a classifier."""
from .cluster_explainer import (ClusterGroups, analyze_cluster_groups, check_stage,
                                classify, cluster_heatmaps, cluster_masks, find_backbone,
                                stage_cluster_logits)
from .drawing import (group_figure, heatmap_grid, make_grid, overlay_heatmap, save_image,
                      to_bgr_image)
from .explain import explain_image
from .inference import model_kind, normalize_inputs

__all__ = [
    'ClusterGroups', 'analyze_cluster_groups', 'check_stage', 'classify', 'cluster_heatmaps',
    'cluster_masks', 'find_backbone', 'model_kind', 'normalize_inputs',
    'stage_cluster_logits', 'group_figure', 'heatmap_grid', 'make_grid', 'overlay_heatmap',
    'save_image', 'to_bgr_image', 'explain_image'
]
