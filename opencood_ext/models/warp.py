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

Rule ``"reference"`` (``protocol: reference``; :func:`warp_rule`, which the detector sets around its
fusion method's receive and detect): the reference's arithmetic instead (OpenCOOD / HEAL / GenComm
``normalize_pairwise_tfm`` + ``warp_affine_simple``): ``A`` and ``b`` from the 3-D
``T_agent_from_ego = T_ego_from_agent^-1`` as it is, its top-left 2 x 2 block ``M`` (roll and
pitch left in, not reduced to a yaw) and its x-y translation ``m``: ``A = S^-1 M S``,
``b = S^-1 (M c + m - c)`` (the reference's for a centred range, ``c = 0``), all in float64, and
the sampling grid computed in float64 by ``affine_grid``, then cast to the features' dtype (the
reference's pairwise matrices are float64; its grid is cast with ``.to(src)``). On flat poses the
two rules differ only by float32 rounding of the grid (2.5e-5 of a random map's magnitude on
HEAL's 204.8 m x 102.4 m range at 0.8 m cells); with roll or pitch the reference's scales x and y
by about ``cos`` of the tilt and moves the map by the tilt times the height difference.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Literal, Optional, Sequence, Tuple

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


Rule = Literal["native", "reference"]
_RULE: "contextvars.ContextVar[Rule]" = contextvars.ContextVar("bev_warp_rule", default="native")


@contextlib.contextmanager
def warp_rule(rule: Rule) -> Iterator[None]:
    """Within the block, :func:`warp_to_ego` and :func:`warp_mask` calls that name no ``rule`` use
    this one (the detector sets its protocol's around the fusion method's receive and detect)."""
    if rule not in ("native", "reference"):
        raise ValueError(f"warp rule must be 'native' or 'reference', got {rule!r}")
    token = _RULE.set(rule)
    try:
        yield
    finally:
        _RULE.reset(token)


def _rule(rule: Optional[Rule]) -> Rule:
    rule = _RULE.get() if rule is None else rule
    if rule not in ("native", "reference"):
        raise ValueError(f"warp rule must be 'native' or 'reference', got {rule!r}")
    return rule


def _reference_theta(T: Tensor, xmin: float, ymin: float, xmax: float, ymax: float) -> Tensor:
    """The reference's ``theta`` (module docstring, rule ``reference``) for float64 ``T`` (N, 4, 4)."""
    inv = torch.linalg.inv(T)  # T_agent_from_ego, as the reference's solve(T_j, T_ego)
    M, m = inv[:, :2, :2], inv[:, :2, 3]
    sx, sy = (xmax - xmin) / 2.0, (ymax - ymin) / 2.0
    cx, cy = (xmax + xmin) / 2.0, (ymax + ymin) / 2.0
    c = T.new_tensor([cx, cy])
    b = (M @ c + m - c) / T.new_tensor([sx, sy])
    A = torch.stack([torch.stack([M[:, 0, 0], M[:, 0, 1] * sy / sx], dim=-1),
                     torch.stack([M[:, 1, 0] * sx / sy, M[:, 1, 1]], dim=-1)], dim=1)
    return torch.cat([A, b[:, :, None]], dim=2)


def bev_affine_theta(T_ego_from_agent, lidar_range: Sequence[float], device=None,
                     rule: Optional[Rule] = None) -> Tensor:
    """(N, 4, 4) ``T_ego_from_agent`` -> (N, 2, 3) float64 ``theta`` for affine_grid (see module doc;
    ``rule`` None: the enclosing :func:`warp_rule`'s, else native)."""
    T = _as_transforms(T_ego_from_agent, len(T_ego_from_agent), device)
    xmin, ymin, xmax, ymax = _range(lidar_range)
    if _rule(rule) == "reference":
        return _reference_theta(T, xmin, ymin, xmax, ymax)
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


def _grid(theta: Tensor, shape, dtype: torch.dtype, rule: Rule) -> Tensor:
    """affine_grid in the features' dtype (native) or in float64, then cast (reference)."""
    if rule == "reference":
        return F.affine_grid(theta, list(shape), align_corners=False).to(dtype)
    return F.affine_grid(theta.to(dtype), list(shape), align_corners=False)


def warp_to_ego(features: Tensor, T_ego_from_agent, lidar_range: Sequence[float],
                mode: str = "bilinear", rule: Optional[Rule] = None) -> Tensor:
    """features (N, C, H, W) each in its agent's frame -> (N, C, H, W) in the ego frame.

    T_ego_from_agent: (N, 4, 4) tensor or array, agent frame -> ego frame (metres).
    mode: "bilinear" or "nearest". Cells the agent map does not cover are zero.
    rule: "native" or "reference" (module docstring); None: the enclosing :func:`warp_rule`'s.
    """
    if features.dim() != 4:
        raise ValueError(f"warp_to_ego expects features (N, C, H, W), got {tuple(features.shape)}")
    if mode not in ("bilinear", "nearest"):
        raise ValueError(f"warp_to_ego mode must be 'bilinear' or 'nearest', got {mode!r}")
    rule = _rule(rule)
    n = features.shape[0]
    T = _as_transforms(T_ego_from_agent, n, features.device)
    theta = bev_affine_theta(T, lidar_range, features.device, rule)
    grid = _grid(theta, features.shape, features.dtype, rule)
    warped = F.grid_sample(features, grid, mode=mode, padding_mode="zeros", align_corners=False)
    keep = _is_identity(T)
    if bool(keep.any()):
        warped = torch.where(keep[:, None, None, None], features, warped)
    return warped


def warp_mask(T_ego_from_agent, lidar_range: Sequence[float], size: Tuple[int, int],
              device=None, dtype: torch.dtype = torch.float32, rule: Optional[Rule] = None) -> Tensor:
    """(N, 1, H, W) mask in the ego frame: 1 where the ego cell centre lies inside
    the agent's map (``size = (H, W)`` cells over ``lidar_range``), else 0 (``rule`` as
    :func:`warp_to_ego`'s)."""
    n = len(T_ego_from_agent)
    T = _as_transforms(T_ego_from_agent, n, device)
    h, w = int(size[0]), int(size[1])
    theta = bev_affine_theta(T, lidar_range, T.device, rule)
    grid = F.affine_grid(theta, [n, 1, h, w], align_corners=False)
    inside = (grid.abs() <= 1.0).all(dim=-1) | _is_identity(T)[:, None, None]
    return inside[:, None].to(dtype)
