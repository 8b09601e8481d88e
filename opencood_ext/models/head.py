"""Anchor-based detection head: 1x1 convs for class scores, box deltas and direction bins.

Channel layout matches the anchors (H, W, K, 7) of anchors.py: for anchor slot k,
``cls`` channels ``k * num_classes + c``, ``reg`` channels ``k * 7 + j``, ``dir``
channels ``k * num_dir_bins + b``. :meth:`HeadOutput.flat` reorders to
``(B, H * W * K, .)``, the order of ``AnchorGenerator.flat()``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn

BOX_DIM = 7


@dataclass
class HeadOutput:
    """cls: (B, K * ncls, H, W) logits; reg: (B, K * 7, H, W) deltas;
    dir: (B, K * nbins, H, W) logits or None."""

    cls: torch.Tensor
    reg: torch.Tensor
    dir: Optional[torch.Tensor] = None

    @property
    def num_anchors_per_loc(self) -> int:
        return self.reg.shape[1] // BOX_DIM

    def flat(self) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """-> cls (B, HWK, ncls), reg (B, HWK, 7), dir (B, HWK, nbins) or None."""
        k = self.num_anchors_per_loc

        def per_anchor(t):
            b, ch, h, w = t.shape
            if ch % k:
                raise ValueError(f"head map has {ch} channels, not a multiple of {k} anchors per location")
            return t.permute(0, 2, 3, 1).reshape(b, h * w * k, ch // k)
        return per_anchor(self.cls), per_anchor(self.reg), (per_anchor(self.dir) if self.dir is not None else None)


class AnchorHead(nn.Module):
    """(B, in_channels, H, W) fused BEV feature -> :class:`HeadOutput`.

    num_anchors_per_loc: ``AnchorGenerator.num_per_loc``; the class logits start
    at the focal-loss prior (sigmoid = 0.01) so training starts stable.
    """

    def __init__(self, in_channels: int, num_anchors_per_loc: int = 2, num_classes: int = 1,
                 use_direction: bool = True, num_dir_bins: int = 2, prior_prob: float = 0.01):
        super().__init__()
        self.num_anchors_per_loc = int(num_anchors_per_loc)
        self.num_classes = int(num_classes)
        self.num_dir_bins = int(num_dir_bins)
        k = self.num_anchors_per_loc
        self.cls = nn.Conv2d(in_channels, k * self.num_classes, 1)
        self.reg = nn.Conv2d(in_channels, k * BOX_DIM, 1)
        self.dir = nn.Conv2d(in_channels, k * self.num_dir_bins, 1) if use_direction else None
        nn.init.constant_(self.cls.bias, -math.log((1 - prior_prob) / prior_prob))
        nn.init.normal_(self.reg.weight, std=0.001)
        nn.init.zeros_(self.reg.bias)

    def forward(self, x: torch.Tensor) -> HeadOutput:
        return HeadOutput(cls=self.cls(x), reg=self.reg(x), dir=self.dir(x) if self.dir is not None else None)
