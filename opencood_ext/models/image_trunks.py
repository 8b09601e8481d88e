"""Image trunks of the reference's LSS camera encoder, built by name, random init (nothing is downloaded).

* ``efficientnet_b0``: the EfficientNet-B0 feature extractor (stem + 16 MBConv blocks, no 1280-wide
  head conv, no classifier). ``forward`` returns the five reductions (strides 2, 4, 8, 16, 32;
  widths 16, 24, 40, 112, 320): for each stride, the last feature map at that stride.
  Its "same" paddings are fixed ones, computed for a 224 x 224 image as the ``efficientnet_pytorch``
  package does when it builds B0 (so an input of another size is padded as that model pads it);
  BatchNorm eps 1e-3; Swish activations; squeeze-excitation to ``max(1, in_width / 4)`` channels;
  stochastic depth (drop-connect, rate ``0.2 * block_index / 16``) in training only. PyTorch's default
  initialisation: the reference starts from ImageNet weights (``from_pretrained``), which are not
  downloaded here.
* ``resnet101``: the ResNet-101 stem (7x7 stride-2 conv, BN, ReLU, 3x3 stride-2 max-pool) and its
  first ``num_stages`` bottleneck stages (3, 4, 23, 3 blocks; widths 256, 512, 1024, 2048; stride on
  the 3x3 conv, projection shortcut on each stage's first block). ``forward`` returns the last stage's
  map. The reference LSS uses two stages (512 wide, stride 8). Initialised as torchvision's
  ``resnet101(zero_init_residual=True)``, which the reference trains from.

Both are plain ``nn.Module`` trees; the weight importer maps the reference's parameter names
(``efficientnet_pytorch``'s ``_conv_stem`` / ``_blocks.<i>._expand_conv`` ..., torchvision's
``layer<k>.<j>.conv1`` ...) onto them (:mod:`opencood_ext.interop.layouts`).
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# EfficientNet-B0 stages: (expand ratio, kernel, first stride, output width, repeats); stem 32 wide
B0_STAGES: Tuple[Tuple[int, int, int, int, int], ...] = (
    (1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))
B0_STEM = 32
B0_DESIGN_SIZE = 224  # the image size the package's static "same" paddings are computed for
B0_BN_EPS = 1e-3
B0_DROP_CONNECT = 0.2
# ResNet-101: bottleneck blocks per stage, inner widths (output = 4x)
R101_BLOCKS = (3, 4, 23, 3)
R101_WIDTHS = (64, 128, 256, 512)


def _same_pad(size: int, kernel: int, stride: int) -> Tuple[int, int]:
    """TensorFlow "same" padding (before, after) of one axis of length ``size``."""
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class _PaddedConv(nn.Conv2d):
    """Conv2d after a fixed zero padding (left, right, top, bottom); no padding of its own."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, design_size: int, groups: int = 1,
                 bias: bool = False):
        super().__init__(cin, cout, kernel, stride=stride, groups=groups, bias=bias)
        ph, pw = _same_pad(design_size, kernel, stride), _same_pad(design_size, kernel, stride)
        self.pad = (pw[0], pw[1], ph[0], ph[1])

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(F.pad(x, self.pad) if any(self.pad) else x)


class MBConv(nn.Module):
    """Inverted residual: [1x1 expand, BN, Swish], kxk depthwise, BN, Swish, SE gate, 1x1 project, BN,
    [+ input when stride 1 and widths equal]. ``design_size``: the input size its padding is for."""

    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int, design_size: int):
        super().__init__()
        mid = cin * expand
        self.has_expand = expand != 1
        if self.has_expand:
            self.expand = nn.Conv2d(cin, mid, 1, bias=False)
            self.expand_bn = nn.BatchNorm2d(mid, eps=B0_BN_EPS, momentum=0.01)
        self.depthwise = _PaddedConv(mid, mid, kernel, stride, design_size, groups=mid)
        self.depthwise_bn = nn.BatchNorm2d(mid, eps=B0_BN_EPS, momentum=0.01)
        squeezed = max(1, int(cin * 0.25))
        self.se_reduce = nn.Conv2d(mid, squeezed, 1)
        self.se_expand = nn.Conv2d(squeezed, mid, 1)
        self.project = nn.Conv2d(mid, cout, 1, bias=False)
        self.project_bn = nn.BatchNorm2d(cout, eps=B0_BN_EPS, momentum=0.01)
        self.residual = stride == 1 and cin == cout
        self.stride = stride

    def forward(self, x: Tensor, drop_rate: float = 0.0) -> Tensor:
        y = F.silu(self.expand_bn(self.expand(x))) if self.has_expand else x
        y = F.silu(self.depthwise_bn(self.depthwise(y)))
        gate = self.se_expand(F.silu(self.se_reduce(y.mean(dim=(2, 3), keepdim=True))))
        y = self.project_bn(self.project(torch.sigmoid(gate) * y))
        if not self.residual:
            return y
        if self.training and drop_rate > 0:
            keep = 1.0 - drop_rate
            mask = torch.floor(keep + torch.rand(y.shape[0], 1, 1, 1, dtype=y.dtype, device=y.device))
            y = y / keep * mask
        return y + x


