"""Deformable Message Extractor (DME): BEV feature -> tiny spatial message.

One DME per agent TYPE, run at the sender. The message (N, m, H, W), m = 2 by
default, is what crosses the network instead of the (N, C, H, W) feature.

Layout (C = in_channels, D = hidden_channels, M = message_channels)::

    F (N, C, H, W)
      -> offset   Conv2d(C, 18, 3, pad 1, bias)            offsets (N, 2*3*3, H, W), (dy, dx) per tap
      -> deform   DeformConv2d(C, D, 3, pad 1, no bias) -> BatchNorm2d(D) -> ReLU
      -> SE gate  avgpool -> Linear(D, D/r) -> ReLU -> Linear(D/r, D) -> sigmoid, scales channels
      -> Conv2d(D, D, 1, no bias) -> BatchNorm2d(D) -> ReLU
      -> Conv2d(D, M, 1, bias)                              message (N, M, H, W)

Parameter arithmetic for C=128, D=64, M=2, r=2 (the defaults):

    offset conv   128*18*9 + 18          = 20,754
    deform conv   128*64*9               = 73,728
    BN(64)        2*64                   =    128
    SE            64*32+32 + 32*64+64    =  4,192
    1x1 conv      64*64                  =  4,096
    BN(64)        2*64                   =    128
    1x1 conv      64*2 + 2               =    130
    total                                = 103,156   (the paper: about 103k)

``variant: reference`` has the layers of the reference GenComm's MessageExtractorv2
(its ``bev_extractor``): the deformable conv has a bias and no BN/ReLU after it, the
1x1 conv has a bias and no BN; the SE gate is the same computation (the reference
writes it with 1x1 convs, whose weights the importer reshapes)::

    F -> offset conv -> DeformConv2d(C, D, 3, bias) -> SE gate
      -> Conv2d(D, D, 1, bias) -> ReLU -> Conv2d(D, M, 1, bias)

    offset conv 20,754 + deform conv 73,728 + 64 + SE 4,192 + 1x1 conv 4,096 + 64
    + 1x1 conv 130                                  = 103,028 at C=128, D=64, M=2, r=2

The offset conv starts at zero (so the deformable conv starts as a plain 3x3
conv), as is usual for deformable layers.
"""
from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from opencood_ext.models.deform_conv import DeformConv2d


class SqueezeExcitation(nn.Module):
    """Channel gate: (N, C, H, W) -> same, scaled by sigmoid(MLP(mean over H, W))."""

    def __init__(self, channels: int, reduction: int = 2):
        super().__init__()
        if channels % reduction:
            raise ValueError(f"SE: channels {channels} not divisible by reduction {reduction}")
        self.fc1 = nn.Linear(channels, channels // reduction)
        self.fc2 = nn.Linear(channels // reduction, channels)

    def forward(self, x: Tensor) -> Tensor:
        s = x.mean(dim=(2, 3))
        s = self.fc2(self.fc1(s).relu()).sigmoid()
        return x * s[:, :, None, None]


class DeformableMessageExtractor(nn.Module):
    """BEV feature (N, in_channels, H, W) -> message (N, message_channels, H, W).

    Args:
        in_channels: C of the sender's BEV feature.
        hidden_channels: D, width of the deformable conv and 1x1 stage.
        message_channels: M, channels of the transmitted message.
        se_reduction: r of the squeeze-excitation gate (D/r hidden units).
        kernel_size: deformable kernel (3 in the paper).
        variant: ``"default"`` (BatchNorm after the deformable and the 1x1 conv) or
            ``"reference"`` (the reference's layers: biases instead of BatchNorm, see above).
    """

    def __init__(self, in_channels: int = 128, hidden_channels: int = 64, message_channels: int = 2,
                 se_reduction: int = 2, kernel_size: int = 3,
                 variant: Literal["default", "reference"] = "default"):
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"DME kernel_size must be odd, got {kernel_size}")
        if variant not in ("default", "reference"):
            raise ValueError(f"DME variant must be 'default' or 'reference', got {variant!r}")
        pad = kernel_size // 2
        reference = variant == "reference"
        self.in_channels = in_channels
        self.out_channels = message_channels
        self.variant = variant
        self.offset = nn.Conv2d(in_channels, 2 * kernel_size * kernel_size, kernel_size, padding=pad)
        nn.init.zeros_(self.offset.weight)
        nn.init.zeros_(self.offset.bias)
        self.deform = DeformConv2d(in_channels, hidden_channels, kernel_size, padding=pad, bias=reference)
        self.bn1 = None if reference else nn.BatchNorm2d(hidden_channels)
        self.se = SqueezeExcitation(hidden_channels, se_reduction)
        self.conv1 = nn.Conv2d(hidden_channels, hidden_channels, 1, bias=reference)
        self.bn2 = None if reference else nn.BatchNorm2d(hidden_channels)
        self.head = nn.Conv2d(hidden_channels, message_channels, 1)

    def forward(self, feature: Tensor) -> Tensor:
        """feature (N, C, H, W) in the sender's frame -> message (N, M, H, W), same frame."""
        if feature.dim() != 4 or feature.shape[1] != self.in_channels:
            raise ValueError(
                f"DME expects (N, {self.in_channels}, H, W), got {tuple(feature.shape)}")
        x = self.deform(feature, self.offset(feature))
        if self.bn1 is not None:
            x = self.bn1(x).relu()
        x = self.conv1(self.se(x))
        if self.bn2 is not None:
            x = self.bn2(x)
        return self.head(x.relu())
