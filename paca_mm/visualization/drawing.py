"""Rendering of cluster heatmaps and of the positive/negative group figure. All images here
are (H, W, 3) uint8 **BGR** numpy arrays (cv2 convention; ``img[..., ::-1]`` for RGB)."""
import os.path as osp
from typing import Optional, Sequence

import numpy as np
import torch

from ..fileio import atomic_write

_FONT = 0  # cv2.FONT_HERSHEY_SIMPLEX


def to_bgr_image(raw) -> np.ndarray:
    """(3, H, W) tensor/array of BGR pixels in [0, 255] -> (H, W, 3) uint8 BGR."""
    raw = np.asarray(raw.detach().float().cpu() if torch.is_tensor(raw) else raw)
    if raw.ndim != 3 or raw.shape[0] not in (1, 3):
        raise ValueError(f'expected a (3, H, W) image, got shape {raw.shape}')
    img = np.clip(raw, 0, 255).astype(np.uint8).transpose(1, 2, 0)
    return np.ascontiguousarray(np.repeat(img, 3, axis=2) if img.shape[2] == 1 else img)


def overlay_heatmap(image: np.ndarray, heat: np.ndarray, alpha: float = 0.5,
                    normalize: bool = True) -> np.ndarray:
    """Blend a (h, w) heatmap as JET colours, bilinearly resized, over a (H, W, 3) uint8 BGR
    image. ``normalize``: min-max normalise the map to [0, 1] (a constant map gives zeros),
    else clip it to [0, 1]."""
    import cv2
    heat = np.asarray(heat, dtype=np.float32)
    lo, hi = float(heat.min()), float(heat.max())
    if normalize:
        heat = (heat - lo) / (hi - lo) if hi > lo else np.zeros_like(heat)
    heat = cv2.resize(np.clip(heat, 0, 1), (image.shape[1], image.shape[0]),
                      interpolation=cv2.INTER_LINEAR)
    colour = cv2.applyColorMap(np.clip(heat * 255, 0, 255).astype(np.uint8), cv2.COLORMAP_JET)
    return cv2.addWeighted(image, 1 - alpha, colour, alpha, 0)


def put_label(img: np.ndarray, text: str, scale: Optional[float] = None,
              colour=(255, 255, 255), bg=(0, 0, 0), bottom: bool = False) -> np.ndarray:
    """Write ``text`` on a filled bar at the top (or bottom) left of ``img``, in place."""
    import cv2
    scale = scale or max(0.3, min(img.shape[:2]) / 320)
    thick = 1 if scale < 0.8 else 2
    (tw, th), base = cv2.getTextSize(text, _FONT, scale, thick)
    y0 = img.shape[0] - (th + base + 4) if bottom else 0
    cv2.rectangle(img, (0, y0), (min(img.shape[1] - 1, tw + 4), y0 + th + base + 4), bg, -1)
    cv2.putText(img, text, (2, y0 + th + 2), _FONT, scale, colour, thick, cv2.LINE_AA)
    return img


def resize_tile(img: np.ndarray, tile: int) -> np.ndarray:
    """Resize keeping the aspect ratio so that the longer side is ``tile``; pad to square."""
    import cv2
    h, w = img.shape[:2]
    s = tile / max(h, w)
    nh, nw = max(1, round(h * s)), max(1, round(w * s))
    out = np.full((tile, tile, 3), 255, np.uint8)
    out[:nh, :nw] = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_AREA if s < 1
                               else cv2.INTER_NEAREST)
    return out


