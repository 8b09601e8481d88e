"""3D boxes ``[x, y, z, l, w, h, yaw]``: centre, FULL sizes, yaw in radians about +z.

Corner order of :func:`boxes_to_corners` (in the box's own frame, x along length):
bottom face (z - h/2) first, ``0:(+l,+w) 1:(+l,-w) 2:(-l,-w) 3:(-l,+w)``, then the
top face 4..7 in the same order. Works in any frame (left- or right-handed):
yaw turns +x towards +y.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from .transforms import pose_to_matrix

_UNIT_CORNERS = np.array([
    [1, 1, -1], [1, -1, -1], [-1, -1, -1], [-1, 1, -1],
    [1, 1, 1], [1, -1, 1], [-1, -1, 1], [-1, 1, 1],
], dtype=np.float64) * 0.5


def boxes_to_corners(boxes) -> np.ndarray:
    """(N, 7) boxes -> (N, 8, 3) corners."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    local = _UNIT_CORNERS[None] * b[:, None, 3:6]  # (N, 8, 3)
    c, s = np.cos(b[:, 6]), np.sin(b[:, 6])
    x = local[..., 0] * c[:, None] - local[..., 1] * s[:, None]
    y = local[..., 0] * s[:, None] + local[..., 1] * c[:, None]
    return np.stack([x, y, local[..., 2]], axis=-1) + b[:, None, :3]


def corners_to_boxes(corners) -> np.ndarray:
    """(N, 8, 3) corners in the order above -> (N, 7) boxes.

    Sizes are the mean edge lengths (so a pitched or rolled box keeps its true
    size); yaw is the heading of the mean back-to-front edge in the xy plane.
    """
    c = np.asarray(corners, dtype=np.float64).reshape(-1, 8, 3)
    center = c.mean(axis=1)
    front_minus_back = (c[:, [0, 1, 4, 5]] - c[:, [3, 2, 7, 6]])  # (N, 4, 3)
    left_minus_right = (c[:, [0, 3, 4, 7]] - c[:, [1, 2, 5, 6]])
    top_minus_bottom = (c[:, 4:8] - c[:, 0:4])
    length = np.linalg.norm(front_minus_back, axis=-1).mean(axis=1)
    width = np.linalg.norm(left_minus_right, axis=-1).mean(axis=1)
    height = np.linalg.norm(top_minus_bottom, axis=-1).mean(axis=1)
    heading = front_minus_back.mean(axis=1)
    yaw = np.arctan2(heading[:, 1], heading[:, 0])
    return np.concatenate([center, np.stack([length, width, height, yaw], axis=1)], axis=1)


def object_corners_world(location, center, angle, extent) -> np.ndarray:
    """OPV2V object -> (8, 3) world corners.

    ``location + center`` (world axes) is the box centre; ``angle`` is
    [roll, yaw, pitch] degrees; ``extent`` holds half sizes.
    """
    pose = np.concatenate([np.asarray(location, float) + np.asarray(center, float),
                           np.asarray(angle, float)])
    T = pose_to_matrix(pose)
    local = _UNIT_CORNERS * 2.0 * np.asarray(extent, float)
    return local @ T[:3, :3].T + T[:3, 3]


def objects_to_boxes(objects: Iterable, T_sensor_from_world) -> np.ndarray:
    """ObjectLabel-like items (location, center, angle, extent) -> (N, 7) boxes
    in the sensor frame given by ``T_sensor_from_world`` (4, 4)."""
    objs = list(objects)
    if not objs:
        return np.zeros((0, 7), dtype=np.float64)
    T = np.asarray(T_sensor_from_world, dtype=np.float64)
    corners = np.stack([object_corners_world(o.location, o.center, o.angle, o.extent) for o in objs])
    corners = corners @ T[:3, :3].T + T[:3, 3]
    return corners_to_boxes(corners)


def points_in_boxes(points, boxes, bev_only: bool = False) -> np.ndarray:
    """(N, 3+) points, (M, 7) boxes -> (N, M) bool mask of points inside each box
    (``bev_only``: inside its bird's-eye-view footprint, any height; points may be (N, 2))."""
    dims = 2 if bev_only else 3
    pts = np.asarray(points, dtype=np.float64)[:, :dims]
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    if len(b) == 0 or len(pts) == 0:
        return np.zeros((len(pts), len(b)), dtype=bool)
    d = pts[:, None, :] - b[None, :, :dims]  # (N, M, dims)
    return _inside(d, np.cos(b[:, 6]), np.sin(b[:, 6]), b, dims)


