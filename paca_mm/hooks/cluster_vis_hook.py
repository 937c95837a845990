"""``PaCaClusterVisHook``: cluster heatmaps of a fixed image during training."""
import os.path as osp
from typing import Optional, Union

import torch
from mmengine.dist import master_only
from mmengine.hooks import Hook

from ..visualization.cluster_explainer import (check_stage, cluster_heatmaps,
                                               find_backbone, stage_cluster_logits)
from ..visualization.drawing import heatmap_grid, save_image, to_bgr_image


class PaCaClusterVisHook(Hook):
    """Every ``interval`` training iterations (and after the last), draw the M cluster
    heatmaps (sigmoid of the pre-softmax assignment, paper Sec. 3.3) of one stage for a
    fixed image; only the main process draws.

    The grid (input + one overlay per cluster, ``tile`` pixels each) goes to
    ``<out_dir or work_dir/cluster_vis>/iter_XXXXXX_stage{s}.png`` and, with
    ``add_to_visualizer``, to the runner's visualizer (``cluster_heatmaps_stage{s}``).
    ``image``: a path (prepared by ``paca_mm.visualization.inference.load_image``), or None
    for the first validation sample. ``stage``: 1-based (default 3, as in the paper).
    """
    priority = 'LOW'

    def __init__(self, interval: int = 500, image: Optional[str] = None, stage: int = 3,
                 out_dir: Optional[str] = None, tile: int = 96,
                 add_to_visualizer: bool = True):
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f'interval must be a positive int, got {interval!r}')
        if image is not None and not isinstance(image, str):
            raise TypeError(f'image must be a file path or None, got {type(image).__name__}')
        self.interval = interval
        self.image = image
        self.stage = stage
        self.out_dir = out_dir
        self.tile = tile
        self.add_to_visualizer = add_to_visualizer
        self._raw: Optional[torch.Tensor] = None
        self.written = []  # paths of the PNGs written so far

    def before_train(self, runner) -> None:
        check_stage(find_backbone(runner.model), self.stage)
        if self.out_dir is None:
            self.out_dir = osp.join(runner.work_dir, 'cluster_vis')
        if self.image is not None:
            from ..visualization.inference import load_image
            self._raw = load_image(runner.cfg, self.image)
        else:
            self._raw = self._first_val_image(runner)

    @staticmethod
    def _first_val_image(runner) -> torch.Tensor:
        loop = runner.val_loop
        if loop is None:
            raise ValueError('PaCaClusterVisHook(image=None) uses the first validation sample, '
                             'but the config has no val_dataloader; pass image=PATH')
        sample = loop.dataloader.dataset[0]
        raw = sample['inputs'] if isinstance(sample, dict) else None
        if isinstance(raw, (list, tuple)):  # test-time augmentation: take the first view
            raw = raw[0]
        if not torch.is_tensor(raw) or raw.dim() != 3:
            raise ValueError('PaCaClusterVisHook: the first validation sample has no (3, H, W) '
                             f"'inputs' tensor (got {type(raw).__name__}); pass image=PATH")
        return raw.float()

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs=None) -> None:
        if self.every_n_train_iters(runner, self.interval) or self.is_last_train_iter(runner):
            self.draw(runner, runner.iter + 1)

    @master_only
    def draw(self, runner, step: int) -> Union[str, None]:
        """Draw the heatmaps now (``step`` names the file); returns the PNG path."""
        if self._raw is None:
            self.before_train(runner)
        logits = stage_cluster_logits(runner.model, self._raw, self.stage)[0].cpu()
        grid = heatmap_grid(to_bgr_image(self._raw), cluster_heatmaps(logits), tile=self.tile)
        path = save_image(osp.join(self.out_dir, f'iter_{step:06d}_stage{self.stage}.png'),
                          grid)
        self.written.append(path)
        if self.add_to_visualizer and getattr(runner, 'visualizer', None) is not None:
            runner.visualizer.add_image(f'cluster_heatmaps_stage{self.stage}',
                                        grid[..., ::-1].copy(), step=step)
        return path

