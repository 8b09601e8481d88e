"""Warp BEV maps from each agent's frame into the ego frame.

Grid convention: a BEV map (N, C, H, W) covers ``lidar_range = (xmin, ymin,
zmin, xmax, ymax, zmax)`` of its OWN agent frame; rows run along y, columns
along x, so cell (row i, col j) has its centre at
``x = xmin + (j + 0.5) * dx``, ``y = ymin + (i + 0.5) * dy`` with
``dx = (xmax - xmin) / W``, ``dy = (ymax - ymin) / H``.

The BEV transform is the 2D rigid part of ``T_ego_from_agent`` (4, 4):
yaw ``psi = atan2(T[1,0], T[0,0])``, ``R = [[cos, -sin], [sin, cos]]`` and
translation ``t = T[:2, 3]`` (roll, pitch and z are dropped: BEV maps are
flat), so an agent point ``p_a`` lands at ``p_e = R p_a + t``.

Warping is inverse mapping: ego cell centre ``p_e`` -> ``p_a = R^T (p_e - t)``
-> normalised grid coordinate of the agent map. With ``align_corners=False``
the normalised coordinate of a point is ``g = S^-1 (p - c)``, ``c`` the range
centre and ``S = diag((xmax - xmin)/2, (ymax - ymin)/2)`` (cell centres sit
at ``(2j + 1)/W - 1``), so the sampling grid is affine in the ego's own
normalised coordinate ``g_e``::

    g_a = A g_e + b,   A = S^-1 R^T S,   b = S^-1 (R^T (c - t) - c)

which is the ``theta = [A | b]`` given to ``affine_grid``. Samples outside
the agent map read zero. An exact identity transform returns the input
unchanged (bit-exact; the ego's own slot never gets resampled).
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def _as_transforms(T_ego_from_agent, n: int, device) -> Tensor:
    T = torch.as_tensor(np.asarray(T_ego_from_agent) if not torch.is_tensor(T_ego_from_agent)
                        else T_ego_from_agent).to(device=device, dtype=torch.float64)
    if T.shape != (n, 4, 4):
        raise ValueError(f"T_ego_from_agent must be ({n}, 4, 4) to match the features, got {tuple(T.shape)}")
    if not torch.isfinite(T).all():
        raise ValueError("T_ego_from_agent has non-finite entries")
    return T


def _range(lidar_range: Sequence[float]) -> Tuple[float, float, float, float]:
    r = [float(v) for v in lidar_range]
    if len(r) != 6 or not (r[3] > r[0] and r[4] > r[1]):
        raise ValueError(f"lidar_range must be (xmin, ymin, zmin, xmax, ymax, zmax) with max > min, got {lidar_range}")
    return r[0], r[1], r[3], r[4]


def bev_affine_theta(T_ego_from_agent, lidar_range: Sequence[float], device=None) -> Tensor:
    """(N, 4, 4) ``T_ego_from_agent`` -> (N, 2, 3) float64 ``theta`` for affine_grid (see module doc)."""
    T = _as_transforms(T_ego_from_agent, len(T_ego_from_agent), device)
    xmin, ymin, xmax, ymax = _range(lidar_range)
    yaw = torch.atan2(T[:, 1, 0], T[:, 0, 0])
    c, s = torch.cos(yaw), torch.sin(yaw)
    sx, sy = (xmax - xmin) / 2.0, (ymax - ymin) / 2.0
    cx, cy = (xmax + xmin) / 2.0, (ymax + ymin) / 2.0
    tx, ty = T[:, 0, 3], T[:, 1, 3]
    # R^T (c - t) - c, with R^T = [[c, s], [-s, c]]
    dx, dy = cx - tx, cy - ty
    bx = (c * dx + s * dy - cx) / sx
    by = (-s * dx + c * dy - cy) / sy
    theta = torch.stack([
        torch.stack([c, s * sy / sx, bx], dim=-1),
        torch.stack([-s * sx / sy, c, by], dim=-1),
    ], dim=1)
    return theta


# A transform within this of the identity (metres / rotation-matrix entries) is the identity: a
# pose times its own inverse (an ego placed in its own frame) lands ~1e-14 off it, far below a
# cell, and resampling would only blur the ego's own feature.
IDENTITY_ATOL = 1e-6


def _is_identity(T: Tensor) -> Tensor:
    """(N,) bool: which of the (N, 4, 4) transforms are the identity within IDENTITY_ATOL."""
    eye = torch.eye(4, dtype=T.dtype, device=T.device)
    return ((T - eye).abs() <= IDENTITY_ATOL).flatten(1).all(dim=1)


def warp_to_ego(features: Tensor, T_ego_from_agent, lidar_range: Sequence[float],
                mode: str = "bilinear") -> Tensor:
    """features (N, C, H, W) each in its agent's frame -> (N, C, H, W) in the ego frame.

    T_ego_from_agent: (N, 4, 4) tensor or array, agent frame -> ego frame (metres).
    mode: "bilinear" or "nearest". Cells the agent map does not cover are zero.
    """
    if features.dim() != 4:
        raise ValueError(f"warp_to_ego expects features (N, C, H, W), got {tuple(features.shape)}")
    if mode not in ("bilinear", "nearest"):
        raise ValueError(f"warp_to_ego mode must be 'bilinear' or 'nearest', got {mode!r}")
    n = features.shape[0]
    T = _as_transforms(T_ego_from_agent, n, features.device)
    theta = bev_affine_theta(T, lidar_range, features.device).to(features.dtype)
    grid = F.affine_grid(theta, list(features.shape), align_corners=False)
    warped = F.grid_sample(features, grid, mode=mode, padding_mode="zeros", align_corners=False)
    keep = _is_identity(T)
    if bool(keep.any()):
        warped = torch.where(keep[:, None, None, None], features, warped)
    return warped


def warp_mask(T_ego_from_agent, lidar_range: Sequence[float], size: Tuple[int, int],
              device=None, dtype: torch.dtype = torch.float32) -> Tensor:
    """(N, 1, H, W) mask in the ego frame: 1 where the ego cell centre lies inside
    the agent's map (``size = (H, W)`` cells over ``lidar_range``), else 0."""
    n = len(T_ego_from_agent)
    T = _as_transforms(T_ego_from_agent, n, device)
    h, w = int(size[0]), int(size[1])
    theta = bev_affine_theta(T, lidar_range, T.device)
    grid = F.affine_grid(theta, [n, 1, h, w], align_corners=False)
    inside = (grid.abs() <= 1.0).all(dim=-1) | _is_identity(T)[:, None, None]
    return inside[:, None].to(dtype)
