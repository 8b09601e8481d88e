"""PointPillars encoder: pillar feature net + scatter to a BEV pseudo-image.

Input :class:`LidarInput` whose voxels are pillars (``voxel_size[2]`` spans the
whole z range, so ``nz == 1``). Output ``(A, C, H, W)`` with ``H = ny`` rows along
y and ``W = nx`` columns along x: the pillar at coords ``[a, 0, y, x]`` lands at
``bev[a, :, y, x]``.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
from torch import nn

from opencood_ext.data.voxelize import grid_shape

from ..data.inputs import LidarInput
from .inputs import EncoderOutput

# x, y, z, intensity + offsets to the pillar's point mean (3) + offsets to the pillar centre (3)
POINT_FEATURES = 10


class PillarFeatureNet(nn.Module):
    """Per-point augmented features -> (Linear, BN, ReLU) layers -> max over the pillar's points.

    Augmented point features (10): x, y, z, intensity, (x, y, z) minus the mean of
    the pillar's valid points, (x, y, z) minus the pillar's geometric centre.
    Padded point slots never reach the BatchNorm statistics nor the max.
    Every layer but the last concatenates its per-point output with the
    pillar-wise max (as in PointPillars), doubling the next layer's input.
    """

    def __init__(self, voxel_size: Sequence[float], lidar_range: Sequence[float],
                 num_filters: Sequence[int] = (64,)):
        super().__init__()
        if not num_filters:
            raise ValueError("PillarFeatureNet.num_filters needs at least one layer width")
        if any(isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in num_filters):
            raise ValueError(f"PillarFeatureNet.num_filters: layer widths must be positive integers, got "
                             f"{list(num_filters)}")
        self.register_buffer("voxel_size", torch.tensor(voxel_size, dtype=torch.float32), persistent=False)
        self.register_buffer("origin", torch.tensor(lidar_range[:3], dtype=torch.float32), persistent=False)
        layers = []
        cin = POINT_FEATURES
        for cout in num_filters:
            layers.append(nn.ModuleDict({"linear": nn.Linear(cin, cout, bias=False),
                                         "norm": nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01)}))
            cin = 2 * cout
        self.layers = nn.ModuleList(layers)
        self.out_channels = int(num_filters[-1])

    def augment(self, voxels: torch.Tensor, num_points: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        """(V, P, 4), (V,), (V, 4) ``[a, z, y, x]`` -> (V, P, 10) augmented features (padding zeroed)."""
        valid = torch.arange(voxels.shape[1], device=voxels.device)[None] < num_points[:, None]
        xyz = voxels[..., :3]
        mean = (xyz * valid[..., None]).sum(1) / num_points.clamp(min=1)[:, None].to(xyz.dtype)
        # coords are [a, z, y, x]; centres in metres, x y z order
        centre = (coords[:, [3, 2, 1]].to(xyz.dtype) + 0.5) * self.voxel_size + self.origin
        feats = torch.cat([voxels[..., :4], xyz - mean[:, None], xyz - centre[:, None]], dim=-1)
        return feats * valid[..., None]

    def forward(self, voxels: torch.Tensor, num_points: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        """-> (V, C) pillar features.

        Works on the valid points only, (Nvalid, .) with ``pillar`` the owning
        voxel of each, so padding costs nothing and never enters BN statistics.
        """
        v, p = voxels.shape[:2]
        valid = torch.arange(p, device=voxels.device)[None] < num_points[:, None]  # (V, P)
        pillar = torch.arange(v, device=voxels.device)[:, None].expand(v, p)[valid]  # (Nvalid,)
        x = self.augment(voxels, num_points, coords)[valid]  # (Nvalid, 10)
        pooled = voxels.new_zeros(v, self.out_channels)
        if x.shape[0] == 0:
            return pooled
        for i, layer in enumerate(self.layers):
            h = layer["norm"](layer["linear"](x)).relu()  # (Nvalid, C)
            # ReLU output is >= 0 and every pillar has >= 1 point, so a zero start cannot win the max.
            pooled = h.new_zeros(v, h.shape[1]).scatter_reduce(
                0, pillar[:, None].expand_as(h), h, reduce="amax", include_self=True)
            if i + 1 < len(self.layers):
                x = torch.cat([h, pooled[pillar]], dim=-1)
        return pooled


def scatter_to_bev(features: torch.Tensor, coords: torch.Tensor, num_agents: int,
                   bev_shape: Tuple[int, int]) -> torch.Tensor:
    """(V, C) pillar features + (V, 4) ``[a, z, y, x]`` -> (A, C, H, W), zeros where no pillar."""
    h, w = bev_shape
    c = features.shape[1]
    canvas = features.new_zeros(num_agents * h * w, c)
    flat = (coords[:, 0].long() * h + coords[:, 2].long()) * w + coords[:, 3].long()
    canvas = canvas.index_copy(0, flat, features)
    return canvas.view(num_agents, h, w, c).permute(0, 3, 1, 2).contiguous()


class PointPillarEncoder(nn.Module):
    """PointPillars: :class:`PillarFeatureNet` then :func:`scatter_to_bev`.

    ``voxel_size[2]`` must cover the whole z extent of ``lidar_range`` (one pillar layer).
    out_channels = ``num_filters[-1]``; output ``(A, C, ny, nx)``, one cell per pillar
    (``bev_cell = (vx, vy)`` metres).
    """

    input_kind = "lidar"

    def __init__(self, lidar_range: Sequence[float], voxel_size: Sequence[float] = (0.4, 0.4, 4.0),
                 num_filters: Sequence[int] = (64,)):
        super().__init__()
        nz, ny, nx = grid_shape(lidar_range, voxel_size)
        if nz != 1:
            raise ValueError(f"pointpillars: voxel_size[2]={voxel_size[2]} must span the z range "
                             f"{lidar_range[2]}..{lidar_range[5]} (got {nz} layers)")
        self.lidar_range = tuple(float(x) for x in lidar_range)
        self.voxel_size = tuple(float(x) for x in voxel_size)
        self.pfn = PillarFeatureNet(voxel_size, lidar_range, num_filters)
        self.out_channels = self.pfn.out_channels
        self.bev_shape = (ny, nx)
        self.bev_cell = (self.voxel_size[0], self.voxel_size[1])

    def forward(self, data: LidarInput) -> EncoderOutput:
        feats = self.pfn(data.voxels, data.num_points, data.coords)
        return EncoderOutput(bev=scatter_to_bev(feats, data.coords, data.num_agents, self.bev_shape))
