"""BEV 2D backbones: a multi-scale ResNet with upsample-and-concat, and a shrink conv.

Maps are ``(A, C, H, W)`` (H along y, W along x). Level i downsamples by the
product of ``layer_strides[:i + 1]`` and is brought back by
``upsample_strides[i]`` (values < 1 mean a strided conv), so every level must
end at the same overall stride ``out_stride`` (may be fractional, e.g. 0.5 to
upsample the input grid). Input H and W must be multiples of the deepest
level's total stride.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Sequence, Tuple

import torch
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convs with BN and an identity (or 1x1 strided) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
        return (y + self.shortcut(x)).relu()


def _resample(cin: int, cout: int, factor: Fraction) -> nn.Module:
    """Upsample by ``factor`` (transposed conv), keep (1x1 conv) or downsample (strided conv)."""
    if factor >= 1:
        if factor.denominator != 1:
            raise ValueError(f"upsample stride {factor} must be an integer when >= 1")
        k = int(factor)
        conv = nn.ConvTranspose2d(cin, cout, k, stride=k, bias=False) if k > 1 else nn.Conv2d(cin, cout, 1, bias=False)
    else:
        inv = 1 / factor
        if inv.denominator != 1:
            raise ValueError(f"upsample stride {factor} must be 1/integer when < 1")
        conv = nn.Conv2d(cin, cout, int(inv), stride=int(inv), bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01), nn.ReLU(inplace=True))


class ResNetBEVBackbone(nn.Module):
    """Multi-scale ResNet BEV backbone (PointPillars RPN / ResNet-BEV style).

    in_channels: from the encoder's ``out_channels``.
    layer_nums[i] BasicBlocks at level i, the first with stride ``layer_strides[i]``
    and width ``num_filters[i]``; each level is resampled by ``upsample_strides[i]``
    to ``num_upsample_filters[i]`` channels; the levels are concatenated.
    out_channels = sum(num_upsample_filters); out_stride = common overall stride.
    """

    def __init__(self, in_channels: int, layer_nums: Sequence[int] = (3, 4, 5),
                 layer_strides: Sequence[int] = (2, 2, 2), num_filters: Sequence[int] = (64, 128, 256),
                 upsample_strides: Sequence[float] = (1, 2, 4),
                 num_upsample_filters: Sequence[int] = (128, 128, 128)):
        super().__init__()
        n = len(layer_nums)
        if not n or any(len(x) != n for x in (layer_strides, num_filters, upsample_strides, num_upsample_filters)):
            raise ValueError(f"backbone: layer_nums, layer_strides, num_filters, upsample_strides and "
                             f"num_upsample_filters need the same non-zero length; got {list(layer_nums)}, "
                             f"{list(layer_strides)}, {list(num_filters)}, {list(upsample_strides)}, "
                             f"{list(num_upsample_filters)}")
        levels, ups, strides = [], [], set()
        cin, total = int(in_channels), Fraction(1)
        for num, stride, c, up, cu in zip(layer_nums, layer_strides, num_filters, upsample_strides,
                                          num_upsample_filters):
            blocks = [BasicBlock(cin, c, int(stride))] + [BasicBlock(c, c) for _ in range(int(num) - 1)]
            levels.append(nn.Sequential(*blocks))
            total *= int(stride)
            upf = Fraction(up).limit_denominator(64)
            ups.append(_resample(c, cu, upf))
            strides.add(total / upf)
            cin = c
        if len(strides) != 1:
            raise ValueError(f"backbone: levels end at different strides {sorted(map(float, strides))}; "
                             f"choose upsample_strides so cumprod(layer_strides) / upsample_strides is constant")
        self.levels = nn.ModuleList(levels)
        self.ups = nn.ModuleList(ups)
        self.max_stride = int(total)
        self.out_stride = float(strides.pop())
        self.out_channels = int(sum(num_upsample_filters))

    def out_shape(self, in_hw: Tuple[int, int]) -> Tuple[int, int]:
        """Output (H, W) for input (H, W); raises when the input is not a multiple of the deepest stride."""
        h, w = in_hw
        if h % self.max_stride or w % self.max_stride:
            raise ValueError(f"backbone: BEV grid {h}x{w} must be a multiple of the deepest stride "
                             f"{self.max_stride}; change lidar_range or voxel_size")
        return int(round(h / self.out_stride)), int(round(w / self.out_stride))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(A, in_channels, H, W) -> (A, out_channels, H / out_stride, W / out_stride)."""
        outs = []
        for level, up in zip(self.levels, self.ups):
            x = level(x)
            outs.append(up(x))
        return torch.cat(outs, dim=1)


class ShrinkConv(nn.Module):
    """3x3 conv + BN + ReLU to ``out_channels`` (the fused feature width, 128)."""

    def __init__(self, in_channels: int, out_channels: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(out_channels, eps=1e-3, momentum=0.01), nn.ReLU(inplace=True))
        self.out_channels = int(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
