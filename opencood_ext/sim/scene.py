"""Embree ray casting over a static town and per-tick vehicles.

Geometry lives in at most two open3d ``RaycastingScene`` objects: the STATIC
one (ground, buildings, props, parked cars) is built once per scenario; the
DYNAMIC one (moving vehicles) is rebuilt every tick from one merged mesh
(open3d cannot move or remove geometry in a built scene). A ray's first hit
is the nearer of the two. ``single_scene=True`` instead rebuilds one scene
with everything each tick (kept for the benchmark comparison).

Each scene holds ONE merged mesh, so Embree's primitive id indexes a
per-triangle ``surface`` array, and the surface id indexes the
:class:`SurfaceTable` (object id, class, colour, LiDAR reflectivity,
procedural pattern) -- a finer-grained version of a geometry-id table that
lets one vehicle carry paint, glass and tyres under one object id.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from opencood_ext.deps import require_sim

from .meshes import Mesh


# surface classes (index into CLASS_NAMES)
CLASS_NAMES = ("ground", "building", "wall", "pole", "vegetation", "vehicle", "rsu")
CLS = {n: i for i, n in enumerate(CLASS_NAMES)}
# procedural patterns evaluated at the hit point
PATTERN_NONE, PATTERN_GROUND, PATTERN_FACADE = 0, 1, 2


@dataclass
class SurfaceTable:
    """Per-surface attributes, (S,) arrays; surface i is row i."""

    object_id: List[int] = field(default_factory=list)   # -1: not a labelled object
    cls: List[int] = field(default_factory=list)
    color: List[Tuple[float, float, float]] = field(default_factory=list)  # RGB 0..1
    reflectivity: List[float] = field(default_factory=list)  # LiDAR intensity factor 0..1
    pattern: List[int] = field(default_factory=list)

    def add(self, cls: str, color, reflectivity: float, object_id: int = -1,
            pattern: int = PATTERN_NONE) -> int:
        self.object_id.append(int(object_id))
        self.cls.append(CLS[cls])
        self.color.append(tuple(float(c) for c in color))
        self.reflectivity.append(float(reflectivity))
        self.pattern.append(int(pattern))
        return len(self.cls) - 1

    def freeze(self) -> "FrozenSurfaces":
        return FrozenSurfaces(np.asarray(self.object_id, np.int64), np.asarray(self.cls, np.int16),
                              np.asarray(self.color, np.float32).reshape(-1, 3),
                              np.asarray(self.reflectivity, np.float32),
                              np.asarray(self.pattern, np.int8))


@dataclass
class FrozenSurfaces:
    object_id: np.ndarray
    cls: np.ndarray
    color: np.ndarray
    reflectivity: np.ndarray
    pattern: np.ndarray


@dataclass
class GroundTexture:
    """Ground material raster: cell (j, i) covers x in [x0 + i res, +res), y in [y0 + j res, +res).

    codes: (ny, nx) uint8 into ``colors`` (K, 3) and ``reflectivity`` (K,).
    """

    codes: np.ndarray
    x0: float
    y0: float
    res: float
    colors: np.ndarray
    reflectivity: np.ndarray
    outside: int = 0  # code used off the raster

    def lookup(self, xy: np.ndarray) -> np.ndarray:
        """(N, 2) world xy -> (N,) codes."""
        ny, nx = self.codes.shape
        i = np.floor((xy[:, 0] - self.x0) * (1.0 / self.res)).astype(np.int32)
        j = np.floor((xy[:, 1] - self.y0) * (1.0 / self.res)).astype(np.int32)
        out = self.codes.ravel().take(np.clip(j, 0, ny - 1) * nx + np.clip(i, 0, nx - 1))
        off = (i < 0) | (i >= nx) | (j < 0) | (j >= ny)
        if off.any():
            out[off] = self.outside
        return out


@dataclass
class Hits:
    """First hits of N rays. t: (N,) float32 distance (inf: none; unit-length
    directions give metres); surface: (N,) int32 (-1: none); normal: (N, 3)
    float32 geometric normal (unoriented)."""

    t: np.ndarray
    surface: np.ndarray
    normal: np.ndarray

    @property
    def hit(self) -> np.ndarray:
        return self.surface >= 0


def rotate(vectors: np.ndarray, R: np.ndarray) -> np.ndarray:
    """(N, 3) float32 vectors rotated by (3, 3) ``R`` (``R @ v`` per row), with
    element-wise arithmetic: a BLAS matmul would start threads that fight
    Embree's for the cores. Each output column is ``v0 R[k, 0] + v1 R[k, 1] +
    v2 R[k, 2]`` in that order, over whole columns (a broadcast over rows of 3
    runs numpy's inner loop once per row, three times slower)."""
    R = np.asarray(R, np.float32)
    v = np.asarray(vectors, np.float32)
    out = np.empty((len(v), 3), np.float32)
    tmp = np.empty(len(v), np.float32)
    for k in range(3):
        col = out[:, k]
        np.multiply(v[:, 0], R[k, 0], out=col)
        col += np.multiply(v[:, 1], R[k, 1], out=tmp)
        col += np.multiply(v[:, 2], R[k, 2], out=tmp)
    return out


def along_rays(origin: np.ndarray, directions: np.ndarray, t: np.ndarray) -> np.ndarray:
    """(N, 3) float32 points ``origin + directions * t[:, None]``, column by column
    (the same float32 operations as the broadcast, without its per-row loop)."""
    o = np.asarray(origin, np.float32)
    out = np.empty((len(directions), 3), np.float32)
    for k in range(3):
        col = out[:, k]
        np.multiply(directions[:, k], t, out=col)
        col += o[k]
    return out


def _o3c():
    """open3d.core, imported on first use (the ``sim`` extra)."""
    return require_sim("open3d").core


def _build(vertices: np.ndarray, triangles: np.ndarray):
    scene = require_sim("open3d").t.geometry.RaycastingScene(nthreads=0)
    if len(triangles):
        scene.add_triangles(_o3c().Tensor.from_numpy(np.ascontiguousarray(vertices, np.float32)),
                            _o3c().Tensor.from_numpy(np.ascontiguousarray(triangles, np.uint32)))
    return scene


class RayScene:
    """Static + dynamic Embree scenes sharing one :class:`SurfaceTable`.

    static: merged mesh (V, 3), (T, 3) with ``static_surface`` (T,) surface ids.
    ground: texture for surfaces with ``PATTERN_GROUND``.
    """

    def __init__(self, surfaces: SurfaceTable, static: Mesh, static_surface: np.ndarray,
                 ground: Optional[GroundTexture] = None, single_scene: bool = False):
        self.surfaces = surfaces.freeze()
        # lookup tables with one extra "no hit" row of zeros
        self._color = np.concatenate([self.surfaces.color, np.zeros((1, 3), np.float32)])
        self._refl = np.concatenate([self.surfaces.reflectivity, np.zeros(1, np.float32)])
        self._pattern = np.concatenate([self.surfaces.pattern, np.zeros(1, np.int8)])
        self.ground = ground
        # colour rows per surface, then per ground material code (gathered in one take)
        self._color_ext = self._color if ground is None else \
            np.concatenate([self._color, np.asarray(ground.colors).astype(np.float32).reshape(-1, 3)])
        self.single_scene = single_scene
        self._static_mesh = (np.asarray(static[0], np.float32), np.asarray(static[1], np.int64))
        self._static_surface = np.asarray(static_surface, np.int32)
        if len(self._static_surface) != len(self._static_mesh[1]):
            raise ValueError("RayScene: static_surface needs one surface id per triangle")
        self._static = None if single_scene else _build(*self._static_mesh)
        self._dynamic = None
        self._dynamic_surface = np.zeros(0, np.int32)
        self.set_dynamic((np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int64)), np.zeros(0, np.int32))

    def set_dynamic(self, mesh: Mesh, surface: np.ndarray) -> None:
        """Replace the moving geometry (one merged mesh, one surface id per triangle)."""
        v, t = mesh
        surface = np.asarray(surface, np.int32)
        if self.single_scene:
            sv, st = self._static_mesh
            self._dynamic = _build(np.concatenate([sv, v]), np.concatenate([st, t + len(sv)]))
            self._dynamic_surface = np.concatenate([self._static_surface, surface])
        else:
            self._dynamic = _build(v, t)
            self._dynamic_surface = surface

    @staticmethod
    def _cast_one(scene, rays: np.ndarray, table: np.ndarray):
        out = scene.cast_rays(_o3c().Tensor.from_numpy(rays))
        t = out["t_hit"].numpy()
        prim = out["primitive_ids"].numpy()
        hit = np.isfinite(t)
        surf = np.full(t.shape, -1, np.int32)
        if len(table):
            surf[hit] = table.take(prim[hit])
        return t, surf, out["primitive_normals"].numpy()

    def cast(self, origins: np.ndarray, directions: np.ndarray) -> Hits:
        """Cast rays: origins (N, 3) or (3,), directions (N, 3) (unit length for
        metric ``t``). Returns the nearest hit over both scenes."""
        d = np.asarray(directions, np.float32)
        rays = np.empty((len(d), 6), np.float32)
        rays[:, :3] = origins
        rays[:, 3:] = d
        t, surf, nrm = self._cast_one(self._dynamic, rays, self._dynamic_surface)
        if self._static is not None:
            ts, ss, ns = self._cast_one(self._static, rays, self._static_surface)
            closer = ts < t
            np.copyto(t, ts, where=closer)
            np.copyto(surf, ss, where=closer)
            for k in range(3):   # per column: a (N, 1) mask broadcast over 3 loops once per row
                np.copyto(nrm[:, k], ns[:, k], where=closer)
        return Hits(t, surf, nrm)

    def occluded(self, origins: np.ndarray, directions: np.ndarray, tfar: float = 1e4) -> np.ndarray:
        """(N,) bool: does a ray hit anything closer than ``tfar``?"""
        rays = np.empty((len(directions), 6), np.float32)
        rays[:, :3] = origins
        rays[:, 3:] = directions
        rt = _o3c().Tensor.from_numpy(rays)
        occ = self._dynamic.test_occlusions(rt, tfar=tfar).numpy().astype(bool)
        if self._static is not None:
            occ |= self._static.test_occlusions(rt, tfar=tfar).numpy().astype(bool)
        return occ

    def material(self, hits: Hits, points_world: np.ndarray, color: bool = True):
        """Colour (N, 3) float32 0..1 (None with ``color=False``) and LiDAR
        reflectivity (N,) float32 of hit surfaces (rows without a hit get
        zeros), with procedural patterns."""
        s = self.surfaces
        hit = hits.hit
        idx = np.where(hit, hits.surface, len(s.cls))      # the extra last row is "nothing"
        want_color = color
        refl = self._refl.take(idx)
        pattern = self._pattern.take(idx)
        g = np.nonzero(pattern == PATTERN_GROUND)[0]
        color_idx = idx
        if self.ground is not None and len(g):
            pw = np.asarray(points_world)
            xy = np.empty((len(g), 2), pw.dtype)
            xy[:, 0], xy[:, 1] = pw[:, 0].take(g), pw[:, 1].take(g)
            code = self.ground.lookup(xy)
            if want_color:   # ground colours are rows of the extended table
                color_idx = idx.copy()
                color_idx[g] = len(self._color) + code.astype(np.int64)
            refl[g] = self.ground.reflectivity[code]
        color = self._color_ext.take(color_idx, axis=0) if want_color else None
        f = np.nonzero(pattern == PATTERN_FACADE)[0]
        if len(f):
            px, py, pz = (points_world[:, k].take(f) for k in range(3))
            nx, ny, nz = (np.abs(hits.normal[:, k].take(f)) for k in range(3))
            along = np.where(nx > ny, py, px)
            storey = np.mod(pz, 3.2)
            bay = np.mod(along, 2.8)
            window = (storey > 1.0) & (storey < 2.4) & (bay > 0.5) & (bay < 2.3) & (pz > 0.9) & (nz < 0.5)
            w = f[window]
            if want_color:
                color[w] = color[w] * 0.25 + np.array([0.12, 0.16, 0.22], np.float32)
            refl[w] *= 0.7
        return color, refl

    def object_ids(self, hits: Hits) -> np.ndarray:
        """(N,) int64 labelled object id per hit, -1 for none."""
        out = self.surfaces.object_id[np.maximum(hits.surface, 0)]
        return np.where(hits.hit, out, -1)

    def classes(self, hits: Hits) -> np.ndarray:
        """(N,) int16 surface class per hit, -1 for none."""
        return np.where(hits.hit, self.surfaces.cls[np.maximum(hits.surface, 0)], -1)