class EfficientNetB0Trunk(nn.Module):
    """EfficientNet-B0 features: (B, 3, H, W) -> [five maps at strides 2, 4, 8, 16, 32].

    H and W: multiples of 32 (the LSS Up blocks concatenate stride-16 and upsampled stride-32 maps).
    """

    widths = (16, 24, 40, 112, 320)

    def __init__(self):
        super().__init__()
        size = B0_DESIGN_SIZE
        self.stem = _PaddedConv(3, B0_STEM, 3, 2, size)
        self.stem_bn = nn.BatchNorm2d(B0_STEM, eps=B0_BN_EPS, momentum=0.01)
        size = math.ceil(size / 2)
        blocks, cin = [], B0_STEM
        for expand, kernel, stride, cout, repeats in B0_STAGES:
            for r in range(repeats):
                s = stride if r == 0 else 1
                blocks.append(MBConv(cin, cout, expand, kernel, s, size))
                size = math.ceil(size / s)
                cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.out_channels = cin

    def forward(self, x: Tensor) -> List[Tensor]:
        x = F.silu(self.stem_bn(self.stem(x)))
        reductions, prev = [], x
        n = len(self.blocks)
        for i, block in enumerate(self.blocks):
            x = block(x, B0_DROP_CONNECT * i / n)
            if x.shape[2] < prev.shape[2]:
                reductions.append(prev)
            prev = x
        reductions.append(x)
        return reductions


class Bottleneck(nn.Module):
    """1x1 conv, BN, ReLU, 3x3 conv (stride), BN, ReLU, 1x1 conv (4x width), BN, + shortcut, ReLU."""

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = 4 * width
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else None)

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNetTrunk(nn.Module):
    """ResNet stem + the first ``num_stages`` bottleneck stages: (B, 3, H, W) -> (B, out_channels,
    ceil(H / stride), ...) with stride ``2 ** (num_stages + 1)`` (stage 1 keeps the stem's stride 4)."""

    def __init__(self, blocks: Sequence[int] = R101_BLOCKS, num_stages: int = 2):
        super().__init__()
        if not 1 <= num_stages <= len(blocks):
            raise ValueError(f"resnet trunk: num_stages must be 1..{len(blocks)}, got {num_stages}")
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages, cin = [], 64
        for k in range(num_stages):
            width = R101_WIDTHS[k]
            stage = [Bottleneck(cin if j == 0 else 4 * width, width, (1 if k == 0 else 2) if j == 0 else 1)
                     for j in range(blocks[k])]
            stages.append(nn.Sequential(*stage))
            cin = 4 * width
        self.stages = nn.ModuleList(stages)
        self.out_channels = cin
        self.stride = 2 ** (num_stages + 1)
        # torchvision's initialisation, as the reference builds it (resnet101(zero_init_residual=True)):
        # convs He-normal over fan-out, BN weight 1 / bias 0, each block's last BN weight 0
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        for stage in self.stages:
            for block in stage:
                nn.init.zeros_(block.bn3.weight)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)
        for stage in self.stages:
            x = stage(x)
        return x


def build_trunk(name: str) -> nn.Module:
    """``efficientnet_b0`` | ``resnet101`` (two stages, as the reference LSS uses it)."""
    if name == "efficientnet_b0":
        return EfficientNetB0Trunk()
    if name == "resnet101":
        return ResNetTrunk(R101_BLOCKS, num_stages=2)
    raise ValueError(f"unknown image trunk {name!r}; one of ['efficientnet_b0', 'resnet101']")


TRUNKS = ("efficientnet_b0", "resnet101")
