"""The reference's Lift-Splat-Shoot camera encoder (HEAL / GenComm ``heter_encoders.LiftSplatShoot`` with
its ``CamEncode`` / ``CamEncode_Resnet101``), for importing their camera checkpoints: encoder type
``lss_reference``. Our own, smaller LSS is :class:`~opencood_ext.models.lss.LSSEncoder` (type ``lss``).

Per camera image (B = A x Ncam images of (3, H, W)):

* image net: the trunk by name (:mod:`.image_trunks`). ``efficientnet_b0``: ``up1`` upsamples the
  stride-32 map x2 (bilinear, corners aligned), concatenates [stride-16 map, it] and applies two
  (3x3 conv, BN, ReLU); with ``img_downsample`` 8, ``up2`` does the same with the stride-8 map
  (512 wide either way). ``resnet101``: the stem and two bottleneck stages (512 wide, stride 8).
* heads: ``depth_head`` (1x1 conv, D logits) and ``image_head`` (1x1 conv, ``context_channels``);
  the lifted feature of (bin k, pixel) is ``softmax(depth)_k * context``.
* frustum: feature pixel (i, j) looks through image point ``u = j (W - 1) / (w - 1)``,
  ``v = i (H - 1) / (h - 1)`` (``linspace`` over the image, not pixel centres) at the depths
  ``depth_discretization = (dmin, dmax, D)``: ``UD`` bins ``dmin + k (dmax - dmin) / D``, ``LID``
  bins ``dmin + b k (k + 1) / 2`` with ``b = 2 (dmax - dmin) / (D (D + 1))``, k = 0 .. D-1 (the
  bins' near edges). The point is ``d K^-1 (u, v, 1)`` in the OpenCV camera frame (x right, y down,
  z forward), taken to the agent's LiDAR frame with ``T_lidar_from_camera`` (whose camera frame is
  x forward, y right, z up: see :class:`~opencood_ext.data.inputs.CameraInput`). Geometry in float64.
* splat: cell index ``trunc((p - low) / step)`` per axis of ``xbound`` / ``ybound`` / ``zbound``
  (``(low, high, step)``; a truncation toward zero, as the reference's ``.long()``, so points up to
  one cell below ``low`` land in cell 0), cells ``int((high - low) / step)``; points outside are
  dropped, the rest summed per cell. Output (A, nz * C, ny, nx), z-major channels, rows along y.

The grid is ``xbound`` x ``ybound``, not necessarily the detection range: ``bev_range`` tells the
:class:`~.encoder_stack.EncoderStack`, which then centre-crops or zero-pads the shrunk feature to
``int(H ymax / ybound[1])`` x ``int(W xmax / xbound[1])`` as the reference model does.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.inputs import CameraInput
from .image_trunks import TRUNKS, build_trunk
from .inputs import EncoderOutput

DEPTH_MODES = ("LID", "UD")
# the OpenCV camera axes (x right, y down, z forward) in CameraInput's camera frame (x fwd, y right, z up)
_CV_TO_CAMERA = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, -1.0, 0.0]], dtype=torch.float64)


def depth_values(dmin: float, dmax: float, num_bins: int, mode: str) -> Tensor:
    """(D,) float64 depths of the reference's bins (their near edges), ``mode`` 'UD' | 'LID'."""
    k = torch.arange(int(num_bins), dtype=torch.float64)
    if mode == "UD":
        return dmin + (dmax - dmin) / num_bins * k
    if mode == "LID":
        return dmin + 2.0 * (dmax - dmin) / (num_bins * (1 + num_bins)) * k * (k + 1) / 2
    raise ValueError(f"depth mode must be one of {list(DEPTH_MODES)}, got {mode!r}")


def depth_bin_index(depth: Tensor, dmin: float, dmax: float, num_bins: int, mode: str) -> Tensor:
    """The reference's ground-truth bin of each depth (metres): clamped above at ``dmax``, below-range
    -> 0, above-range and non-finite (e.g. LID of a depth below ``dmin``) -> D-1; int64."""
    d = depth.clamp(max=dmax)
    if mode == "UD":
        idx = (d - dmin) / ((dmax - dmin) / num_bins)
    else:
        idx = -0.5 + 0.5 * torch.sqrt(1 + 8 * (d - dmin) / (2 * (dmax - dmin) / (num_bins * (1 + num_bins))))
    idx = torch.where(idx < 0, torch.zeros_like(idx), idx)
    idx = torch.where((idx >= num_bins) | ~torch.isfinite(idx), torch.full_like(idx, num_bins - 1), idx)
    return idx.long()


def _cells(bound: Sequence[float]) -> int:
    low, high, step = (float(x) for x in bound)
    return int((high - low) / step)


