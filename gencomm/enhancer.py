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

``variant: reference`` (:class:`ReferenceEnhancer`) is the computation of the
reference GenComm's ``Enhancer``: its forward runs only ``block_1`` without its
window attention (commented out there) and the split attention, so only those
layers are built; the checkpoint's unused ``block_1.attn``, ``block_2`` and
``block_3`` are dropped by the weight importer.
"""
from __future__ import annotations

from typing import Literal, Optional

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


class ReferenceEnhancer(nn.Module):
    """The reference GenComm Enhancer's computation, per agent (N, C, H, W) -> same.

    With tokens x (N, H*W, C) (LayerNorms and linears act on channels, eps 1e-5)::

        x = x + LN1(x)                                   (its attention is disabled)
        y = LN2(x);  y[:C/4] = Conv3x3(y[:C/4], no bias)  partial conv on the first C/4 channels
        g, v = split(GELU(Linear(C, 4C)(y)))             2C each, g first
        x = x + Linear(2C, C)(GELU(DWConv3x3(g)) * v)   depth-wise conv with bias
        s = sigmoid(Linear(C, C, no bias)(ReLU(LN(Linear(C, C, no bias)(mean_{H,W} x)))))
        out = x * s                                      per agent, per channel

    Parameters at C=128: LN1 256 + LN2 256 + partial conv 32*32*9 = 9,216 + Linear(128, 512)
    66,048 + DWConv(256) 2,560 + Linear(256, 128) 32,896 + gate 16,384 + 256 + 16,384 = 144,256.
    """

    def __init__(self, channels: int = 128):
        super().__init__()
        if channels < 4:
            raise ValueError(f"ReferenceEnhancer needs channels >= 4 (a partial conv on C // 4), got {channels}")
        c, hidden = channels, 2 * channels
        self.partial_channels = c // 4
        self.norm1, self.norm2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.partial_conv = nn.Conv2d(self.partial_channels, self.partial_channels, 3, padding=1, bias=False)
        self.linear1 = nn.Linear(c, 2 * hidden)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.linear2 = nn.Linear(hidden, c)
        self.gate_fc1 = nn.Linear(c, c, bias=False)
        self.gate_norm = nn.LayerNorm(c)
        self.gate_fc2 = nn.Linear(c, c, bias=False)

    def _feed_forward(self, y: Tensor) -> Tensor:
        """(N, H, W, C) -> (N, H, W, C)."""
        k = self.partial_channels
        y = torch.cat([self.partial_conv(y[..., :k].permute(0, 3, 1, 2)).permute(0, 2, 3, 1), y[..., k:]], dim=-1)
        g, v = F.gelu(self.linear1(y)).chunk(2, dim=-1)
        g = F.gelu(self.dwconv(g.permute(0, 3, 1, 2))).permute(0, 2, 3, 1)
        return self.linear2(g * v)

    def forward(self, x: Tensor) -> Tensor:
        """x (N, C, H, W), one map per agent -> (N, C, H, W)."""
        x = x.permute(0, 2, 3, 1)
        x = x + self.norm1(x)
        x = x + self._feed_forward(self.norm2(x))
        s = self.gate_fc2(F.relu(self.gate_norm(self.gate_fc1(x.mean(dim=(1, 2)))))).sigmoid()
        return (x * s[:, None, None, :]).permute(0, 3, 1, 2).contiguous()


class ChannelEnhancer(nn.Module):
    """Gated feed-forward refinement + per-agent channel attention; (N, C, H, W) -> same.

    Args:
        channels: C.
        partial_ratio: fraction of channels the partial conv mixes (None: 0.25).
        expansion: hidden width E = C * expansion of the gated feed-forward (None: 1.0).
        reduction: r of the channel-attention MLP (None: 8).
        variant: ``"default"`` (the module above) or ``"reference"`` (:class:`ReferenceEnhancer`,
            the reference's fixed structure: partial_ratio, expansion and reduction stay unset).
    """

    def __init__(self, channels: int = 128, partial_ratio: Optional[float] = None,
                 expansion: Optional[float] = None, reduction: Optional[int] = None,
                 variant: Literal["default", "reference"] = "default"):
        super().__init__()
        if variant not in ("default", "reference"):
            raise ValueError(f"ChannelEnhancer variant must be 'default' or 'reference', got {variant!r}")
        self.channels = channels
        self.out_channels = channels
        self.variant = variant
        if variant == "reference":
            if (partial_ratio, expansion, reduction) != (None, None, None):
                raise ValueError("ChannelEnhancer partial_ratio / expansion / reduction apply to variant "
                                 "'default' only")
            self.reference = ReferenceEnhancer(channels)
            return
        partial_ratio = 0.25 if partial_ratio is None else partial_ratio
        expansion = 1.0 if expansion is None else expansion
        reduction = 8 if reduction is None else reduction
        hidden = max(1, int(round(channels * expansion)))
        squeeze = max(1, channels // reduction)
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
        if self.variant == "reference":
            return self.reference(x)
        v, g = self.expand(self.partial(x)).chunk(2, dim=1)
        x = x + self.project(v * F.gelu(self.gate_dw(g)))
        s = self.att_fc2(F.relu(self.att_fc1(x.mean(dim=(2, 3)))))
        return x * (2.0 * s.sigmoid())[:, :, None, None]
