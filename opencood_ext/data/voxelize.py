"""Point cloud -> voxels (pillars for PointPillars, small cubes for SECOND).

Grid convention shared by every BEV module of the project:

* ``lidar_range = (xmin, ymin, zmin, xmax, ymax, zmax)`` in the LiDAR frame (metres),
  ``voxel_size = (vx, vy, vz)``; the grid has ``nx = (xmax - xmin) / vx`` columns,
  ``ny`` rows and ``nz`` layers (each must come out an integer).
* Voxel coordinates are ``[z, y, x]`` integer indices with
  ``x = floor((px - xmin) / vx)`` etc.; a BEV map ``(A, C, H, W)`` has ``H = ny``
  along y and ``W = nx`` along x, so row = ``(py - ymin) / vy``.

Points outside ``lidar_range`` are dropped. Voxelisation uses spconv's
``PointToVoxel`` (it runs on the CPU, in data-loader workers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
import torch

from ..deps import require_spconv


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
                         f"voxel_size 3 (vx, vy, vz); got {list(r)} and {list(v)}")
    if np.any(v <= 0) or np.any(r[3:] <= r[:3]):
        raise ValueError(f"need voxel_size > 0 and max > min in lidar_range; got {list(v)}, {list(r)}")
    n = (r[3:] - r[:3]) / v
    if np.any(np.abs(n - np.round(n)) > 1e-4):
        raise ValueError(f"lidar_range extent {list(r[3:] - r[:3])} is not a whole number of voxels "
                         f"of size {list(v)} (got {list(n)} voxels)")
    nx, ny, nz = (int(round(x)) for x in n)
    return nz, ny, nx


class Voxelizer:
    """Turn an (N, 4) point cloud (x, y, z, intensity; LiDAR frame) into :class:`VoxelData`.

    ``max_points_per_voxel`` points are kept per voxel (the first ones met),
    at most ``max_voxels`` voxels per cloud.
    """

    def __init__(self, voxel_size: Sequence[float], lidar_range: Sequence[float],
                 max_points_per_voxel: int = 32, max_voxels: int = 32000):
        PointToVoxel = require_spconv("spconv.pytorch.utils").PointToVoxel
        self.grid = grid_shape(lidar_range, voxel_size)
        if max_points_per_voxel < 1 or max_voxels < 1:
            raise ValueError(f"max_points_per_voxel and max_voxels must be >= 1, got "
                             f"{max_points_per_voxel}, {max_voxels}")
        self.voxel_size = [float(x) for x in voxel_size]
        self.lidar_range = [float(x) for x in lidar_range]
        self.max_points_per_voxel = int(max_points_per_voxel)
        self.max_voxels = int(max_voxels)
        self._gen = PointToVoxel(vsize_xyz=self.voxel_size, coors_range_xyz=self.lidar_range,
                                 num_point_features=4, max_num_voxels=self.max_voxels,
                                 max_num_points_per_voxel=self.max_points_per_voxel,
                                 device=torch.device("cpu"))

    def __call__(self, points) -> VoxelData:
        pts = torch.as_tensor(np.asarray(points, dtype=np.float32) if not torch.is_tensor(points)
                              else points.detach().to("cpu", torch.float32))
        if pts.ndim != 2 or pts.shape[1] != 4:
            raise ValueError(f"Voxelizer expects (N, 4) points x, y, z, intensity; got {tuple(pts.shape)}")
        pts = pts[torch.isfinite(pts).all(dim=1)].contiguous()
        voxels, coords, num = self._gen(pts)
        # PointToVoxel reuses internal buffers: copy so results outlive the next call.
        return VoxelData(voxels=voxels.clone(), num_points=num.clone().int(), coords=coords.clone().int())


def collate_voxels(items: List[VoxelData]) -> VoxelBatch:
    """Concatenate per-agent voxels; ``coords`` gains the agent index (list position) in front."""
    if not items:
        raise ValueError("collate_voxels needs at least one VoxelData")
    coords = [torch.cat([torch.full((len(d.coords), 1), i, dtype=torch.int32), d.coords.int()], dim=1)
              for i, d in enumerate(items)]
    return VoxelBatch(voxels=torch.cat([d.voxels for d in items]),
                      num_points=torch.cat([d.num_points.int() for d in items]),
                      coords=torch.cat(coords))
