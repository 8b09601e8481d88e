"""PointPillars encoder: pillar feature net + scatter to a BEV pseudo-image.

Input :class:`LidarInput` whose voxels are pillars (``voxel_size[2]`` spans the
whole z range, so ``nz == 1``). Output ``(A, C, H, W)`` with ``H = ny`` rows along
y and ``W = nx`` columns along x: the pillar at coords ``[a, 0, y, x]`` lands at
``bev[a, :, y, x]``.
"""
from __future__ import annotations

from typing import Literal, Sequence, Tuple

import torch
from torch import nn

from opencood_ext.data.voxelize import grid_shape

from ..data.inputs import LidarInput
from .inputs import EncoderOutput

# x, y, z, intensity + offsets to the pillar's point mean (3) + offsets to the pillar centre (3)
POINT_FEATURES = 10


class _PillarMax(torch.autograd.Function):
    """``relu(max over each pillar's points of z)``: (N, C) per-point pre-activations, sorted by pillar
    with ``lengths[v]`` points in pillar v -> (V, C).

    Equal to ``zeros(V, C).scatter_reduce(0, pillar, relu(z), "amax", include_self=True)`` (the
    pillar max of the ReLU outputs from a zero start): ReLU is monotone, so the max of the
    activations is the activation of the max. The gradient is the one PyTorch gives that
    scatter_reduce: each pillar's gradient is split evenly among the points tied at its max, and
    nothing flows where the max is <= 0 (ReLU). It never builds the (N, C) ReLU output nor an
    expanded (N, C) index, which made this the encoder's slowest op on the CPU.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, lengths: torch.Tensor, pillar: torch.Tensor) -> torch.Tensor:
        top = torch.segment_reduce(z, "max", lengths=lengths, unsafe=True)  # (V, C); -inf where empty
        ctx.save_for_backward(z, lengths, pillar, top)
        return top.clamp(min=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        z, lengths, pillar, top = ctx.saved_tensors
        at_max = z == top.index_select(0, pillar)  # (N, C) the points tied at their pillar's max
        if int(at_max.sum()) == int((lengths > 0).sum()) * z.shape[1]:
            ties = torch.ones_like(top)  # one point at each max (the usual case): nothing to count
        else:
            ties = torch.segment_reduce(at_max.to(z.dtype), "sum", lengths=lengths, unsafe=True).clamp(min=1)
        share = torch.where(top > 0, grad / ties, torch.zeros_like(grad))  # (V, C); ReLU's gradient
        return share.index_select(0, pillar).mul_(at_max), None, None


class PillarFeatureNet(nn.Module):
    """Per-point augmented features -> (Linear, BN, ReLU) layers -> max over the pillar's points.

    Augmented point features (10): x, y, z, intensity, (x, y, z) minus the mean of
    the pillar's valid points, (x, y, z) minus the pillar's geometric centre.
    Padded point slots never reach the BatchNorm statistics nor the max (unless
    ``forward(padding_slots=True)``: the reference's rule).
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

    def point_features(self, voxels: torch.Tensor, num_points: torch.Tensor, coords: torch.Tensor,
                       valid: torch.Tensor) -> torch.Tensor:
        """(V, P, 4), (V,), (V, 4) ``[a, z, y, x]``, (V, P) bool valid slots -> (Nvalid, 10) augmented
        features of the valid points, in (voxel, slot) order."""
        xyz = voxels[..., :3]
        mean = (xyz * valid[..., None]).sum(1) / num_points.clamp(min=1)[:, None].to(xyz.dtype)  # (V, 3)
        # coords are [a, z, y, x]; centres in metres, x y z order
        centre = (coords[:, [3, 2, 1]].to(xyz.dtype) + 0.5) * self.voxel_size + self.origin  # (V, 3)
        pillar = torch.arange(voxels.shape[0], device=voxels.device)[:, None].expand(valid.shape)[valid]
        points = voxels[valid]  # (Nvalid, 4)
        return torch.cat([points[:, :4], points[:, :3] - mean[pillar], points[:, :3] - centre[pillar]], dim=-1)

    def augment(self, voxels: torch.Tensor, num_points: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        """(V, P, 4), (V,), (V, 4) ``[a, z, y, x]`` -> (V, P, 10) augmented features (padding zeroed)."""
        valid = torch.arange(voxels.shape[1], device=voxels.device)[None] < num_points[:, None]
        feats = voxels.new_zeros(*voxels.shape[:2], POINT_FEATURES)
        feats[valid] = self.point_features(voxels, num_points, coords, valid)
        return feats

    def forward(self, voxels: torch.Tensor, num_points: torch.Tensor, coords: torch.Tensor,
                padding_slots: bool = False) -> torch.Tensor:
        """-> (V, C) pillar features.

        Works on the valid points only, (Nvalid, .) with ``pillar`` the owning
        voxel of each, so padding costs nothing and never enters BN statistics.
        The pillar max is :class:`_PillarMax` (max, then ReLU; same values and gradients as the
        max of the ReLU outputs). The linear layer's weight gradient is taken as
        ``x^T @ grad`` ((10, N) @ (N, C)), which the CPU BLAS runs several times faster than the
        ``grad^T @ x`` of ``nn.Linear``'s backward on ~10^5 points; same products, float rounding only.

        padding_slots (one layer only): compute as OpenCOOD's PillarVFE, which runs its layer on every
        slot of the (V, P, 4) tensor, the zeroed padding slots too: a training-mode BatchNorm counts
        the V * P slots in its statistics (and running statistics), and a pillar with fewer than P
        points also takes the max with its padding slots' value ``relu(BN(0))``. Still computed on
        the valid points only (:func:`_norm_over_slots`).
        """
        v, p = voxels.shape[:2]
        valid = torch.arange(p, device=voxels.device)[None] < num_points[:, None]  # (V, P)
        x = self.point_features(voxels, num_points, coords, valid)  # (Nvalid, 10)
        if x.shape[0] == 0:
            return voxels.new_zeros(v, self.out_channels)
        if padding_slots and len(self.layers) != 1:
            raise ValueError(f"PillarFeatureNet: padding_slots restates the reference's one-layer pillar net; "
                             f"this one has {len(self.layers)} layers")
        lengths = num_points.long().clamp(min=0, max=p)
        pillar = torch.repeat_interleave(torch.arange(v, device=voxels.device), lengths)  # (Nvalid,)
        pooled = x
        for i, layer in enumerate(self.layers):
            z = x @ layer["linear"].weight.t().contiguous()
            norm = layer["norm"]
            if padding_slots:
                z, empty = _norm_over_slots(norm, z, v * p)  # empty: (C,) a padding slot, before ReLU
            else:
                z = norm(z)  # (Nvalid, C) before ReLU
            pooled = _PillarMax.apply(z, lengths, pillar)  # (V, C) = max over the pillar of relu(z)
            if padding_slots:
                pooled = torch.where((lengths < p)[:, None], torch.maximum(pooled, empty.relu()), pooled)
            if i + 1 < len(self.layers):
                x = torch.cat([z.relu(), pooled[pillar]], dim=-1)
        return pooled


def _norm_over_slots(norm: nn.BatchNorm1d, z: torch.Tensor, slots: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``norm`` applied as if the (Nvalid, C) pre-activations ``z`` came with ``slots - Nvalid`` zero
    rows (the padding slots, zero after a bias-free linear layer): in training its batch mean and
    biased variance over all ``slots`` rows normalise, and its running statistics take that mean and
    the unbiased variance (BatchNorm's rules); in evaluation the running statistics.
    -> (normalised z (Nvalid, C), the normalised value of a zero row (C,))."""
    if norm.training or not norm.track_running_stats:
        mean = z.sum(0) / slots
        var = ((z - mean).square().sum(0) + (slots - z.shape[0]) * mean.square()) / slots
        if norm.training and norm.track_running_stats:
            with torch.no_grad():
                norm.num_batches_tracked.add_(1)
                f = norm.momentum if norm.momentum is not None else 1.0 / float(norm.num_batches_tracked)
                norm.running_mean.mul_(1 - f).add_(mean.detach(), alpha=f)
                norm.running_var.mul_(1 - f).add_(var.detach() * (slots / max(slots - 1, 1)), alpha=f)
    else:
        mean, var = norm.running_mean, norm.running_var
    scale = torch.rsqrt(var + norm.eps)
    if norm.affine:
        scale = scale * norm.weight
    shift = -mean * scale + (norm.bias if norm.affine else 0.0)
    return z * scale + shift, shift


def scatter_to_bev(features: torch.Tensor, coords: torch.Tensor, num_agents: int,
                   bev_shape: Tuple[int, int]) -> torch.Tensor:
    """(V, C) pillar features + (V, 4) ``[a, z, y, x]`` -> (A, C, H, W), zeros where no pillar.

    Writes straight into the channel-first canvas (no (A, H, W, C) canvas and permuted copy of it,
    forward or backward)."""
    h, w = bev_shape
    c = features.shape[1]
    canvas = features.new_zeros(num_agents, c, h * w)
    cell = coords[:, 2].long() * w + coords[:, 3].long()
    canvas[coords[:, 0].long(), :, cell] = features
    return canvas.view(num_agents, c, h, w)


class PointPillarEncoder(nn.Module):
    """PointPillars: :class:`PillarFeatureNet` then :func:`scatter_to_bev`.

    ``voxel_size[2]`` must cover the whole z extent of ``lidar_range`` (one pillar layer).
    out_channels = ``num_filters[-1]``; output ``(A, C, ny, nx)``, one cell per pillar
    (``bev_cell = (vx, vy)`` metres).

    protocol (derived, the model's): "reference" computes as OpenCOOD's PillarVFE does, over every
    slot of the (V, P, 4) voxel tensor: a pillar with fewer than P points also takes the max with
    its zeroed padding slots, each ``relu(BN(linear(0)))``, and a training-mode BatchNorm counts the
    padding slots in its statistics (one PFN layer only, as the reference configs have;
    ``PillarFeatureNet.forward(padding_slots=True)``). "native": valid points only.
    """

    input_kind = "lidar"

    def __init__(self, lidar_range: Sequence[float], voxel_size: Sequence[float] = (0.4, 0.4, 4.0),
                 num_filters: Sequence[int] = (64,), protocol: Literal["native", "reference"] = "native"):
        super().__init__()
        nz, ny, nx = grid_shape(lidar_range, voxel_size)
        if nz != 1:
            raise ValueError(f"pointpillars: voxel_size[2]={voxel_size[2]} must span the z range "
                             f"{lidar_range[2]}..{lidar_range[5]} (got {nz} layers)")
        if protocol == "reference" and len(num_filters) != 1:
            raise ValueError(f"pointpillars: protocol reference restates the reference's one-layer pillar net; "
                             f"num_filters has {len(num_filters)} layers ({list(num_filters)})")
        self.protocol = protocol
        self.lidar_range = tuple(float(x) for x in lidar_range)
        self.voxel_size = tuple(float(x) for x in voxel_size)
        self.pfn = PillarFeatureNet(voxel_size, lidar_range, num_filters)
        self.out_channels = self.pfn.out_channels
        self.bev_shape = (ny, nx)
        self.bev_cell = (self.voxel_size[0], self.voxel_size[1])

    def forward(self, data: LidarInput) -> EncoderOutput:
        feats = self.pfn(data.voxels, data.num_points, data.coords, padding_slots=self.protocol == "reference")
        return EncoderOutput(bev=scatter_to_bev(feats, data.coords, data.num_agents, self.bev_shape))
