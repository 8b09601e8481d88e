"""Global augmentation applied consistently to every agent and the labels.

An augmentation is a 4x4 rotation ``A`` about z that maps the ego frame ``e``
to an augmented frame ``e'``. Every agent keeps its points in its own sensor
frame and only its pose changes: ``T_e'_from_agent = A @ T_e_from_agent``;
ground-truth boxes are computed from their world corners in the augmented frame
``A @ T_ego_from_world``. BEV features are warped to the ego with that pose, so
every agent's feature lands in the same augmented frame (the ego's own points
are rotated directly, so its feature needs no warp).

No mirror and no scale: BEV warping is rigid (yaw + translation), and agents
encode unscaled points, so either would make features and labels disagree.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class AugmentConfig:
    """Training-time augmentation: uniform yaw rotation in +-``rotation_deg``."""

    enabled: bool = True
    rotation_deg: float = 45.0


def sample_augmentation(cfg: AugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """Draw ``A`` (4, 4) float64; identity when disabled."""
    A = np.eye(4)
    if not cfg.enabled or cfg.rotation_deg == 0:
        return A
    yaw = np.radians(rng.uniform(-cfg.rotation_deg, cfg.rotation_deg))
    c, s = np.cos(yaw), np.sin(yaw)
    A[:2, :2] = [[c, -s], [s, c]]
    return A
