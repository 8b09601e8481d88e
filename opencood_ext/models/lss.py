"""Lift-Splat-Shoot camera encoder (no pretrained weights).

Per camera image: a small conv backbone (stride ``s = 2 ** len(channels)``)
predicts, for each feature pixel, logits over ``D`` depth bins and a
``context_channels`` feature. Lift: the feature is spread along the pixel's ray
with the softmaxed depth weights. Splat: every frustum point is moved into the
agent's LiDAR frame and sum-pooled into the BEV grid (an accumulating ``index_put``; only the
frustum points inside the grid are formed).

Geometry (verified on the V2XSet fixture, camera0 sees the vehicle ahead where
this model predicts it):

* Camera frame is UE4-style: x forward along the optical axis, y right, z up.
  Image coordinates are continuous, pixel column j spanning ``[j, j + 1)``;
  feature pixel (i, j) looks through image point ``u = (j + 0.5) s``,
  ``v = (i + 0.5) s``. At depth d it is the camera point
  ``(d, (u - cx) / fx * d, -(v - cy) / fy * d)``.
* ``p_lidar = T_lidar_from_camera @ p_camera``; OPV2V's yaml ``extrinsic`` is the
  inverse of ``T_lidar_from_camera``.
* Depth bins ``depth_bins = (dmin, dmax, step)``: bin k covers
  ``[dmin + k step, dmin + (k + 1) step)`` and lifts to its centre.
* BEV grid: ``lidar_range`` with cells ``voxel_size[:2]``; ``voxel_size[2]`` must
  span the z range (all heights inside it are summed). Output ``(A, C, H, W)``,
  H along y, W along x.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from opencood_ext.data.voxelize import grid_shape

from ..data.inputs import CameraInput
from .inputs import EncoderOutput


def _conv_bn_relu(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


def bin_centers(depth_bins: Sequence[float]) -> torch.Tensor:
    """(D,) centres of the bins ``(dmin, dmax, step)``."""
    dmin, dmax, step = (float(x) for x in depth_bins)
    n = int(round((dmax - dmin) / step))
    if step <= 0 or dmin <= 0 or n < 1 or abs(n * step - (dmax - dmin)) > 1e-6:
        raise ValueError(f"depth_bins (dmin, dmax, step) must have 0 < dmin < dmax and a whole number of "
                         f"steps; got {list(depth_bins)}")
    return dmin + (torch.arange(n, dtype=torch.float32) + 0.5) * step


def frustum_points(K: torch.Tensor, T_lidar_from_camera: torch.Tensor, feature_hw: Tuple[int, int],
                   stride: int, depths: torch.Tensor) -> torch.Tensor:
    """LiDAR-frame position of every (depth bin, feature pixel).

    K: (A, N, 3, 3); T_lidar_from_camera: (A, N, 4, 4); depths: (D,).
    Returns (A, N, D, h, w, 3).
    """
    h, w = feature_hw
    dev, dt = K.device, K.dtype
    v = (torch.arange(h, device=dev, dtype=dt) + 0.5) * stride
    u = (torch.arange(w, device=dev, dtype=dt) + 0.5) * stride
    fx, fy = K[..., 0, 0, None, None], K[..., 1, 1, None, None]  # (A, N, 1, 1)
    cx, cy = K[..., 0, 2, None, None], K[..., 1, 2, None, None]
    ray_y = ((u[None, None, None, :] - cx) / fx).expand(*K.shape[:2], h, w)  # per unit depth
    ray_z = (-(v[None, None, :, None] - cy) / fy).expand(*K.shape[:2], h, w)
    ray = torch.stack([torch.ones_like(ray_y), ray_y, ray_z], dim=-1)  # (A, N, h, w, 3)
    cam = ray[:, :, None] * depths.to(dev, dt)[None, None, :, None, None, None]  # (A, N, D, h, w, 3)
    R = T_lidar_from_camera[..., :3, :3].to(dt)
    t = T_lidar_from_camera[..., :3, 3].to(dt)
    return torch.einsum("anij,andhwj->andhwi", R, cam) + t[:, :, None, None, None, :]


def splat_cells(points: torch.Tensor, lidar_range: Sequence[float],
                bev_shape: Tuple[int, int]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which frustum points land in the BEV grid, and where.

    points: (A, ..., 3) LiDAR-frame positions. Returns ``keep`` (K,) positions of the kept points in
    the flattened ``(A, M)`` point list (M = the product of the middle dims), ascending; ``agent``
    (K,) and ``cell`` (K,) their agent and flat BEV cell ``row * W + col``. Points outside
    ``lidar_range`` are dropped.
    """
    a = points.shape[0]
    H, W = bev_shape
    xmin, ymin, zmin, xmax, ymax, zmax = (float(x) for x in lidar_range)
    pts = points.detach().reshape(-1, 3)
    col = torch.floor((pts[:, 0] - xmin) / ((xmax - xmin) / W)).long()
    row = torch.floor((pts[:, 1] - ymin) / ((ymax - ymin) / H)).long()
    inside = ((col >= 0) & (col < W) & (row >= 0) & (row < H)
              & (pts[:, 2] >= zmin) & (pts[:, 2] < zmax))
    keep = inside.nonzero().squeeze(1)
    per_agent = pts.shape[0] // a if a else 0
    return keep, torch.div(keep, max(per_agent, 1), rounding_mode="floor"), row[keep] * W + col[keep]


