"""Point cloud -> voxels (pillars for PointPillars, small cubes for SECOND).

Grid convention shared by every BEV module of the project:

* ``lidar_range = (xmin, ymin, zmin, xmax, ymax, zmax)`` in the LiDAR frame (metres),
  ``voxel_size = (vx, vy, vz)``; the grid has ``nx = (xmax - xmin) / vx`` columns,
  ``ny`` rows and ``nz`` layers (each must come out an integer).
* Voxel coordinates are ``[z, y, x]`` integer indices with
  ``x = floor((px - xmin) / vx)`` etc. (float32 arithmetic); a BEV map ``(A, C, H, W)`` has
  ``H = ny`` along y and ``W = nx`` along x, so row = ``(py - ymin) / vy``.

Points outside ``lidar_range`` are dropped: a point is kept when every index (computed in
float32) lies in ``[0, n)``, so a point exactly on ``xmin`` is in column 0.

Two implementations give identical output (same voxels in the same order, same points kept):
:func:`voxelize_points`, pure PyTorch, and spconv's ``PointToVoxel`` (CPU). Their shared rules:
voxels are numbered in the order their first point appears in the input; a voxel keeps the first
``max_points_per_voxel`` of its points in input order; once ``max_voxels`` voxels exist, points
of a new voxel are dropped while later points of existing voxels are still added.
:class:`Voxelizer` uses spconv when it is installed (it measured faster:
``python tools/bench.py voxelize``) and the PyTorch one otherwise, so voxelising, and with it
everything but the SECOND encoder, works without spconv.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
import torch

from ..deps import MissingDependency, require_spconv

BACKENDS = ("auto", "torch", "spconv")
# ``backend="auto"`` takes spconv when importable: ``python tools/bench.py voxelize`` measured its
# C++ loop faster than voxelize_points (see Voxelizer).
AUTO_PREFERS_SPCONV = True


@dataclass
class VoxelData:
    """Voxels of one point cloud.

    voxels: (V, P, 4) float32 x, y, z, intensity; rows past ``num_points`` are zero.
    num_points: (V,) int32 number of valid points per voxel (>= 1).
    coords: (V, 3) int32 voxel indices ``[z, y, x]``.
    """

    voxels: torch.Tensor
    num_points: torch.Tensor
    coords: torch.Tensor


@dataclass
class VoxelBatch:
    """Voxels of several agents' point clouds, concatenated.

    voxels: (V, P, 4) float32; num_points: (V,) int32;
    coords: (V, 4) int32 ``[agent_index, z, y, x]``.
    """

    voxels: torch.Tensor
    num_points: torch.Tensor
    coords: torch.Tensor

    def to(self, device) -> "VoxelBatch":
        return type(self)(**{k: (v.to(device) if torch.is_tensor(v) else v)
                             for k, v in self.__dict__.items()})


def grid_shape(lidar_range: Sequence[float], voxel_size: Sequence[float]) -> Tuple[int, int, int]:
    """``(nz, ny, nx)`` of the voxel grid; raises if the range is not a whole number of voxels."""
    r = np.asarray(lidar_range, dtype=np.float64).reshape(-1)
    v = np.asarray(voxel_size, dtype=np.float64).reshape(-1)
    if r.size != 6 or v.size != 3:
        raise ValueError(f"lidar_range needs 6 values (xmin, ymin, zmin, xmax, ymax, zmax) and "
                         f"voxel_size 3 (vx, vy, vz); got {r.tolist()} and {v.tolist()}")
    if np.any(v <= 0) or np.any(r[3:] <= r[:3]):
        raise ValueError(f"need voxel_size > 0 and max > min in lidar_range; got {v.tolist()}, {r.tolist()}")
    n = (r[3:] - r[:3]) / v
    if np.any(np.abs(n - np.round(n)) > 1e-4):
        raise ValueError(f"lidar_range extent {(r[3:] - r[:3]).tolist()} is not a whole number of voxels "
                         f"of size {v.tolist()} (got {[round(x, 4) for x in n.tolist()]} voxels)")
    nx, ny, nz = (int(round(x)) for x in n)
    return nz, ny, nx


_ROW_DTYPES = {4: torch.int32, 8: torch.int64, 16: torch.complex128}


def _rows_as_elements(t: torch.Tensor):
    """A 1-D view of contiguous float32 ``t`` (R, C) whose element i is row i (bytes reinterpreted),
    so a row gather / scatter is one 1-D index op (several times faster than row-wise copies);
    None when no dtype has the row's width or the data is not aligned for it."""
    dtype = _ROW_DTYPES.get(t.shape[1] * t.element_size())
    if dtype is None or not t.is_contiguous() or t.data_ptr() % (t.shape[1] * t.element_size()):
        return None
    return t.view(dtype).view(-1)


