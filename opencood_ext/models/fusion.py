"""Fuse the agents' ego-frame BEV features of each sample into one map.

Input: features (sum N, C, H, W), the agents of all samples stacked, each
sample's ego FIRST, already warped into that sample's ego frame;
``agents_per_sample`` (B,) with sum N rows; optional ``valid`` (sum N, 1, H, W)
masks (e.g. :func:`opencood_ext.models.warp.warp_mask`) marking cells an agent
actually covers. Output: (B, C, H, W) in each sample's ego frame.

Samples are padded to the largest agent count and fused in one vectorised
pass over all pixels; a sample with one agent returns its ego feature.
The ego's cells always count as valid.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor, nn


def _pad_by_sample(features: Tensor, agents_per_sample: Sequence[int],
                   valid: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """-> padded (B, L, C, H, W) and validity (B, L, 1, H, W) bool (False for padding)."""
    counts = [int(c) for c in agents_per_sample]
    if features.dim() != 4:
        raise ValueError(f"fusion expects features (sum N, C, H, W), got {tuple(features.shape)}")
    if not counts or min(counts) < 1 or sum(counts) != features.shape[0]:
        raise ValueError(f"agents_per_sample {counts} must be >= 1 each and sum to {features.shape[0]} features")
    n, c, h, w = features.shape
    b, l_max = len(counts), max(counts)
    counts_t = torch.tensor(counts, device=features.device)
    sample = torch.repeat_interleave(torch.arange(b, device=features.device), counts_t)
    starts = torch.cumsum(counts_t, 0) - counts_t
    slot = torch.arange(n, device=features.device) - starts[sample]
    padded = features.new_zeros(b, l_max, c, h, w)
    padded[sample, slot] = features
    ok = torch.zeros(b, l_max, 1, h, w, dtype=torch.bool, device=features.device)
    if valid is None:
        ok[sample, slot] = True
    else:
        if valid.shape != (n, 1, h, w):
            raise ValueError(f"fusion valid mask must be ({n}, 1, {h}, {w}), got {tuple(valid.shape)}")
        ok[sample, slot] = valid > 0
    ok[:, 0] = True
    return padded, ok


def check_channels(op: nn.Module, features: Tensor) -> None:
    """Refuse features (sum N, C, H, W) whose C is not the width ``op.channels`` was built for
    (None: any width)."""
    if op.channels is not None and features.dim() == 4 and features.shape[1] != op.channels:
        raise ValueError(f"{type(op).__name__} built for {op.channels} channels, got {tuple(features.shape)}")


class MaxFusion(nn.Module):
    """Element-wise max over each sample's agents: (sum N, C, H, W) -> (B, C, H, W).
    channels: the feature width (derived by the detector; None accepts any)."""

    def __init__(self, channels: Optional[int] = None):
        super().__init__()
        self.channels = channels

    def forward(self, features: Tensor, agents_per_sample: Sequence[int],
                valid: Optional[Tensor] = None) -> Tensor:
        check_channels(self, features)
        x, ok = _pad_by_sample(features, agents_per_sample, valid)
        return x.masked_fill(~ok, float("-inf")).amax(dim=1)


class AttFusion(nn.Module):
    """Per-pixel scaled dot-product self-attention across a sample's agents; the ego's row is kept.

    At each cell, with agent features x_j (C,): ``a_j = softmax_j(x_ego . x_j / sqrt(C))``
    and the output is ``sum_j a_j x_j`` (no learned weights, OpenCOOD's AttFusion).
    (sum N, C, H, W) -> (B, C, H, W).
    """

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        self.out_channels = channels

    def forward(self, features: Tensor, agents_per_sample: Sequence[int],
                valid: Optional[Tensor] = None) -> Tensor:
        check_channels(self, features)
        x, ok = _pad_by_sample(features, agents_per_sample, valid)
        query = x[:, :1]  # (B, 1, C, H, W): the ego
        scores = (x * query).sum(dim=2, keepdim=True) / math.sqrt(self.channels)  # (B, L, 1, H, W)
        weights = torch.softmax(scores.masked_fill(~ok, float("-inf")), dim=1)
        return (weights * x).sum(dim=1)