def _inside(d: np.ndarray, c, s, b: np.ndarray, dims: int) -> np.ndarray:
    """The inside test of :func:`points_in_boxes` and :func:`points_per_box`: ``d`` (..., dims)
    offsets of points from box centres, ``c`` / ``s`` the boxes' cos / sin of yaw and ``b`` the
    boxes (..., 7), broadcasting against ``d``'s leading axes."""
    lx = d[..., 0] * c + d[..., 1] * s
    ly = -d[..., 0] * s + d[..., 1] * c
    inside = (np.abs(lx) <= b[..., 3] / 2) & (np.abs(ly) <= b[..., 4] / 2)
    return inside if dims == 2 else inside & (np.abs(d[..., 2]) <= b[..., 5] / 2)


REACH_MARGIN_M = 1e-3  # far above float64 rounding at any coordinate a scan holds
MAX_CELLS = 4096  # x cells of the bucketing in points_per_box (int16 keys: numpy sorts them by radix)


def points_per_box(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """(M,) int64: how many of ``points`` (N, 3+) lie inside each of ``boxes`` (M, 7), i.e.
    ``points_in_boxes(points, boxes).sum(axis=0)`` without its (N, M) arrays.

    A point of a box's footprint is at most half its length plus half its width from its centre
    along x. The points are bucketed by x into cells of at least 1 m; each box tests only the
    points of the cells within that reach (plus a margin and a cell either side, against
    rounding at cell borders). The test on them is :func:`points_in_boxes`' own (``_inside``, with
    the boxes' cos and sin taken over all of them at once as there), so every count is the same."""
    pts = np.asarray(points, dtype=np.float64)[:, :3]
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    counts = np.zeros(len(b), dtype=np.int64)
    if len(b) == 0 or len(pts) == 0:
        return counts
    c, s = np.cos(b[:, 6]), np.sin(b[:, 6])
    reach = (np.abs(b[:, 3]) + np.abs(b[:, 4])) / 2 + REACH_MARGIN_M
    x0, x1 = float(np.min(b[:, 0] - reach)), float(np.max(b[:, 0] + reach))
    cell = max(1.0, (x1 - x0) / (MAX_CELLS - 4))
    x0 -= cell
    near = np.flatnonzero((pts[:, 0] >= x0) & (pts[:, 0] <= x1 + cell))
    key = ((pts[near, 0] - x0) // cell).astype(np.int16)
    order = near[np.argsort(key, kind="stable")]
    starts = np.concatenate([[0], np.cumsum(np.bincount(key, minlength=MAX_CELLS))])
    lo = np.clip(((b[:, 0] - reach - x0) // cell).astype(np.int64) - 1, 0, MAX_CELLS)
    hi = np.clip(((b[:, 0] + reach - x0) // cell).astype(np.int64) + 2, 0, MAX_CELLS)
    for j in range(len(b)):
        d = pts[order[starts[lo[j]]:starts[hi[j]]]] - b[j, :3]
        counts[j] = int(_inside(d, c[j], s[j], b[j], 3).sum())
    return counts


def boxes_inside_range(boxes, lidar_range, min_corners: int = 8) -> np.ndarray:
    """(N, 7) boxes -> (N,) bool: at least ``min_corners`` of each box's 8 corners lie inside
    ``lidar_range = (xmin, ymin, zmin, xmax, ymax, zmax)``, bounds inclusive, z included.

    The field's rule for ground truth and predictions (OpenCOOD / HEAL
    ``mask_boxes_outside_range_numpy``, default 8 corners): a box that pokes out of the
    detection area in x, y OR z is dropped, not only one whose centre is outside.
    ``boxes`` may be a numpy array or a torch tensor (read on the CPU); the mask is numpy.
    """
    if not 1 <= int(min_corners) <= 8:
        raise ValueError(f"boxes_inside_range: min_corners must be in 1..8, got {min_corners}")
    r = np.asarray(lidar_range, dtype=np.float64).reshape(-1)
    if r.shape != (6,) or not (r[3:] > r[:3]).all():
        raise ValueError(f"boxes_inside_range: lidar_range must be (xmin, ymin, zmin, xmax, ymax, zmax) "
                         f"with max > min, got {list(r)}")
    if hasattr(boxes, "detach"):  # a torch tensor
        boxes = boxes.detach().cpu().numpy()
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    corners = boxes_to_corners(b)  # (N, 8, 3)
    inside = ((corners >= r[:3]) & (corners <= r[3:])).all(axis=2)  # (N, 8)
    return inside.sum(axis=1) >= int(min_corners)


def limit_period(angle, offset: float = 0.5, period: float = 2 * np.pi):
    """Wrap ``angle`` into ``[-offset * period, (1 - offset) * period)``; numpy or torch."""
    return angle - np.floor(angle / period + offset) * period if isinstance(angle, np.ndarray) \
        else angle - (angle / period + offset).floor() * period
