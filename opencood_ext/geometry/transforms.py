"""Rigid transforms between world and sensor frames.

Poses are 6-vectors ``[x, y, z, roll, yaw, pitch]`` in metres and DEGREES (OPV2V's
``lidar_pose`` / ``cords`` order). :func:`pose_to_matrix` gives
``T_world_from_sensor`` equal to CARLA's ``Transform.get_matrix()`` (a
left-handed x-forward, y-right, z-up frame). Matrices are float64 (4, 4), or
(..., 4, 4) for batched input.
"""
from __future__ import annotations

import numpy as np


def pose_to_matrix(pose) -> np.ndarray:
    """``[x, y, z, roll, yaw, pitch]`` (deg) -> ``T_world_from_sensor`` (4, 4).

    Accepts (6,) or (..., 6); returns (4, 4) or (..., 4, 4).
    """
    p = np.asarray(pose, dtype=np.float64)
    if p.shape[-1] != 6:
        raise ValueError(f"pose must have 6 values [x, y, z, roll, yaw, pitch], got shape {p.shape}")
    x, y, z = p[..., 0], p[..., 1], p[..., 2]
    roll, yaw, pitch = np.radians(p[..., 3]), np.radians(p[..., 4]), np.radians(p[..., 5])
    cr, sr = np.cos(roll), np.sin(roll)
    cy, sy = np.cos(yaw), np.sin(yaw)
    cp, sp = np.cos(pitch), np.sin(pitch)
    T = np.zeros(p.shape[:-1] + (4, 4), dtype=np.float64)
    T[..., 0, 0] = cp * cy
    T[..., 0, 1] = cy * sp * sr - sy * cr
    T[..., 0, 2] = -cy * sp * cr - sy * sr
    T[..., 1, 0] = sy * cp
    T[..., 1, 1] = sy * sp * sr + cy * cr
    T[..., 1, 2] = -sy * sp * cr + cy * sr
    T[..., 2, 0] = sp
    T[..., 2, 1] = -cp * sr
    T[..., 2, 2] = cp * cr
    T[..., 0, 3], T[..., 1, 3], T[..., 2, 3] = x, y, z
    T[..., 3, 3] = 1.0
    return T


def matrix_to_pose(T) -> np.ndarray:
    """Inverse of :func:`pose_to_matrix` for a rigid (4, 4) or (..., 4, 4) matrix.

    Returns ``[x, y, z, roll, yaw, pitch]`` in degrees with pitch in [-90, 90].
    """
    T = np.asarray(T, dtype=np.float64)
    pitch = np.arcsin(np.clip(T[..., 2, 0], -1.0, 1.0))
    yaw = np.arctan2(T[..., 1, 0], T[..., 0, 0])
    roll = np.arctan2(-T[..., 2, 1], T[..., 2, 2])
    return np.stack([T[..., 0, 3], T[..., 1, 3], T[..., 2, 3],
                     np.degrees(roll), np.degrees(yaw), np.degrees(pitch)], axis=-1)


def invert_transform(T) -> np.ndarray:
    """Inverse of a rigid transform (..., 4, 4) using R^T, not a general inverse."""
    T = np.asarray(T, dtype=np.float64)
    R = T[..., :3, :3]
    t = T[..., :3, 3:]
    out = np.zeros_like(T)
    Rt = np.swapaxes(R, -1, -2)
    out[..., :3, :3] = Rt
    out[..., :3, 3:] = -Rt @ t
    out[..., 3, 3] = 1.0
    return out


def relative_transform(T_world_from_a, T_world_from_b) -> np.ndarray:
    """``T_a_from_b = inv(T_world_from_a) @ T_world_from_b``, e.g. ``T_ego_from_agent``."""
    return invert_transform(T_world_from_a) @ np.asarray(T_world_from_b, dtype=np.float64)


def transform_points(T, points) -> np.ndarray:
    """Apply (4, 4) ``T`` to (N, 3+) points; extra columns (intensity) pass through.

    Keeps the input dtype.
    """
    pts = np.asarray(points)
    T = np.asarray(T, dtype=np.float64)
    xyz = pts[..., :3].astype(np.float64) @ T[:3, :3].T + T[:3, 3]
    out = pts.copy()
    out[..., :3] = xyz.astype(pts.dtype, copy=False)
    return out
