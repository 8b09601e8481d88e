"""Triangle-mesh primitives for the built-in world (numpy only).

Every function returns ``(vertices (V, 3) float64, triangles (T, 3) int64)``
in the world's left-handed frame (x forward, y right, z up). Winding is not
meaningful: the renderer shades both sides.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

from opencood_ext.deps import require_sim

Mesh = Tuple[np.ndarray, np.ndarray]

_BOX_TRIS = np.array([
    [0, 1, 2], [0, 2, 3], [4, 6, 5], [4, 7, 6],          # bottom, top
    [0, 4, 5], [0, 5, 1], [1, 5, 6], [1, 6, 2],          # sides
    [2, 6, 7], [2, 7, 3], [3, 7, 4], [3, 4, 0],
], dtype=np.int64)


def box(center, size, yaw: float = 0.0) -> Mesh:
    """Box with centre (3,), FULL size (3,) = (length along heading, width, height)."""
    c = np.asarray(center, float)
    half = np.asarray(size, float) / 2.0
    sx = np.array([1, 1, -1, -1, 1, 1, -1, -1], float) * half[0]
    sy = np.array([1, -1, -1, 1, 1, -1, -1, 1], float) * half[1]
    sz = np.array([-1, -1, -1, -1, 1, 1, 1, 1], float) * half[2]
    cy, sn = np.cos(yaw), np.sin(yaw)
    v = np.stack([sx * cy - sy * sn, sx * sn + sy * cy, sz], axis=1) + c
    return v, _BOX_TRIS.copy()


def prism(polygon_xy, z0: float, z1: float) -> Mesh:
    """Vertical prism over a CONVEX polygon (n, 2) from z0 to z1 (caps fan-triangulated)."""
    p = np.asarray(polygon_xy, float)
    n = len(p)
    v = np.empty((2 * n, 3))
    v[:n, :2] = v[n:, :2] = p
    v[:n, 2], v[n:, 2] = z0, z1
    i = np.arange(n)
    j = (i + 1) % n
    sides = np.concatenate([np.stack([i, j, j + n], 1), np.stack([i, j + n, i + n], 1)])
    fan = np.stack([np.zeros(n - 2, int), np.arange(1, n - 1), np.arange(2, n)], 1)
    return v, np.concatenate([sides, fan, fan[:, [0, 2, 1]] + n]).astype(np.int64)


def cylinder(cx: float, cy: float, radius: float, z0: float, z1: float, segments: int = 8) -> Mesh:
    """Vertical cylinder approximated by a regular ``segments``-gon prism."""
    a = np.arange(segments) * (2 * np.pi / segments)
    return prism(np.column_stack([cx + radius * np.cos(a), cy + radius * np.sin(a)]), z0, z1)


def _icosahedron() -> Mesh:
    t = (1 + 5 ** 0.5) / 2
    v = np.array([[-1, t, 0], [1, t, 0], [-1, -t, 0], [1, -t, 0], [0, -1, t], [0, 1, t],
                  [0, -1, -t], [0, 1, -t], [t, 0, -1], [t, 0, 1], [-t, 0, -1], [-t, 0, 1]], float)
    f = np.array([[0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11], [1, 5, 9], [5, 11, 4],
                  [11, 10, 2], [10, 7, 6], [7, 1, 8], [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8],
                  [3, 8, 9], [4, 9, 5], [2, 4, 11], [6, 2, 10], [8, 6, 7], [9, 8, 1]], np.int64)
    return v / np.linalg.norm(v, axis=1, keepdims=True), f


_ICO = _icosahedron()


def ellipsoid(center, radii) -> Mesh:
    """Icosahedron scaled to an ellipsoid (tree crowns, bushes)."""
    v, f = _ICO
    return v * np.asarray(radii, float) + np.asarray(center, float), f.copy()


def hull(points) -> Mesh:
    """Convex hull of (n, 3) points."""
    p = np.asarray(points, float)
    return p, require_sim("scipy.spatial").ConvexHull(p).simplices.astype(np.int64)


def merge(meshes: List[Mesh]) -> Mesh:
    """Concatenate meshes into one (triangle indices offset)."""
    if not meshes:
        return np.zeros((0, 3)), np.zeros((0, 3), np.int64)
    verts, tris, off = [], [], 0
    for v, t in meshes:
        verts.append(v)
        tris.append(t + off)
        off += len(v)
    return np.concatenate(verts), np.concatenate(tris)


def _runs(key: np.ndarray):
    """Runs of equal non-zero values along axis 1 of (A, B) int array.

    Returns (row, start, stop, value) arrays; [start, stop) column range.
    """
    A, B = key.shape
    brk = np.ones((A, B + 1), bool)
    brk[:, 1:B] = key[:, 1:] != key[:, :-1]
    rows, cols = np.nonzero(brk)
    # consecutive breaks within the same row delimit one run
    same = rows[1:] == rows[:-1]
    start, stop, row = cols[:-1][same], cols[1:][same], rows[:-1][same]
    val = key[row, start]
    keep = val != 0
    return row[keep], start[keep], stop[keep], val[keep]


def heightfield(height: np.ndarray, x0: float, y0: float, res: float) -> Mesh:
    """Mesh of a step height field: cell (j, i) covers x in [x0 + i res, +res),
    y in [y0 + j res, +res) at height ``height[j, i]``; tops are merged into row
    runs and the vertical steps between cells (curbs) into runs as well.

    ``height`` must take few distinct values (they are coded as integers).
    """
    levels, code = np.unique(height, return_inverse=True)
    code = code.reshape(height.shape) + 1
    nl = len(levels) + 1
    quads = []  # each (4, 3) corners
    # tops: runs along x in each row
    r, s, e, v = _runs(code)
    z = levels[v - 1]
    ya, yb = y0 + r * res, y0 + (r + 1) * res
    xa, xb = x0 + s * res, x0 + e * res
    quads.append(np.stack([np.c_[xa, ya, z], np.c_[xb, ya, z], np.c_[xb, yb, z], np.c_[xa, yb, z]], 1))
    # steps between columns i and i+1 (faces normal to x), runs along y
    pair = np.where(code[:, 1:] != code[:, :-1], code[:, :-1] * nl + code[:, 1:], 0).T  # (nx-1, ny)
    c, s, e, v = _runs(pair)
    za, zb = levels[v // nl - 1], levels[v % nl - 1]
    x = x0 + (c + 1) * res
    ya, yb = y0 + s * res, y0 + e * res
    quads.append(np.stack([np.c_[x, ya, za], np.c_[x, yb, za], np.c_[x, yb, zb], np.c_[x, ya, zb]], 1))
    # steps between rows j and j+1 (faces normal to y), runs along x
    pair = np.where(code[1:, :] != code[:-1, :], code[:-1, :] * nl + code[1:, :], 0)  # (ny-1, nx)
    r, s, e, v = _runs(pair)
    za, zb = levels[v // nl - 1], levels[v % nl - 1]
    y = y0 + (r + 1) * res
    xa, xb = x0 + s * res, x0 + e * res
    quads.append(np.stack([np.c_[xa, y, za], np.c_[xb, y, za], np.c_[xb, y, zb], np.c_[xa, y, zb]], 1))
    q = np.concatenate(quads)  # (Q, 4, 3)
    base = np.arange(len(q))[:, None] * 4
    tris = np.concatenate([base + [0, 1, 2], base + [0, 2, 3]])
    return q.reshape(-1, 3), tris.astype(np.int64)


def transform_xy(vertices: np.ndarray, x: float, y: float, yaw: float, z: float = 0.0) -> np.ndarray:
    """Rotate (V, 3) vertices by ``yaw`` about +z then translate by (x, y, z)."""
    c, s = np.cos(yaw), np.sin(yaw)
    out = np.empty_like(vertices)
    out[:, 0] = vertices[:, 0] * c - vertices[:, 1] * s + x
    out[:, 1] = vertices[:, 0] * s + vertices[:, 1] * c + y
    out[:, 2] = vertices[:, 2] + z
    return out