def voxelize_points(points: torch.Tensor, voxel_size: Sequence[float], lidar_range: Sequence[float],
                    max_points_per_voxel: int, max_voxels: int
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Voxelise ``points`` (N, C >= 3; x, y, z first, LiDAR frame; made float32 first) with the rules
    of the module docstring, in pure PyTorch on the points' device (the data loader's CPU).

    Returns ``voxels`` (V, P, C) float32 zero-padded, ``coords`` (V, 3) int32 ``[z, y, x]`` and
    ``num_points`` (V,) int32, with V <= ``max_voxels`` and P = ``max_points_per_voxel``: the same
    tensors as spconv 2.3.8's CPU ``PointToVoxel``. A point whose x, y or z is not finite is dropped
    (other channels are copied as they are). One stable sort of the points' linear voxel index
    groups them by voxel with each group in input order; the first point of a group gives the voxel
    its number. No Python loop over points.
    """
    nz, ny, nx = grid_shape(lidar_range, voxel_size)
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"voxelize_points expects (N, C >= 3) points; got {tuple(points.shape)}")
    if max_points_per_voxel < 1 or max_voxels < 1:
        raise ValueError(f"max_points_per_voxel and max_voxels must be >= 1, got "
                         f"{max_points_per_voxel}, {max_voxels}")
    points = points.float().contiguous()
    dev, C = points.device, points.shape[1]
    P, cells = int(max_points_per_voxel), nx * ny * nz
    kdt = torch.int32 if cells < 2 ** 31 - 1 else torch.int64
    ok, key = None, None
    # axis by axis: 1-D ops on a column are faster than broadcasting over (N, 3). The 0-dim float32
    # operands keep the arithmetic IEEE float32, as spconv's floor((p - min) / v).
    for axis, n, stride in ((2, nz, ny * nx), (1, ny, nx), (0, nx, 1)):
        q = points[:, axis].sub(torch.tensor(float(lidar_range[axis]), dtype=torch.float32, device=dev))
        q = q.div_(torch.tensor(float(voxel_size[axis]), dtype=torch.float32, device=dev)).floor_()
        inside = (q >= 0) & (q < n)  # False for NaN and +-inf
        ok = inside if ok is None else ok.logical_and_(inside)
        qi = q.to(kdt) * stride  # meaningless where not inside: replaced below
        key = qi if key is None else key.add_(qi)
    key = key.masked_fill_(~ok, cells)  # points outside the range sort after every voxel
    m = int(ok.sum())
    skey, perm = torch.sort(key, stable=True)
    skey, perm = skey[:m], perm[:m]  # in-range points grouped by voxel, each group in input order
    new = torch.ones(m, dtype=torch.bool, device=dev)
    torch.ne(skey[1:], skey[:-1], out=new[1:])
    starts = new.nonzero().squeeze(1)  # (G,) sorted position of each voxel's first point
    g = starts.numel()
    counts = torch.diff(starts, append=torch.tensor([m], device=dev))
    order = torch.sort(perm.index_select(0, starts)).indices  # order[r] = group of voxel number r
    v = min(g, int(max_voxels))
    rank = torch.empty(g, dtype=torch.int64, device=dev)
    rank[order] = torch.arange(g, device=dev)
    slot = torch.arange(m, device=dev) - torch.repeat_interleave(starts, counts)  # place in its voxel
    dest = torch.repeat_interleave(rank * P, counts).add_(slot)  # row in the (V * P, C) output
    dump = v * P  # one spare row takes the points not kept (past P in a voxel, or past V voxels)
    keep = slot < P
    if v < g:
        keep &= dest < dump
    dest = dest.masked_fill_(~keep, dump)
    voxels = torch.zeros(dump + 1, C, dtype=torch.float32, device=dev)
    src, out = _rows_as_elements(points), _rows_as_elements(voxels)
    if src is not None and out is not None:
        out.scatter_(0, dest, src.index_select(0, perm))
    else:
        voxels.index_copy_(0, dest, points.index_select(0, perm))
    first = order[:v]
    k = skey.index_select(0, starts.index_select(0, first)).long()
    coords = torch.stack([k // (ny * nx), k // nx % ny, k % nx], dim=1).int()
    num = counts.index_select(0, first).clamp_(max=P).int()
    return voxels[:dump].view(v, P, C), coords, num




class Voxelizer:
    """Turn an (N, 4) point cloud (x, y, z, intensity; LiDAR frame) into :class:`VoxelData`.

    ``max_points_per_voxel`` points are kept per voxel (the first ones met), at most
    ``max_voxels`` voxels per cloud; rows with a non-finite value are dropped first.
    ``backend``: ``"torch"`` (:func:`voxelize_points`), ``"spconv"`` (spconv's CPU
    ``PointToVoxel``; a :class:`~opencood_ext.deps.MissingDependency` naming the choice when spconv
    is not installed) or ``"auto"``: spconv when it can be imported, else torch. Both give identical
    tensors (``tests/opencood_ext/data/test_voxelize_torch.py``). ``python tools/bench.py voxelize`` (one
    thread, 30k-120k point clouds, PointPillars and SECOND grids, ``max_voxels`` 32000 or 70000) measured the torch
    one 0.9-1.7x spconv's time (mostly 1.2-1.5x), hence ``auto``'s preference.
    """

    def __init__(self, voxel_size: Sequence[float], lidar_range: Sequence[float],
                 max_points_per_voxel: int = 32, max_voxels: int = 32000, backend: str = "auto"):
        if backend not in BACKENDS:
            raise ValueError(f"Voxelizer backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        self.grid = grid_shape(lidar_range, voxel_size)
        if max_points_per_voxel < 1 or max_voxels < 1:
            raise ValueError(f"max_points_per_voxel and max_voxels must be >= 1, got "
                             f"{max_points_per_voxel}, {max_voxels}")
        self.voxel_size = [float(x) for x in voxel_size]
        self.lidar_range = [float(x) for x in lidar_range]
        self.max_points_per_voxel = int(max_points_per_voxel)
        self.max_voxels = int(max_voxels)
        self._gen = None
        if backend == "spconv" or (backend == "auto" and AUTO_PREFERS_SPCONV):
            try:
                PointToVoxel = require_spconv("spconv.pytorch.utils").PointToVoxel
            except MissingDependency as exc:
                if backend == "spconv":
                    raise MissingDependency(f"Voxelizer backend 'spconv': {exc}") from exc
            else:
                self._gen = PointToVoxel(vsize_xyz=self.voxel_size, coors_range_xyz=self.lidar_range,
                                         num_point_features=4, max_num_voxels=self.max_voxels,
                                         max_num_points_per_voxel=self.max_points_per_voxel,
                                         device=torch.device("cpu"))
        self.backend = "torch" if self._gen is None else "spconv"

    def __call__(self, points) -> VoxelData:
        pts = torch.as_tensor(np.asarray(points, dtype=np.float32) if not torch.is_tensor(points)
                              else points.detach().to("cpu", torch.float32))
        if pts.ndim != 2 or pts.shape[1] != 4:
            raise ValueError(f"Voxelizer expects (N, 4) points x, y, z, intensity; got {tuple(pts.shape)}")
        # the finite check in numpy: torch's per-row reduction and mask took 20-70x longer with two
        # threads on a busy 2-core CPU (72 ms for a 56k-point scan, most of the voxeliser's time)
        finite = np.isfinite(pts.numpy())
        pts = pts.clone() if finite.all() else pts[torch.from_numpy(finite.all(axis=1))].contiguous()
        if self._gen is None:
            voxels, coords, num = voxelize_points(pts, self.voxel_size, self.lidar_range,
                                                  self.max_points_per_voxel, self.max_voxels)
            return VoxelData(voxels=voxels, num_points=num, coords=coords)
        voxels, coords, num = self._gen(pts)  # spconv returns copies of its reused buffers
        return VoxelData(voxels=voxels, num_points=num.int(), coords=coords.int())


def collate_voxels(items: List[VoxelData]) -> VoxelBatch:
    """Concatenate per-agent voxels; ``coords`` gains the agent index (list position) in front."""
    if not items:
        raise ValueError("collate_voxels needs at least one VoxelData")
    coords = [torch.cat([torch.full((len(d.coords), 1), i, dtype=torch.int32), d.coords.int()], dim=1)
              for i, d in enumerate(items)]
    return VoxelBatch(voxels=torch.cat([d.voxels for d in items]),
                      num_points=torch.cat([d.num_points.int() for d in items]),
                      coords=torch.cat(coords))
