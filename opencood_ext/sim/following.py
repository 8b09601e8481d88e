"""Car following on curved paths: the first obstacle a vehicle's body would
touch if it drove on along its planned path.

Every vehicle is a line segment along its length axis inflated by half its
width (a stadium shape). A moving vehicle's FUTURE poses are sampled along its
path (1 m apart) with both axles on the path; the first future pose whose
segment comes within half-widths + ``lateral_margin`` of another vehicle's
CURRENT body gives the gap (how far its centre may still advance). Candidate
pairs come from a k-d tree radius query, the exact test is point-to-segment.
"""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np

from opencood_ext.deps import require_sim


def bodies(x, y, yaw, length, width):
    """Points along every vehicle's length axis (about 1.5 m apart): xy (P, 2),
    owner index (P,), radius = half width (P,). Inputs are (N,) arrays."""
    n = np.maximum(2, np.ceil(length / 1.5).astype(int) + 1)
    owner = np.repeat(np.arange(len(x)), n)
    k = np.arange(owner.size) - np.repeat(np.cumsum(n) - n, n)
    half = (length - width)[owner] / 2
    t = -half + k * (2 * half / (n[owner] - 1))
    xy = np.c_[x[owner] + t * np.cos(yaw[owner]), y[owner] + t * np.sin(yaw[owner])]
    return xy, owner, width[owner] / 2


def first_obstacles(movers: Sequence[int], paths: Dict[int, tuple], x, y, yaw, length, width, speed,
                    half_wheelbase: Sequence[float], lateral_margin: float) -> Dict[int, Tuple[float, float]]:
    """For each vehicle index in ``movers``: (distance its centre can still
    advance along its path before its swept body would touch another
    vehicle's current body, that vehicle's speed along the path), or
    (inf, 0) when the look-ahead is clear.

    paths[i] = (s (K,) path coordinate with 0 at the centre, xy (K, 2), ...);
    x, y, yaw, length, width, speed: (N,) arrays over ALL vehicles.
    """
    bxy, bown, brad = bodies(x, y, yaw, length, width)
    out = {i: (np.inf, 0.0) for i in movers}
    qc, qown, qs, qhead = [], [], [], []
    for i in movers:
        s, xy, _ = paths[i]
        if len(s) < 2:
            continue
        a = half_wheelbase[i]
        fut = s[(s >= 0.5) & (s <= s[-1] - a)]
        if not len(fut):
            continue
        rear = np.c_[np.interp(fut - a, s, xy[:, 0]), np.interp(fut - a, s, xy[:, 1])]
        front = np.c_[np.interp(fut + a, s, xy[:, 0]), np.interp(fut + a, s, xy[:, 1])]
        qc.append((rear + front) / 2)
        qhead.append(np.arctan2(front[:, 1] - rear[:, 1], front[:, 0] - rear[:, 0]))
        qown.append(np.full(len(fut), i))
        qs.append(fut)
    if not qc:
        return out
    qc, qown, qs, qhead = (np.concatenate(v) for v in (qc, qown, qs, qhead))
    # candidate (future pose, body point) pairs, then the exact test: distance
    # from the body point to the future body's axis segment
    radius = (length - width).max() / 2 + width.max() + lateral_margin
    cKDTree = require_sim("scipy.spatial").cKDTree
    pairs = cKDTree(qc).sparse_distance_matrix(cKDTree(bxy), radius, output_type="ndarray")
    q, j = pairs["i"].astype(np.int64), pairs["j"].astype(np.int64)
    own = qown[q]
    keep = bown[j] != own
    q, j, own = q[keep], j[keep], own[keep]
    if not len(q):
        return out
    hx, hy = np.cos(qhead[q]), np.sin(qhead[q])
    dx, dy = bxy[j, 0] - qc[q, 0], bxy[j, 1] - qc[q, 1]
    half = (length[own] - width[own]) / 2
    along = np.clip(dx * hx + dy * hy, -half, half)
    perp = np.hypot(dx - along * hx, dy - along * hy)
    hit = perp < width[own] / 2 + brad[j] + lateral_margin
    q, j, own = q[hit], j[hit], own[hit]
    if not len(q):
        return out
    order = np.lexsort((qs[q], own))                                   # by owner, then path s
    q, j, own = q[order], j[order], own[order]
    owners, first = np.unique(own, return_index=True)
    for i, r, jj in zip(owners, q[first], j[first]):
        other = bown[jj]
        rel = float(speed[other] * max(0.0, np.cos(yaw[other] - qhead[r])))
        out[int(i)] = (max(0.0, float(qs[r]) - 1.0), rel)
    return out
