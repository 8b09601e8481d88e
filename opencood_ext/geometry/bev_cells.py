"""Which BEV grid cells lie inside boxes: (G, 7) boxes -> (H, W) mask on a map's cell centres.

Grid convention (:mod:`opencood_ext.models.warp`): a map (H, W) covers ``lidar_range = (xmin, ymin,
zmin, xmax, ymax, zmax)``; cell (row i, col j) has its centre at ``x = xmin + (j + 0.5) dx``,
``y = ymin + (i + 0.5) dy``. A box is ``(x, y, z, l, w, h, yaw)`` in the same frame (OpenCOOD's
hwl-free order: l along the heading, w across it); a cell is inside when its centre is within the
box's rotated BEV rectangle grown by ``margin`` metres on every side (the box's footprint alone covers
few cells of a 1 m grid).
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
from torch import Tensor


def cells_in_boxes(boxes: Tensor, lidar_range: Sequence[float], shape: Tuple[int, int],
                   margin: float = 0.0) -> Tensor:
    """(G, >=7) boxes -> (H, W) bool, True for the cells whose centre lies inside any box (grown by
    ``margin`` m). No boxes: all False."""
    H, W = int(shape[0]), int(shape[1])
    xmin, ymin, xmax, ymax = float(lidar_range[0]), float(lidar_range[1]), float(lidar_range[3]), float(lidar_range[4])
    if xmax <= xmin or ymax <= ymin or H < 1 or W < 1:
        raise ValueError(f"cells_in_boxes: bad grid {shape} over range {list(lidar_range)}")
    device = boxes.device
    out = torch.zeros(H, W, dtype=torch.bool, device=device)
    if boxes.numel() == 0:
        return out
    if boxes.dim() != 2 or boxes.shape[1] < 7:
        raise ValueError(f"cells_in_boxes: boxes must be (G, 7), got {tuple(boxes.shape)}")
    b = boxes.to(torch.float64)
    xs = xmin + (torch.arange(W, device=device, dtype=torch.float64) + 0.5) * (xmax - xmin) / W
    ys = ymin + (torch.arange(H, device=device, dtype=torch.float64) + 0.5) * (ymax - ymin) / H
    dx = xs[None, None, :] - b[:, 0, None, None]          # (G, 1, W)
    dy = ys[None, :, None] - b[:, 1, None, None]          # (G, H, 1)
    c, s = torch.cos(b[:, 6])[:, None, None], torch.sin(b[:, 6])[:, None, None]
    along = dx * c + dy * s                                # (G, H, W) in the box's own axes
    across = -dx * s + dy * c
    inside = (along.abs() <= b[:, 3, None, None] / 2 + margin) & (across.abs() <= b[:, 4, None, None] / 2 + margin)
    return inside.any(dim=0)
