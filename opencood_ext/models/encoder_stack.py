"""One agent type's perception stack up to the shared BEV feature:
encoder -> BEV backbone -> shrink header -> (A, out_channels, H, W).

Every agent type of a model must end on the same :class:`BEVGrid` so features
can be fused: compare ``stack.grid`` across types (the lead's model does).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import torch.nn.functional as F
from torch import Tensor, nn

from ..data.inputs import CameraInput, LidarInput
from .components import ALIGNERS, BACKBONES, ENCODERS, SHRINKS, build
from .inputs import EncoderOutput


@dataclass(frozen=True)
class BEVGrid:
    """Geometry of a BEV feature map (A, C, H, W): H rows along y, W columns along x.

    lidar_range: (xmin, ymin, zmin, xmax, ymax, zmax); shape: (H, W);
    cell: (cell_x, cell_y) metres; row r, column c cover
    ``[ymin + r cell_y, ymin + (r + 1) cell_y) x [xmin + c cell_x, ...)``.
    """

    lidar_range: Tuple[float, ...]
    shape: Tuple[int, int]
    cell: Tuple[float, float]

    def matches(self, other: "BEVGrid", tol: float = 1e-6) -> bool:
        return (self.shape == other.shape
                and all(abs(a - b) <= tol for a, b in zip(self.lidar_range, other.lidar_range))
                and all(abs(a - b) <= tol for a, b in zip(self.cell, other.cell)))


class EncoderStack(nn.Module):
    """Encoder + backbone + shrink, built from spec dicts through the registry.

    encoder: ``{"type": "pointpillars" | "second" | "lss", **args}`` (no ``lidar_range``:
        it is given once, here).
    backbone: ``{"type": "resnet_bev" (default) | "base_bev", **args}`` (no ``in_channels``).
    lidar_range: (xmin, ymin, zmin, xmax, ymax, zmax) of the agent's LiDAR frame.
    shrink_channels: width of the output feature (``out_channels``) of the default shrink
        (:class:`~.backbone.ShrinkConv`, 3x3 conv + BN + ReLU); None: 128.
    shrink: another shrink header, ``{"type": "conv_bn" | "downsample_conv", **args}`` (no
        ``in_channels``; its width is its own argument, so ``shrink_channels`` stays unset). A
        shrink with a stride (``downsample_conv``) coarsens the feature grid by it.
    aligner: an optional feature aligner after the shrink, ``{"type": "convnext", **args}`` (HEAL's
        AlignNet; no ``channels``: it keeps the stack's width and grid).
    where: config location used in error messages.
    protocol: the model's (derived); passed on to an encoder whose constructor takes it.

    forward(LidarInput | CameraInput) -> EncoderOutput(bev (A, out_channels, H, W),
    depth_logits or None).
    """

    def __init__(self, encoder: Mapping[str, Any], backbone: Mapping[str, Any],
                 lidar_range: Sequence[float], shrink_channels: Optional[int] = None,
                 shrink: Optional[Mapping[str, Any]] = None, aligner: Optional[Mapping[str, Any]] = None,
                 where: str = "encoder_stack",
                 protocol: str = "native"):
        super().__init__()
        # the model's protocol (derived) reaches the encoders that compute differently under it
        cls = ENCODERS.get(encoder.get("type")) if isinstance(encoder, Mapping) else None
        extra = {"protocol": protocol} if cls is not None and "protocol" in inspect.signature(cls).parameters else {}
        self.encoder = build(encoder, ENCODERS, f"{where}.encoder", lidar_range=list(lidar_range), **extra)
        self.backbone = build(backbone, BACKBONES, f"{where}.backbone", default_type="resnet_bev",
                              in_channels=self.encoder.out_channels)
        if shrink is None:
            self.shrink = SHRINKS["conv_bn"](self.backbone.out_channels, 128 if shrink_channels is None
                                             else shrink_channels)
        elif shrink_channels is not None:
            raise ValueError(f"{where}.shrink_channels: set the width inside {where}.shrink instead "
                             f"(both are given)")
        else:
            self.shrink = build(shrink, SHRINKS, f"{where}.shrink", default_type="conv_bn",
                                in_channels=self.backbone.out_channels)
        self.out_channels = self.shrink.out_channels
        self.aligner = None if aligner is None else build(aligner, ALIGNERS, f"{where}.aligner",
                                                          channels=self.out_channels)
        try:
            shape = self.shrink.out_shape(self.backbone.out_shape(self.encoder.bev_shape))
        except ValueError as e:
            raise ValueError(f"{where}: encoder BEV grid {self.encoder.bev_shape}: {e}") from None
        s = self.backbone.out_stride * self.shrink.stride
        cell = (self.encoder.bev_cell[0] * s, self.encoder.bev_cell[1] * s)
        # an encoder whose own grid is not the detection range (the reference LSS's camera grid): its
        # feature is centre-cropped / zero-padded to the range's share of it, as HEAL does after the shrink
        # (crop: the shape it ends on; uncropped: the shrunk feature's own shape before it)
        self.crop: Optional[Tuple[int, int]] = None
        self.uncropped: Optional[Tuple[int, int]] = None
        own = getattr(self.encoder, "bev_range", None)  # (xmin, ymin, xmax, ymax)
        if own is not None and any(abs(float(a) - float(b)) > 1e-6 for a, b in
                                   zip(own, (lidar_range[0], lidar_range[1], lidar_range[3], lidar_range[4]))):
            self.uncropped = tuple(shape)
            # the reference's rounding: the ratio first (crop_ratio_H / _W), then int(H ratio), int(W ratio)
            shape = (int(shape[0] * (float(lidar_range[4]) / float(own[3]))),
                     int(shape[1] * (float(lidar_range[3]) / float(own[2]))))
            self.crop = shape
        self.grid = BEVGrid(tuple(float(x) for x in lidar_range), shape, cell)

    @property
    def input_kind(self) -> str:
        """"lidar" (feed :class:`LidarInput`) or "camera" (feed :class:`CameraInput`)."""
        return self.encoder.input_kind

    @property
    def voxel_size(self) -> Optional[Tuple[float, float, float]]:
        """Voxel size the data pipeline must voxelise with (lidar types), else None."""
        return self.encoder.voxel_size if self.input_kind == "lidar" else None

    def forward(self, data: Union[LidarInput, CameraInput]) -> EncoderOutput:
        expected = LidarInput if self.input_kind == "lidar" else CameraInput
        if not isinstance(data, expected):
            raise TypeError(f"this {type(self.encoder).__name__} stack takes {expected.__name__}, "
                            f"got {type(data).__name__}")
        out = self.encoder(data)
        bev = self.shrink(self.backbone(out.bev))
        if self.aligner is not None:
            bev = self.aligner(bev)
        return EncoderOutput(bev=bev if self.crop is None else center_crop(bev, self.crop),
                             depth_logits=out.depth_logits)


def center_crop(x: Tensor, hw: Tuple[int, int]) -> Tensor:
    """(..., H, W) -> (..., h, w) around the centre (torchvision's CenterCrop): zero-padded first where
    h > H or w > W (``(d // 2, (d + 1) // 2)`` before / after), then cut from ``round((H' - h) / 2)``."""
    h, w = hw
    H, W = x.shape[-2:]
    if h > H or w > W:
        dh, dw = max(h - H, 0), max(w - W, 0)
        x = F.pad(x, (dw // 2, (dw + 1) // 2, dh // 2, (dh + 1) // 2))
        H, W = x.shape[-2:]
    top, left = int(round((H - h) / 2.0)), int(round((W - w) / 2.0))
    return x[..., top:top + h, left:left + w]