def make_grid(tiles: Sequence[np.ndarray], ncols: int, pad: int = 2,
              bg: int = 255) -> np.ndarray:
    """Arrange equally sized (t, t, 3) tiles row-major into a grid with ``pad`` pixels."""
    if not tiles:
        raise ValueError('make_grid needs at least one tile')
    th, tw = tiles[0].shape[:2]
    ncols = max(1, min(ncols, len(tiles)))
    nrows = (len(tiles) + ncols - 1) // ncols
    grid = np.full((nrows * (th + pad) + pad, ncols * (tw + pad) + pad, 3), bg, np.uint8)
    for i, t in enumerate(tiles):
        r, c = divmod(i, ncols)
        y, x = pad + r * (th + pad), pad + c * (tw + pad)
        grid[y:y + th, x:x + tw] = t
    return grid


def heatmap_grid(image: np.ndarray, heatmaps, tile: int = 128, ncols: Optional[int] = None,
                 alpha: float = 0.5, normalize: bool = True) -> np.ndarray:
    """The image followed by an overlay (:func:`overlay_heatmap`) of each of the (M, h, w)
    heatmaps (tensor or array), labelled ``#m``."""
    heatmaps = heatmaps.detach().float().cpu().numpy() if torch.is_tensor(heatmaps) \
        else np.asarray(heatmaps)
    tiles = [put_label(resize_tile(image, tile), 'input')]
    for m, heat in enumerate(heatmaps):
        tiles.append(put_label(resize_tile(overlay_heatmap(image, heat, alpha, normalize),
                                           tile), f'#{m}'))
    ncols = ncols or int(np.ceil(np.sqrt(len(tiles))))
    return make_grid(tiles, ncols)


def _caption(text: str, height: int, width: int, scale: Optional[float] = None) -> np.ndarray:
    """Black ``text`` on a white (height, width) image."""
    img = np.full((height, width, 3), 255, np.uint8)
    return put_label(img, text, scale, colour=(0, 0, 0), bg=(255, 255, 255))


def _pad_width(img: np.ndarray, width: int) -> np.ndarray:
    return np.pad(img, ((0, 0), (0, max(0, width - img.shape[1])), (0, 0)), constant_values=255)


def group_figure(image: np.ndarray, groups, topk: int = 5, tile: int = 160) -> np.ndarray:
    """Figure like paper Fig. 6/9 of a :class:`~paca_mm.visualization.ClusterGroups` of
    ``image``: the input, then the top-k masked images of the positive and of the negative
    group, each tile showing the cluster id and P(ground truth)."""
    ncols = max(1, topk)
    width = ncols * (tile + 2) + 2
    gt = groups.class_name(groups.label)
    src = 'label' if groups.label_given else 'predicted'
    head = put_label(resize_tile(image, tile), f'input p={groups.base_prob:.2f}')
    rows = [_caption(f'stage {groups.stage} | {src} class: {gt}', 24, width, scale=0.6),
            _pad_width(make_grid([head], 1), width)]
    img = image.astype(np.float32)
    for title, members in (('positive', groups.positive), ('negative', groups.negative)):
        rows.append(_caption(f'{title}: {len(members)} of {groups.probs.numel()} clusters',
                             24, width, scale=0.6))
        tiles = []
        for m in members[:topk]:
            mask = groups.masks[m].cpu().numpy().astype(np.float32)[..., None]
            masked = (img * mask).astype(np.uint8)
            t = put_label(resize_tile(masked, tile), f'#{m} p={float(groups.probs[m]):.2f}')
            if title == 'negative':
                put_label(t, f'pred: {groups.class_name(int(groups.preds[m]))}', bottom=True)
            tiles.append(t)
        rows.append(_pad_width(make_grid(tiles or [_caption('(empty)', tile, tile)], ncols),
                               width))
    return np.concatenate(rows, axis=0)


def save_image(path: str, img: np.ndarray) -> str:
    """Write a BGR uint8 image (format by extension, e.g. PNG) atomically
    (:func:`paca_mm.fileio.atomic_write`); creates folders; returns the path."""
    import cv2
    ok, encoded = cv2.imencode(osp.splitext(path)[1] or '.png', img)
    if not ok:
        raise OSError(f'could not encode image {path!r}')
    atomic_write(encoded.tobytes(), path)
    return path
