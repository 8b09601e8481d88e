"""Feature aligners: a per-type module after the shrink header that maps a type's BEV feature towards the
alliance's feature space, keeping width and grid (HEAL's ``AlignNet``; ``model.agent_types.<t>.aligner``).

:class:`ConvNeXtAligner` is HEAL's ``convnext`` aligner: ``num_blocks`` ConvNeXt blocks, each
``x + gamma * Linear(GELU(Linear(LayerNorm(dwconv(x)))))`` with a depth-wise ``kernel_size`` conv
(bias), LayerNorm over channels (eps 1e-6), a 4x wide pointwise MLP and a per-channel layer scale
``gamma`` (1e-6 at init). (A, C, H, W) -> (A, C, H, W), every map in its own agent frame.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


class ConvNeXtBlock(nn.Module):
    """One block (module docstring); ``channels`` wide."""

    def __init__(self, channels: int, kernel_size: int = 7):
        super().__init__()
        self.dwconv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)
        self.norm = nn.LayerNorm(channels, eps=1e-6)
        self.pwconv1 = nn.Linear(channels, 4 * channels)
        self.pwconv2 = nn.Linear(4 * channels, channels)
        self.gamma = nn.Parameter(torch.full((channels,), 1e-6))

    def forward(self, x: Tensor) -> Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # (A, H, W, C)
        y = self.gamma * self.pwconv2(nn.functional.gelu(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtAligner(nn.Module):
    """HEAL's ConvNeXt aligner. channels: the stack's output width (derived); num_blocks; kernel_size (odd)."""

    def __init__(self, channels: int, num_blocks: int = 3, kernel_size: int = 7):
        super().__init__()
        if int(num_blocks) < 1 or int(kernel_size) < 1 or int(kernel_size) % 2 == 0:
            raise ValueError(f"convnext aligner: num_blocks >= 1 and an odd kernel_size, got {num_blocks}, {kernel_size}")
        self.blocks = nn.Sequential(*[ConvNeXtBlock(int(channels), int(kernel_size)) for _ in range(int(num_blocks))])
        self.out_channels = int(channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.blocks(x)
