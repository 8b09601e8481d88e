"""Anchor-based detection head: 1x1 convs for class scores, box deltas and direction bins.

Channel layout matches the anchors (H, W, K, 7) of anchors.py: for anchor slot k,
``cls`` channels ``k * num_classes + c``, ``reg`` channels ``k * 7 + j``, ``dir``
channels ``k * num_dir_bins + b``. :meth:`HeadOutput.flat` reorders to
``(B, H * W * K, .)``, the order of ``AnchorGenerator.flat()``.

``dir_slots`` R (the reference's multi-class head, V2X-Real): the direction conv has
``R * num_dir_bins`` channels, one pair per anchor rotation, shared by the classes (the
reference's ``dir_head``: ``num_bins * anchor_number``); anchor slot ``k`` (size
``k // R``, rotation ``k % R``) reads channels ``(k % R) * num_dir_bins + b``.
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
    dir: (B, D * nbins, H, W) logits or None, D = ``dir_slots`` or K when None."""

    cls: torch.Tensor
    reg: torch.Tensor
    dir: Optional[torch.Tensor] = None
    dir_slots: Optional[int] = None

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

        def per_slot(t):  # direction pairs per rotation, repeated for each size (class) of the slot
            d = self.dir_slots
            b, ch, h, w = t.shape
            if k % d or ch % d:
                raise ValueError(f"direction map has {ch} channels for {d} slots, and {k} anchors per location")
            t = t.permute(0, 2, 3, 1).reshape(b, h, w, 1, d, ch // d)
            return t.expand(b, h, w, k // d, d, ch // d).reshape(b, h * w * k, ch // d)
        if self.dir is None:
            dirs = None
        else:
            dirs = per_anchor(self.dir) if self.dir_slots in (None, k) else per_slot(self.dir)
        return per_anchor(self.cls), per_anchor(self.reg), dirs


class AnchorHead(nn.Module):
    """(B, in_channels, H, W) fused BEV feature -> :class:`HeadOutput`.

    num_anchors_per_loc: ``AnchorGenerator.num_per_loc``; the class logits start
    at the focal-loss prior (sigmoid = 0.01) so training starts stable.
    dir_slots: direction pairs per location (module docstring); None: one per anchor slot.
    """

    def __init__(self, in_channels: int, num_anchors_per_loc: int = 2, num_classes: int = 1,
                 use_direction: bool = True, num_dir_bins: int = 2, prior_prob: float = 0.01,
                 dir_slots: Optional[int] = None):
        super().__init__()
        self.num_anchors_per_loc = int(num_anchors_per_loc)
        self.num_classes = int(num_classes)
        self.num_dir_bins = int(num_dir_bins)
        k = self.num_anchors_per_loc
        if dir_slots is not None and (int(dir_slots) < 1 or k % int(dir_slots)):
            raise ValueError(f"head: dir_slots {dir_slots} must divide the {k} anchors per location")
        self.dir_slots = None if dir_slots is None else int(dir_slots)
        self.cls = nn.Conv2d(in_channels, k * self.num_classes, 1)
        self.reg = nn.Conv2d(in_channels, k * BOX_DIM, 1)
        self.dir = nn.Conv2d(in_channels, (self.dir_slots or k) * self.num_dir_bins, 1) if use_direction else None
        nn.init.constant_(self.cls.bias, -math.log((1 - prior_prob) / prior_prob))
        nn.init.normal_(self.reg.weight, std=0.001)
        nn.init.zeros_(self.reg.bias)

    def forward(self, x: torch.Tensor) -> HeadOutput:
        return HeadOutput(cls=self.cls(x), reg=self.reg(x), dir=self.dir(x) if self.dir is not None else None,
                          dir_slots=self.dir_slots)
