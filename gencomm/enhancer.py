"""Channel Enhancer (CE): refines generated features, (N, C, H, W) -> (N, C, H, W).

Two residual stages, applied to each agent's generated feature:

1. Gated feed-forward refinement::

       y = PartialConv(x)                       3x3 conv on the first C*partial_ratio
                                                channels, the rest passed through
       v, g = split(Conv1x1(y, C -> 2E))        E = C * expansion
       g = DepthwiseConv3x3(g)                  spatial gate
       x = x + Conv1x1(v * GELU(g), E -> C)

2. Per-agent channel attention (each agent's map is pooled on its own)::

       s = 2 * sigmoid(MLP(mean_{H,W}(x)))      MLP: C -> C/r -> C, s in (0, 2)
       x = x * s

The last layers of both stages start at zero, so an untrained CE is exactly
the identity (s = 2 * sigmoid(0) = 1) and training starts from the generated
feature as is.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class PartialConv(nn.Module):
    """3x3 conv over the first ``k = round(C * ratio)`` channels; the others pass through."""

    def __init__(self, channels: int, ratio: float = 0.25):
        super().__init__()
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"PartialConv ratio must be in (0, 1], got {ratio}")
        self.conv_channels = max(1, round(channels * ratio))
        self.conv = nn.Conv2d(self.conv_channels, self.conv_channels, 3, padding=1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        k = self.conv_channels
        head = self.conv(x[:, :k])
        if k == x.shape[1]:
            return head
        return torch.cat([head, x[:, k:]], dim=1)


class ChannelEnhancer(nn.Module):
    """Gated feed-forward refinement + per-agent channel attention; (N, C, H, W) -> same.

    Args:
        channels: C.
        partial_ratio: fraction of channels the partial conv mixes.
        expansion: hidden width E = C * expansion of the gated feed-forward.
        reduction: r of the channel-attention MLP.
    """

    def __init__(self, channels: int = 128, partial_ratio: float = 0.25, expansion: float = 1.0,
                 reduction: int = 8):
        super().__init__()
        hidden = max(1, int(round(channels * expansion)))
        squeeze = max(1, channels // reduction)
        self.channels = channels
        self.out_channels = channels
        self.partial = PartialConv(channels, partial_ratio)
        self.expand = nn.Conv2d(channels, 2 * hidden, 1)
        self.gate_dw = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.project = nn.Conv2d(hidden, channels, 1)
        nn.init.zeros_(self.project.weight)
        nn.init.zeros_(self.project.bias)
        self.att_fc1 = nn.Linear(channels, squeeze)
        self.att_fc2 = nn.Linear(squeeze, channels)
        nn.init.zeros_(self.att_fc2.weight)
        nn.init.zeros_(self.att_fc2.bias)

    def forward(self, x: Tensor) -> Tensor:
        """x (N, C, H, W), one map per agent -> (N, C, H, W)."""
        if x.dim() != 4 or x.shape[1] != self.channels:
            raise ValueError(f"ChannelEnhancer expects (N, {self.channels}, H, W), got {tuple(x.shape)}")
        v, g = self.expand(self.partial(x)).chunk(2, dim=1)
        x = x + self.project(v * F.gelu(self.gate_dw(g)))
        s = self.att_fc2(F.relu(self.att_fc1(x.mean(dim=(2, 3)))))
        return x * (2.0 * s.sigmoid())[:, :, None, None]
