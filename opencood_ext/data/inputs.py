"""Typed model inputs a collated :class:`~opencood_ext.data.batch.Batch` holds per agent type.

``A`` is the number of agents of one type in the batch (agents of all samples
concatenated). The encoders in :mod:`opencood_ext.models` take these.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import torch

from .voxelize import VoxelBatch


def _to(obj, device):
    return type(obj)(**{f.name: (getattr(obj, f.name).to(device) if torch.is_tensor(getattr(obj, f.name))
                                 else getattr(obj, f.name)) for f in fields(obj)})


@dataclass
class LidarInput(VoxelBatch):
    """Voxelised point clouds of ``num_agents`` agents (see :class:`VoxelBatch`).

    coords: (V, 4) ``[agent_index, z, y, x]`` with agent_index in ``[0, num_agents)``;
    agents without any voxel still count in ``num_agents``.
    """

    num_agents: int

    @classmethod
    def from_batch(cls, batch: VoxelBatch, num_agents: int) -> "LidarInput":
        if len(batch.coords) and int(batch.coords[:, 0].max()) >= num_agents:
            raise ValueError(f"voxel coords name agent {int(batch.coords[:, 0].max())} but "
                             f"num_agents is {num_agents}")
        return cls(voxels=batch.voxels, num_points=batch.num_points, coords=batch.coords,
                   num_agents=int(num_agents))

    def to(self, device) -> "LidarInput":
        return _to(self, device)


@dataclass
class CameraInput:
    """Camera images of ``A`` agents with ``Ncam`` cameras each.

    images: (A, Ncam, 3, H, W) float, already normalised.
    K: (A, Ncam, 3, 3) intrinsics scaled to the (H, W) of ``images``.
    T_lidar_from_camera: (A, Ncam, 4, 4) camera pose in the agent's LiDAR frame.
        The camera frame is UE4-style: x forward (optical axis), y right, z up;
        pixel (u, v) at depth d is the camera point ``(d, (u-cx)/fx*d, -(v-cy)/fy*d)``.
        NOTE: OPV2V's yaml ``extrinsic`` is the INVERSE of this matrix (checked on the
        V2XSet fixture: ``inv(extrinsic) == inv(T_world_from_lidar) @ T_world_from_camera``).
    depth: (A, Ncam, H, W) metric depth along the optical axis (camera x), 0 or
        non-finite where unknown; or None.
    """

    images: torch.Tensor
    K: torch.Tensor
    T_lidar_from_camera: torch.Tensor
    depth: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.images.ndim != 5 or self.images.shape[2] != 3:
            raise ValueError(f"CameraInput.images must be (A, Ncam, 3, H, W), got {tuple(self.images.shape)}")
        a, n = self.images.shape[:2]
        if tuple(self.K.shape) != (a, n, 3, 3):
            raise ValueError(f"CameraInput.K must be ({a}, {n}, 3, 3), got {tuple(self.K.shape)}")
        if tuple(self.T_lidar_from_camera.shape) != (a, n, 4, 4):
            raise ValueError(f"CameraInput.T_lidar_from_camera must be ({a}, {n}, 4, 4), "
                             f"got {tuple(self.T_lidar_from_camera.shape)}")
        if self.depth is not None and tuple(self.depth.shape) != (a, n) + tuple(self.images.shape[3:]):
            raise ValueError(f"CameraInput.depth must be ({a}, {n}, H, W) like the images, "
                             f"got {tuple(self.depth.shape)}")

    @property
    def num_agents(self) -> int:
        return int(self.images.shape[0])

    def to(self, device) -> "CameraInput":
        return _to(self, device)