class Up(nn.Module):
    """x2 bilinear upsampling (corners aligned) of ``x``, concatenated after ``skip``; two (3x3 conv, BN, ReLU)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.layers = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                    nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                                    nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:
        x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        return self.layers(torch.cat([skip, x], dim=1))


class ReferenceLSSEncoder(nn.Module):
    """The reference LSS camera encoder: images (A, Ncam, 3, H, W) -> BEV (A, nz * context_channels, ny, nx).

    trunk: ``efficientnet_b0`` (H, W multiples of 32) | ``resnet101`` (H, W multiples of 8);
    img_downsample: feature stride, 8 or 16 (efficientnet_b0), 8 (resnet101);
    depth_discretization: (dmin, dmax, number of bins); depth_mode: ``LID`` | ``UD``;
    xbound, ybound, zbound: (low, high, step) of the BEV grid; lidar_range: the detection range;
    context_channels: lifted feature width (the reference's ``img_features``).
    """

    input_kind = "camera"

    def __init__(self, lidar_range: Sequence[float], trunk: str = "efficientnet_b0", img_downsample: int = 8,
                 depth_discretization: Sequence[float] = (2.0, 50.0, 48), depth_mode: str = "LID",
                 xbound: Sequence[float] = (-51.2, 51.2, 0.4), ybound: Sequence[float] = (-51.2, 51.2, 0.4),
                 zbound: Sequence[float] = (-10.0, 10.0, 20.0), context_channels: int = 64):
        super().__init__()
        if trunk not in TRUNKS:
            raise ValueError(f"lss_reference.trunk: unknown {trunk!r}; one of {list(TRUNKS)}")
        allowed = (8, 16) if trunk == "efficientnet_b0" else (8,)
        if int(img_downsample) not in allowed:
            raise ValueError(f"lss_reference.img_downsample: {trunk} gives features at stride {list(allowed)}, "
                             f"got {img_downsample}")
        if depth_mode not in DEPTH_MODES:
            raise ValueError(f"lss_reference.depth_mode: one of {list(DEPTH_MODES)}, got {depth_mode!r}")
        dmin, dmax, nbins = depth_discretization
        if not (0 < float(dmin) < float(dmax)) or int(nbins) != nbins or int(nbins) < 1:
            raise ValueError(f"lss_reference.depth_discretization: (dmin, dmax, number of bins) with "
                             f"0 < dmin < dmax, got {list(depth_discretization)}")
        if float(lidar_range[3]) <= 0 or float(lidar_range[4]) <= 0 or float(xbound[1]) <= 0 or float(ybound[1]) <= 0:
            raise ValueError(f"lss_reference: the detection range {list(lidar_range)} and the camera grid's xbound "
                             f"{list(xbound)} / ybound {list(ybound)} must reach past 0 (the reference scales "
                             f"its crop by their upper ends)")
        for name, bound in (("xbound", xbound), ("ybound", ybound), ("zbound", zbound)):
            if len(bound) != 3 or float(bound[2]) <= 0 or _cells(bound) < 1:
                raise ValueError(f"lss_reference.{name}: (low, high, step) with at least one cell, got {list(bound)}")
        self.trunk_name = trunk
        self.img_downsample = int(img_downsample)
        self.depth_discretization = (float(dmin), float(dmax), int(nbins))
        self.depth_mode = depth_mode
        self.bounds = tuple(tuple(float(x) for x in b) for b in (xbound, ybound, zbound))
        self.num_bins = int(nbins)
        self.context_channels = int(context_channels)
        self.trunk = build_trunk(trunk)
        if trunk == "efficientnet_b0":
            w = self.trunk.widths
            self.up1 = Up(w[4] + w[3], 512)
            if self.img_downsample == 8:
                self.up2 = Up(512 + w[2], 512)
        self.depth_head = nn.Conv2d(512, self.num_bins, 1)
        self.image_head = nn.Conv2d(512, self.context_channels, 1)
        nx, ny, nz = (_cells(b) for b in self.bounds)
        self.grid_cells = (nx, ny, nz)
        self.out_channels = self.context_channels * nz
        self.bev_shape = (ny, nx)
        self.bev_cell = (self.bounds[0][2], self.bounds[1][2])
        # this grid's extent; where it is not the detection range the encoder stack crops / pads the feature
        self.bev_range = (self.bounds[0][0], self.bounds[1][0], self.bounds[0][1], self.bounds[1][1])

    # ---------------------------------------------------------------- image net
    def image_features(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) -> (B, 512, H / img_downsample, W / img_downsample)."""
        if self.trunk_name == "resnet101":
            return self.trunk(images)
        r = self.trunk(images)
        x = self.up1(r[4], r[3])
        return self.up2(x, r[2]) if self.img_downsample == 8 else x

    def geometry(self, K: Tensor, T_lidar_from_camera: Tensor, image_hw: Tuple[int, int],
                 feature_hw: Tuple[int, int]) -> Tensor:
        """(A, N, D, h, w, 3) float64 LiDAR-frame points of the frustum (see the module docstring)."""
        (H, W), (h, w) = image_hw, feature_hw
        dev = K.device
        us = torch.linspace(0, W - 1, w, dtype=torch.float64, device=dev)
        vs = torch.linspace(0, H - 1, h, dtype=torch.float64, device=dev)
        depths = depth_values(*self.depth_discretization, self.depth_mode).to(dev)
        dd = depths[:, None, None].expand(-1, h, w)
        uu, vv = us[None, None, :].expand_as(dd), vs[None, :, None].expand_as(dd)
        pix = torch.stack([uu * dd, vv * dd, dd], dim=-1)  # (D, h, w, 3): (u d, v d, d)
        T = T_lidar_from_camera.double()
        combine = T[..., :3, :3] @ _CV_TO_CAMERA.to(dev) @ torch.linalg.inv(K.double())  # (A, N, 3, 3)
        return torch.einsum("anij,dhwj->andhwi", combine, pix) + T[..., None, None, None, :3, 3]

    def splat(self, points: Tensor, feats: Tensor) -> Tensor:
        """points (A, ..., 3) float64, feats (A, ..., C) -> (A, nz * C, ny, nx): per-cell sums."""
        a, c = points.shape[0], feats.shape[-1]
        nx, ny, nz = self.grid_cells
        pts = points.reshape(a, -1, 3)
        low = torch.tensor([b[0] for b in self.bounds], dtype=torch.float64, device=pts.device)
        step = torch.tensor([b[2] for b in self.bounds], dtype=torch.float64, device=pts.device)
        idx = torch.trunc((pts - low) / step).long()  # (A, P, 3) x, y, z cells
        size = torch.tensor([nx, ny, nz], device=pts.device)
        keep = ((idx >= 0) & (idx < size)).all(dim=-1).reshape(-1)
        agent = torch.arange(a, device=pts.device)[:, None].expand(a, pts.shape[1]).reshape(-1)
        idx = idx.reshape(-1, 3)
        flat = ((agent * nz + idx[:, 2]) * ny + idx[:, 1]) * nx + idx[:, 0]
        f = feats.reshape(-1, c)
        canvas = f.new_zeros(a * nz * ny * nx, c).index_add_(0, flat[keep], f[keep])
        return canvas.view(a, nz, ny, nx, c).permute(0, 1, 4, 2, 3).reshape(a, nz * c, ny, nx)

    def forward(self, data: CameraInput) -> EncoderOutput:
        a, n, _, H, W = data.images.shape
        s = self.img_downsample
        multiple = 32 if self.trunk_name == "efficientnet_b0" else 8
        if H % multiple or W % multiple:
            raise ValueError(f"lss_reference ({self.trunk_name}): image size {H}x{W} must be a multiple of "
                             f"{multiple}")
        x = self.image_features(data.images.reshape(a * n, 3, H, W))
        h, w = x.shape[-2:]
        if (h, w) != (H // s, W // s):
            raise ValueError(f"lss_reference: features {h}x{w} are not the image {H}x{W} / {s}")
        logits = self.depth_head(x)  # (A N, D, h, w)
        lifted = logits.softmax(dim=1)[:, None] * self.image_head(x)[:, :, None]  # (A N, C, D, h, w)
        lifted = lifted.view(a, n, self.context_channels, self.num_bins, h, w).permute(0, 1, 3, 4, 5, 2)
        pts = self.geometry(data.K, data.T_lidar_from_camera, (H, W), (h, w))
        bev = self.splat(pts, lifted)
        return EncoderOutput(bev=bev, depth_logits=logits.view(a, n, self.num_bins, h, w))

    def depth_focal(self, depth_logits: Tensor, depth_image: Tensor, alpha: float = 0.25,
                    gamma: float = 2.0) -> Tensor:
        """The reference's depth supervision per feature pixel, (A, N, h, w): focal loss
        ``-alpha (1 - p_t)^gamma log p_t`` of the softmaxed logits (A, N, D, h, w) at the ground-truth bin
        of the depth sampled at image pixel ``(s // 2 + i s, s // 2 + j s)`` (:func:`depth_bin_index`).
        depth_image: (A, N, H, W) metres."""
        s = self.img_downsample
        d = depth_image[..., s // 2::s, s // 2::s].to(depth_logits.dtype)
        if tuple(d.shape[-2:]) != tuple(depth_logits.shape[-2:]):
            raise ValueError(f"depth image {tuple(depth_image.shape[-2:])} sampled every {s} pixels gives "
                             f"{tuple(d.shape[-2:])}, the logits are {tuple(depth_logits.shape[-2:])}")
        target = depth_bin_index(d, *self.depth_discretization, self.depth_mode)
        logp = depth_logits.log_softmax(dim=2).gather(2, target.unsqueeze(2)).squeeze(2)
        return -alpha * (1 - logp.exp()) ** gamma * logp

    def depth_loss(self, depth_logits: Tensor, depth_image: Tensor) -> Tensor:
        """:meth:`depth_focal`, the mean over every feature pixel of every camera (as the reference)."""
        return self.depth_focal(depth_logits, depth_image).mean()

    def depth_loss_terms(self, depth_logits: Tensor, depth_image: Tensor) -> tuple:
        """:meth:`depth_loss` as (sum, pixel count) per agent: two (A,) tensors."""
        per = self.depth_focal(depth_logits, depth_image).flatten(1)
        return per.sum(1), torch.full((per.shape[0],), per.shape[1], device=per.device, dtype=torch.long)