def pool_to_bev(feats: torch.Tensor, agent: torch.Tensor, cell: torch.Tensor, num_agents: int,
                bev_shape: Tuple[int, int]) -> torch.Tensor:
    """Sum (K, C) features into an (A, C, H, W) grid at (K,) agents and flat cells, in row order.

    Accumulates straight into the channel-first canvas (CPU index_put accumulates serially, in the
    order of the rows, as index_add does), so no (A, H, W, C) canvas and permuted copy, forward or
    backward."""
    H, W = bev_shape
    c = feats.shape[-1]
    canvas = feats.new_zeros(num_agents, c, H * W)
    channel = torch.arange(c, device=feats.device)
    canvas = canvas.index_put((agent[:, None], channel[None], cell[:, None]), feats, accumulate=True)
    return canvas.view(num_agents, c, H, W)


def splat(points: torch.Tensor, feats: torch.Tensor, lidar_range: Sequence[float],
          bev_shape: Tuple[int, int]) -> torch.Tensor:
    """Sum-pool frustum features into the BEV grid.

    points: (A, ..., 3) LiDAR-frame positions; feats: (A, ..., C) with the same
    middle dims. Points outside ``lidar_range`` are dropped. Returns (A, C, H, W).
    """
    keep, agent, cell = splat_cells(points, lidar_range, bev_shape)
    return pool_to_bev(feats.reshape(-1, feats.shape[-1])[keep], agent, cell, points.shape[0], bev_shape)


def lift_splat(points: torch.Tensor, prob: torch.Tensor, context: torch.Tensor,
               lidar_range: Sequence[float], bev_shape: Tuple[int, int]) -> torch.Tensor:
    """``splat(points, prob[..., None] * context[:, :, None], ...)`` without the (A, N, D, h, w, C) product.

    points: (A, N, D, h, w, 3); prob: (A, N, D, h, w) depth weights; context: (A, N, h, w, C)
    features. The lifted feature of frustum point (a, n, d, i, j) is ``prob[a, n, d, i, j] *
    context[a, n, i, j]``; only the points inside the grid are formed (the same products), then
    pooled in the same order as :func:`splat`, so the output is the same.
    """
    a, n, d, h, w = prob.shape
    keep, agent, cell = splat_cells(points, lidar_range, bev_shape)
    # flat (a, n, d, i, j) -> the pixel (a, n, i, j) whose context it carries
    pixel = torch.div(keep, d * h * w, rounding_mode="floor") * (h * w) + keep % (h * w)
    lifted = prob.reshape(-1)[keep, None] * context.reshape(-1, context.shape[-1])[pixel]
    return pool_to_bev(lifted, agent, cell, a, bev_shape)


def depth_targets(depth_logits: torch.Tensor, depth_image: torch.Tensor,
                  depth_bins: Sequence[float] = (1.0, 50.0, 1.0)) -> torch.Tensor:
    """The depth-bin target of every feature pixel, (A, N, h, w) long, -1 where unsupervised.

    depth_logits: (A, N, D, h, w); depth_image: (A, N, H, W) metres with H = h s,
    W = w s. Each feature pixel's target is the NEAREST valid depth in its s x s
    patch (valid: finite, > 0, inside the bins); pixels with none get -1.
    """
    a, n, d, h, w = depth_logits.shape
    H, W = depth_image.shape[-2:]
    if H % h or W % w or H // h != W // w:
        raise ValueError(f"depth image {H}x{W} is not a whole-stride multiple of the logits {h}x{w}")
    s = H // h
    dmin, dmax, step = (float(x) for x in depth_bins)
    dep = depth_image.to(depth_logits.dtype)
    dep = torch.where(torch.isfinite(dep) & (dep > 0), dep, torch.full_like(dep, float("inf")))
    dep = dep.reshape(a, n, h, s, w, s).amin(dim=(3, 5))  # (A, N, h, w)
    idx = torch.floor((dep - dmin) / step)
    ok = torch.isfinite(idx) & (idx >= 0) & (idx < d)
    return torch.where(ok, idx, torch.full_like(idx, -1)).long()


