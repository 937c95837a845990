"""paca_mm.visualization.drawing: the pixels of the heatmap and group figures (BGR uint8),
against independent cv2/numpy computations."""
import cv2
import numpy as np
import pytest
import torch

from paca_mm.visualization import ClusterGroups
from paca_mm.visualization.drawing import (group_figure, heatmap_grid, make_grid,
                                           overlay_heatmap, put_label, resize_tile,
                                           save_image, to_bgr_image)


def _image(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_to_bgr_image_clips_transposes_and_repeats_gray():
    raw = torch.tensor([[[-5., 300.], [7.6, 255.]]] * 3) + torch.tensor([0., 1., 2.])[:, None,
                                                                                     None]
    img = to_bgr_image(raw)
    assert img.dtype == np.uint8 and img.shape == (2, 2, 3) and img.flags['C_CONTIGUOUS']
    assert img[..., 0].tolist() == [[0, 255], [7, 255]]
    assert img[0, 0].tolist() == [0, 0, 0] and img[1, 0].tolist() == [7, 8, 9]
    gray = to_bgr_image(np.full((1, 3, 4), 9.))
    assert gray.shape == (3, 4, 3) and (gray == 9).all()
    for bad in (np.zeros((2, 3, 4)), np.zeros((3, 4)), np.zeros((1, 3, 3, 4))):
        with pytest.raises(ValueError, match=r'expected a \(3, H, W\) image'):
            to_bgr_image(bad)


def test_overlay_heatmap_is_min_max_jet_blended_half():
    image = _image(6, 8)
    heat = np.array([[1., 3.], [5., 9.]])
    norm = cv2.resize(((heat - 1) / 8).astype(np.float32), (8, 6),
                      interpolation=cv2.INTER_LINEAR)
    jet = cv2.applyColorMap((norm * 255).astype(np.uint8), cv2.COLORMAP_JET)
    assert np.array_equal(overlay_heatmap(image, heat),  # defaults: alpha 0.5, normalised
                          cv2.addWeighted(image, 0.5, jet, 0.5, 0))
    zero = cv2.applyColorMap(np.zeros((6, 8), np.uint8), cv2.COLORMAP_JET)
    assert np.array_equal(overlay_heatmap(image, np.full((2, 2), 4.)),  # constant: zeros
                          cv2.addWeighted(image, 0.5, zero, 0.5, 0))
    clipped = cv2.resize(np.clip(heat, 0, 1).astype(np.float32), (8, 6))
    jet = cv2.applyColorMap((clipped * 255).astype(np.uint8), cv2.COLORMAP_JET)
    assert np.array_equal(overlay_heatmap(image, heat, alpha=0.25, normalize=False),
                          cv2.addWeighted(image, 0.75, jet, 0.25, 0))


def test_put_label_draws_a_bar_in_place():
    img = np.full((40, 60, 3), 128, np.uint8)
    assert put_label(img, 'ab') is img
    (tw, th), base = cv2.getTextSize('ab', 0, 0.3, 1)  # scale max(0.3, 40 / 320), thickness 1
    bar = img[:th + base + 5, :tw + 5]
    assert (img[th + base + 5:] == 128).all() and (img[:, tw + 5:] == 128).all()
    assert (bar == 0).any() and (bar > 128).any()  # black bar, white text
    img = np.full((40, 60, 3), 128, np.uint8)
    put_label(img, 'ab', bottom=True, colour=(0, 0, 255), bg=(255, 0, 0))
    y0 = 40 - (th + base + 4)
    assert (img[:y0] == 128).all() and (img[y0, 0] == (255, 0, 0)).all()
    assert (img[y0:, :tw + 5, 2] > 128).any()  # red text on the blue bar


def test_resize_tile_keeps_the_aspect_and_pads_white():
    img = _image(40, 80)
    tile = resize_tile(img, 20)
    assert tile.shape == (20, 20, 3) and tile.dtype == np.uint8
    assert np.array_equal(tile[:10], cv2.resize(img, (20, 10), interpolation=cv2.INTER_AREA))
    assert (tile[10:] == 255).all()
    up = resize_tile(img[:4, :2], 8)  # enlarged: nearest
    assert np.array_equal(up[:, :4], cv2.resize(img[:4, :2], (4, 8),
                                                interpolation=cv2.INTER_NEAREST))
    assert (up[:, 4:] == 255).all()
    up = resize_tile(img[:4, :2], 6)  # enlarged 1.5x: nearest too
    assert np.array_equal(up[:, :3], cv2.resize(img[:4, :2], (3, 6),
                                                interpolation=cv2.INTER_NEAREST))
    wide, tall = _image(1, 200) // 2, _image(200, 1) // 2  # no white pixel in either
    assert (resize_tile(wide, 20)[1:] == 255).all() and (resize_tile(wide, 20)[0] < 255).all()
    assert (resize_tile(tall, 20)[:, 1:] == 255).all()  # one pixel thin stays one pixel


def test_make_grid_row_major_with_padding():
    tiles = [np.full((4, 5, 3), 10 * (i + 1), np.uint8) for i in range(5)]
    grid = make_grid(tiles, 2)
    assert grid.shape == (3 * 6 + 2, 2 * 7 + 2, 3)
    for i in range(5):
        r, c = divmod(i, 2)
        y, x = 2 + r * 6, 2 + c * 7
        assert (grid[y:y + 4, x:x + 5] == 10 * (i + 1)).all(), i
    mask = np.ones(grid.shape[:2], bool)
    for i in range(5):
        r, c = divmod(i, 2)
        mask[2 + r * 6:6 + r * 6, 2 + c * 7:7 + c * 7] = False
    assert (grid[mask] == 255).all()
    assert make_grid(tiles[:2], 9).shape == (6 + 2, 2 * 7 + 2, 3)  # ncols <= tiles
    with pytest.raises(ValueError, match='at least one tile'):
        make_grid([], 2)


def test_heatmap_grid_is_the_input_then_one_overlay_per_cluster():
    image, heat = _image(12, 16), np.random.default_rng(1).random((3, 3, 4))
    grid = heatmap_grid(image, torch.from_numpy(heat), tile=32)
    assert grid.shape == (2 * 34 + 2, 2 * 34 + 2, 3)  # 4 tiles, ceil(sqrt(4)) = 2 columns
    tiles = [put_label(resize_tile(image, 32), 'input')] + [
        put_label(resize_tile(overlay_heatmap(image, h), 32), f'#{m}')
        for m, h in enumerate(heat)]
    assert np.array_equal(grid, make_grid(tiles, 2))
    assert heatmap_grid(image, heat, tile=32, ncols=4).shape == (34 + 2, 4 * 34 + 2, 3)
    assert heatmap_grid(image, heat).shape == (2 * 130 + 2, 2 * 130 + 2, 3)  # tile 128


def _groups(positive, negative, m=4, h=12, w=16, given=False):
    masks = torch.zeros(m, h, w, dtype=torch.bool)
    for i in range(m):
        masks[i, :, i * w // m:(i + 1) * w // m] = True
    return ClusterGroups(stage=3, label=1, label_given=given, base_prob=0.9, base_pred=1,
                         probs=torch.linspace(0.9, 0.1, m), preds=torch.tensor([1, 1, 0, 2]),
                         positive=positive, negative=negative, logits=torch.zeros(m, 3, 4),
                         masks=masks, class_names=['cat', 'dog', 'cow'])


def test_group_figure_rows_and_masked_tiles():
    image, tile = _image(12, 16) | 1, 40  # no black pixel in the input
    fig = group_figure(image, _groups([0, 1], [2, 3]), topk=1, tile=tile)
    width = 1 * (tile + 2) + 2
    # caption, input, caption, positive row (top 1), caption, negative row (top 1)
    assert fig.shape == (3 * 24 + 3 * (tile + 4), width, 3)
    assert (fig[:22] < 128).any()  # black caption text
    row = fig[24 + tile + 4 + 24:][2:2 + tile, 2:2 + tile]
    masked = image * _groups([], []).masks[0].numpy()[..., None].astype(np.uint8)
    below = slice(16, 30)  # under the label bar, inside the image area (30 rows of 40)
    assert np.array_equal(row[below], resize_tile(masked, tile)[below])
    fig = group_figure(image, _groups([0, 1, 2, 3], [], given=True), topk=3, tile=tile)
    assert fig.shape == (3 * 24 + 3 * (tile + 4), 3 * (tile + 2) + 2, 3)
    wide = group_figure(image, _groups([0], [1]), topk=3, tile=100)
    assert (wide[:24, -4:] == 255).all()  # on white, past the caption's text


def test_save_image_writes_the_exact_pixels(tmp_path):
    img = _image(5, 7)
    path = save_image(str(tmp_path / 'a' / 'b.png'), img)
    assert path == str(tmp_path / 'a' / 'b.png') and sorted(p.name for p in (tmp_path / 'a')
                                                           .iterdir()) == ['b.png']
    assert np.array_equal(cv2.imread(path), img)
    jpg = save_image(str(tmp_path / 'c.jpg'), img)  # the format follows the extension
    with open(jpg, 'rb') as f:
        assert f.read(2) == b'\xff\xd8'
