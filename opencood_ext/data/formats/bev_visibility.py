"""``<timestamp>_bev_visibility.png``: the bird's-eye cells around an agent that
its sensors see, in the form HEAL's camera datasets read.

Format (HEAL: ``box_is_visible`` and ``generate_visible_object_center`` in
``opencood/utils/box_utils.py`` / the post-processor): 256 x 256 cells of
0.39 m, 8-bit grayscale, heading up, in the agent's LiDAR frame (CARLA's
left-handed x forward, y right). A point ``(x, y)`` falls in

    row = 127 - int(x / 0.39),   column = 127 + int(y / 0.39)

with ``int`` truncating toward zero (so row 127 / column 127 are two cells
wide); a non-zero cell is visible (we write 255, else 0). HEAL keeps a camera
agent's ground-truth box only when its centre's cell is visible. The file sits
beside the ``.yaml`` (HEAL also looks under ``additional/<split>/``).

What we mark visible: the cells a sensor ray crosses in the height band below
the sensor. For each sensor (each camera that has a depth image, else the LiDAR)
and each of its rays that ends no higher than the sensor (a hit on the ground,
a vehicle or a wall; rays going up only see roofs and sky), the ray's reach is
the horizontal distance to the hit plus :data:`MARGIN_M` (the hit is an object's
near face; its centre lies behind it). Reaches are gathered per azimuth bin of
:data:`AZIMUTH_BIN_DEG` around the sensor, keeping the longest; an empty bin
between two filled ones (sparse scans) takes the shorter of its nearest filled
neighbours within :data:`FILL_BINS`. A cell is visible when its centre is
within the reach of its bin for any sensor.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Tuple

import numpy as np

from ..frame import AgentObs

SIZE = 256
RESOLUTION_M = 0.39
CENTRE = 127
VISIBLE = 255
MARGIN_M = 2.5
AZIMUTH_BIN_DEG = 0.5
FILL_BINS = 4
CAMERA_STEP_DEG = 0.4    # back-projected pixels are subsampled to about this spacing


def cell_of(x, y) -> Tuple[np.ndarray, np.ndarray]:
    """(row, column) of LiDAR-frame points, by HEAL's rule (may fall outside 0..255)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    row = CENTRE - np.trunc(x / RESOLUTION_M)
    return row.astype(np.int64), (CENTRE + np.trunc(y / RESOLUTION_M)).astype(np.int64)


def _axis_centres(k: np.ndarray) -> np.ndarray:
    """Centre coordinate of the cells whose truncated index ``int(v / RES)`` is ``k``."""
    return np.sign(k) * (np.abs(k) + 0.5) * RESOLUTION_M


def cell_centres() -> Tuple[np.ndarray, np.ndarray]:
    """(x, y), each (SIZE, SIZE): the LiDAR-frame centre of every cell (row, column)."""
    k = np.arange(SIZE)
    x = _axis_centres(CENTRE - k)[:, None]
    y = _axis_centres(k - CENTRE)[None, :]
    return np.broadcast_to(x, (SIZE, SIZE)), np.broadcast_to(y, (SIZE, SIZE))


def _camera_rays(agent: AgentObs) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """(origin (3,), hit points (N, 3)) in the LiDAR frame, per camera with depth."""
    for cam in agent.cameras:
        if cam.depth is None:
            continue
        depth = np.asarray(cam.depth, np.float32)
        K = np.asarray(cam.K, np.float64)
        step = max(1, int(np.radians(CAMERA_STEP_DEG) * K[0, 0]))
        rows, cols = np.mgrid[step // 2:depth.shape[0]:step, step // 2:depth.shape[1]:step]
        d = depth[rows, cols].ravel()
        u, v = cols.ravel() + 0.5, rows.ravel() + 0.5
        ok = np.isfinite(d) & (d > 0)
        d, u, v = d[ok], u[ok], v[ok]
        # camera frame (CARLA's): x along the optical axis, y right, z up
        pts = np.stack([d, (u - K[0, 2]) / K[0, 0] * d, -(v - K[1, 2]) / K[1, 1] * d], axis=1)
        T = np.asarray(cam.T_lidar_from_camera, np.float64)
        yield T[:3, 3], pts @ T[:3, :3].T + T[:3, 3]


def _sensor_rays(agent: AgentObs) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    cams = list(_camera_rays(agent))
    if cams:
        yield from cams
    elif agent.lidar is not None and len(agent.lidar):
        yield np.zeros(3), np.asarray(agent.lidar, np.float64)[:, :3]


def _reach_per_bin(origin: np.ndarray, hits: np.ndarray) -> np.ndarray:
    """(n_bins,) longest reach (m) per azimuth bin around ``origin``; 0 where unseen."""
    n = int(round(360.0 / AZIMUTH_BIN_DEG))
    low = hits[hits[:, 2] <= origin[2]]
    dx, dy = low[:, 0] - origin[0], low[:, 1] - origin[1]
    reach = np.zeros(n)
    if len(low):
        b = (np.floor(np.degrees(np.arctan2(dy, dx)) / AZIMUTH_BIN_DEG).astype(np.int64)) % n
        np.maximum.at(reach, b, np.hypot(dx, dy) + MARGIN_M)
    filled = np.nonzero(reach > 0)[0]
    if len(filled) < 2:
        return reach
    # nearest filled bin on each side (circular), for the empty bins
    ext = np.concatenate([filled - n, filled, filled + n])
    idx = np.arange(n)
    right = ext[np.searchsorted(ext, idx)]
    left = ext[np.searchsorted(ext, idx, side="right") - 1]
    gap_ok = (right - left <= FILL_BINS + 1) & (reach == 0)
    reach[gap_ok] = np.minimum(reach[left[gap_ok] % n], reach[right[gap_ok] % n])
    return reach


def visibility_mask(agent: AgentObs) -> np.ndarray:
    """(SIZE, SIZE) uint8, :data:`VISIBLE` where ``agent``'s sensors see (module docstring)."""
    cx, cy = cell_centres()
    seen = np.zeros((SIZE, SIZE), bool)
    n = int(round(360.0 / AZIMUTH_BIN_DEG))
    for origin, hits in _sensor_rays(agent):
        reach = _reach_per_bin(np.asarray(origin, np.float64), hits)
        dx, dy = cx - origin[0], cy - origin[1]
        b = (np.floor(np.degrees(np.arctan2(dy, dx)) / AZIMUTH_BIN_DEG).astype(np.int64)) % n
        seen |= np.hypot(dx, dy) <= reach[b]
    return np.where(seen, VISIBLE, 0).astype(np.uint8)


def write_visibility_png(path, mask: np.ndarray) -> Path:
    from PIL import Image

    from .opv2v_io import PNG_LEVEL

    m = np.asarray(mask)
    if m.shape != (SIZE, SIZE):
        raise ValueError(f"{path}: a BEV visibility mask is {SIZE}x{SIZE}, got {m.shape}")
    Image.fromarray(np.where(m > 0, VISIBLE, 0).astype(np.uint8)).save(path, format="PNG",
                                                                        compress_level=PNG_LEVEL)
    return Path(path)


def read_visibility_png(path) -> np.ndarray:
    """(SIZE, SIZE) bool, True where visible (any non-zero channel value)."""
    from ..errors import DataFormatError
    from .opv2v_io import _open_image

    arr = np.asarray(_open_image(path))
    if arr.ndim == 3:
        arr = arr.max(axis=2)
    if arr.shape != (SIZE, SIZE):
        raise DataFormatError(path, f"BEV visibility mask must be {SIZE}x{SIZE}, got {arr.shape}")
    return arr > 0