def depth_loss(depth_logits: torch.Tensor, depth_image: torch.Tensor,
               depth_bins: Sequence[float] = (1.0, 50.0, 1.0)) -> torch.Tensor:
    """Cross-entropy of the depth-bin logits against :func:`depth_targets`: the mean over
    supervised pixels; 0 (still differentiable) when there are none."""
    target = depth_targets(depth_logits, depth_image, depth_bins)
    if not bool((target >= 0).any()):
        return depth_logits.sum() * 0.0
    logits = depth_logits.permute(0, 1, 3, 4, 2).reshape(-1, depth_logits.shape[2])
    return F.cross_entropy(logits, target.reshape(-1), ignore_index=-1)


def depth_loss_terms(depth_logits: torch.Tensor, depth_image: torch.Tensor,
                     depth_bins: Sequence[float] = (1.0, 50.0, 1.0)) -> tuple:
    """:func:`depth_loss` as (sum over supervised pixels, their count) per agent: two (A,) tensors,
    so losses of agents encoded apart (a feature cache) add up to the batch's mean exactly."""
    target = depth_targets(depth_logits, depth_image, depth_bins)
    a, d = depth_logits.shape[0], depth_logits.shape[2]
    logits = depth_logits.permute(0, 1, 3, 4, 2).reshape(-1, d)
    ce = F.cross_entropy(logits, target.reshape(-1).clamp(min=0), reduction="none").reshape(a, -1)
    ok = (target >= 0).reshape(a, -1)
    return (ce * ok).sum(1), ok.sum(1)


class LSSEncoder(nn.Module):
    """Lift-Splat-Shoot: images (A, Ncam, 3, H, W) -> BEV (A, context_channels, ny, nx).

    channels: widths of the stride-2 image blocks (feature stride ``2 ** len(channels)``);
    depth_bins: ``(dmin, dmax, step)`` metres; context_channels: lifted feature width
    (= ``out_channels``). Image H and W must be multiples of the feature stride.
    """

    input_kind = "camera"

    def __init__(self, lidar_range: Sequence[float], voxel_size: Sequence[float] = (0.4, 0.4, 4.0),
                 channels: Sequence[int] = (32, 64, 128, 128), depth_bins: Sequence[float] = (1.0, 50.0, 1.0),
                 context_channels: int = 64):
        super().__init__()
        nz, ny, nx = grid_shape(lidar_range, voxel_size)
        if nz != 1:
            raise ValueError(f"lss: voxel_size[2]={voxel_size[2]} must span the z range "
                             f"{lidar_range[2]}..{lidar_range[5]} (heights are summed)")
        if not channels:
            raise ValueError("lss: channels needs at least one image block width")
        self.lidar_range = tuple(float(x) for x in lidar_range)
        self.voxel_size = tuple(float(x) for x in voxel_size)
        self.depth_bins = tuple(float(x) for x in depth_bins)
        self.register_buffer("depths", bin_centers(depth_bins), persistent=False)
        blocks, cin = [], 3
        for c in channels:
            blocks += [_conv_bn_relu(cin, c, 2), _conv_bn_relu(c, c, 1)]
            cin = c
        self.image_net = nn.Sequential(*blocks)
        self.stride = 2 ** len(channels)
        self.num_bins = int(self.depths.numel())
        self.context_channels = int(context_channels)
        self.depth_net = nn.Conv2d(cin, self.num_bins + self.context_channels, 1)
        self.out_channels = self.context_channels
        self.bev_shape = (ny, nx)
        self.bev_cell = (self.voxel_size[0], self.voxel_size[1])

    def forward(self, data: CameraInput) -> EncoderOutput:
        a, n, _, H, W = data.images.shape
        if H % self.stride or W % self.stride:
            raise ValueError(f"lss: image size {H}x{W} must be a multiple of the feature stride {self.stride}")
        x = self.depth_net(self.image_net(data.images.reshape(a * n, 3, H, W)))  # (A N, D + C, h, w)
        h, w = x.shape[-2:]
        depth_logits = x[:, :self.num_bins].reshape(a, n, self.num_bins, h, w)
        context = x[:, self.num_bins:].reshape(a, n, self.context_channels, h, w)
        prob = depth_logits.softmax(dim=2)
        pts = frustum_points(data.K.to(x.dtype), data.T_lidar_from_camera.to(x.dtype), (h, w),
                             self.stride, self.depths)
        # lifted features depth weight x context (A, N, D, h, w, C), formed for the points in the grid only
        bev = lift_splat(pts, prob, context.permute(0, 1, 3, 4, 2), self.lidar_range, self.bev_shape)
        return EncoderOutput(bev=bev, depth_logits=depth_logits)

    def depth_loss(self, depth_logits: torch.Tensor, depth_image: torch.Tensor) -> torch.Tensor:
        """:func:`depth_loss` with this encoder's bins."""
        return depth_loss(depth_logits, depth_image, self.depth_bins)

    def depth_loss_terms(self, depth_logits: torch.Tensor, depth_image: torch.Tensor) -> tuple:
        """:func:`depth_loss_terms` with this encoder's bins."""
        return depth_loss_terms(depth_logits, depth_image, self.depth_bins)
