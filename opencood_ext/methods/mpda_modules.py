"""MPDA's receiver-side modules (Xu et al., "Bridging the Domain Gap for Multi-Agent
Perception", ICRA 2023), sized as in the GenComm reference baseline.

* :class:`FeatureResizer`: 1x1 channel selector, window + grid self-attention
  (:class:`SwapEncoder`), resize to the receiver's grid, residual conv blocks,
  window + grid self-attention again, plus a resized shortcut.
* :class:`CrossDomainEncoder`: cross attention with the collaborator's feature as
  queries and the receiver's own feature as keys / values, inside local windows,
  then across a sparse grid, each followed by an MLP.
* :class:`DomainClassifier`: a per-cell ego-vs-collaborator classifier behind a
  gradient reversal layer (adversarial feature alignment).

Window / grid partition of a (b, C, H, W) map with window ``w``: a local window
holds the w x w neighbouring cells; a grid group holds w x w cells spaced H/w
and W/w apart. H and W are zero-padded to multiples of ``w`` and cropped back.
"""
from __future__ import annotations

import math
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def partition(x: Tensor, w: int, grid: bool) -> Tuple[Tensor, tuple]:
    """(b, C, H, W) -> tokens (b * H/w * W/w, w*w, C) (H, W padded to multiples of ``w``),
    and what :func:`merge` needs to undo it."""
    b, C, H, W = x.shape
    ph, pw = -H % w, -W % w
    if ph or pw:
        x = F.pad(x, (0, pw, 0, ph))
    nh, nw = (H + ph) // w, (W + pw) // w
    if grid:   # cell row = w1 * nh + i
        t = x.reshape(b, C, w, nh, w, nw).permute(0, 3, 5, 2, 4, 1)
    else:      # cell row = i * w + w1
        t = x.reshape(b, C, nh, w, nw, w).permute(0, 2, 4, 3, 5, 1)
    return t.reshape(b * nh * nw, w * w, C), (b, C, H, W, nh, nw, w, grid)


def merge(t: Tensor, info: tuple) -> Tensor:
    """Inverse of :func:`partition`: tokens -> (b, C, H, W)."""
    b, C, H, W, nh, nw, w, grid = info
    t = t.reshape(b, nh, nw, w, w, C)
    x = t.permute(0, 5, 3, 1, 4, 2) if grid else t.permute(0, 5, 1, 3, 2, 4)
    return x.reshape(b, C, nh * w, nw * w)[:, :, :H, :W]


class WindowSelfAttention(nn.Module):
    """Multi-head self-attention over the w*w tokens of a window, with a learned relative
    position bias. dim // dim_head heads."""

    def __init__(self, dim: int, dim_head: int, window: int, dropout: float):
        super().__init__()
        if dim % dim_head:
            raise ValueError(f"MPDA attention: channels {dim} must be a multiple of dim_head {dim_head}")
        self.heads, self.dim_head = dim // dim_head, dim_head
        self.to_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.drop = nn.Dropout(dropout)
        self.to_out = nn.Sequential(nn.Linear(dim, dim, bias=False), nn.Dropout(dropout))
        self.rel_pos_bias = nn.Embedding((2 * window - 1) ** 2, self.heads)
        pos = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1).T
        rel = pos[:, None, :] - pos[None, :, :] + window - 1
        self.register_buffer("rel_index", rel[..., 0] * (2 * window - 1) + rel[..., 1], persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        B, n, _ = x.shape
        q, k, v = (t.reshape(B, n, self.heads, self.dim_head).transpose(1, 2) for t in self.to_qkv(x).chunk(3, -1))
        sim = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dim_head)
        sim = sim + self.rel_pos_bias(self.rel_index).permute(2, 0, 1)
        out = torch.matmul(self.drop(sim.softmax(-1)), v)
        return self.to_out(out.transpose(1, 2).reshape(B, n, -1))


class _PreNorm(nn.Module):
    """x + fn(LayerNorm(x)) on tokens."""

    def __init__(self, dim: int, fn: nn.Module):
        super().__init__()
        self.norm, self.fn = nn.LayerNorm(dim), fn

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fn(self.norm(x))


def _mlp(dim: int, hidden: int, dropout: float = 0.0) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim),
                         nn.Dropout(dropout))


class SwapBlock(nn.Module):
    """Window attention + MLP, then grid attention + MLP (pre-norm residuals)."""

    def __init__(self, dim: int, mlp_dim: int, dim_head: int, window: int, dropout: float):
        super().__init__()
        self.window = window
        self.local = nn.Sequential(_PreNorm(dim, WindowSelfAttention(dim, dim_head, window, dropout)),
                                   _PreNorm(dim, _mlp(dim, mlp_dim, dropout)))
        self.grid = nn.Sequential(_PreNorm(dim, WindowSelfAttention(dim, dim_head, window, dropout)),
                                  _PreNorm(dim, _mlp(dim, mlp_dim, dropout)))

    def forward(self, x: Tensor) -> Tensor:
        t, info = partition(x, self.window, grid=False)
        x = merge(self.local(t), info)
        t, info = partition(x, self.window, grid=True)
        return merge(self.grid(t), info)


class _ChannelHead(nn.Module):
    """LayerNorm + Linear over the channels of a (b, C, H, W) map."""

    def __init__(self, dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class SwapEncoder(nn.Module):
    """``depth`` swap blocks and a channel head: (b, C, H, W) -> same."""

    def __init__(self, dim: int, mlp_dim: int, dim_head: int, window: int, dropout: float, depth: int):
        super().__init__()
        self.blocks = nn.Sequential(*[SwapBlock(dim, mlp_dim, dim_head, window, dropout) for _ in range(depth)])
        self.head = _ChannelHead(dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(x))


class ResidualBlock(nn.Module):
    """x + BN(conv3x3(LeakyReLU(BN(conv3x3(x)))))."""

    def __init__(self, dim: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(dim, dim, 3, padding=1), nn.BatchNorm2d(dim), nn.LeakyReLU(),
                                  nn.Conv2d(dim, dim, 3, padding=1), nn.BatchNorm2d(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x)


class FeatureResizer(nn.Module):
    """MPDA's learnable resizer: the collaborator's (b, C_in, h, w) feature -> (b, C, H, W) on the
    receiver's grid. Reference sizes: mlp_dim 256, dim_head 32, window 2, dropout 0.1, depth 1,
    2 residual blocks."""

    def __init__(self, in_channels: int, channels: int, mlp_dim: int = 256, dim_head: int = 32, window: int = 2,
                 dropout: float = 0.1, depth: int = 1, residual_blocks: int = 2):
        super().__init__()
        self.select = nn.Conv2d(in_channels, channels, 1)
        self.attend_in = SwapEncoder(channels, mlp_dim, dim_head, window, dropout, depth)
        self.blocks = nn.Sequential(*[ResidualBlock(channels) for _ in range(residual_blocks)])
        self.attend_out = SwapEncoder(channels, mlp_dim, dim_head, window, dropout, depth)

    @staticmethod
    def _resize(x: Tensor, size) -> Tensor:
        return x if tuple(x.shape[-2:]) == tuple(size) else \
            F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)

    def forward(self, cav: Tensor, size) -> Tensor:
        cav = self.select(cav)
        first = self._resize(self.attend_in(cav), size)
        return self._resize(cav, size) + self.attend_out(self.blocks(first) + first)


class CrossAttention(nn.Module):
    """Queries from one token set, keys / values from another (each pre-normed), per window;
    ``heads`` x ``dim_head`` inner width, output projected back to ``dim``, plus the queries."""

    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        inner = heads * dim_head
        self.heads, self.dim_head = heads, dim_head
        self.to_q, self.to_k, self.to_v = (nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, inner))
                                           for _ in range(3))
        self.proj = nn.Linear(inner, dim)

    def forward(self, q: Tensor, kv: Tensor) -> Tensor:
        B, n, _ = q.shape

        def heads(t):
            return t.reshape(B, -1, self.heads, self.dim_head).transpose(1, 2)

        Q, K, V = heads(self.to_q(q)), heads(self.to_k(kv)), heads(self.to_v(kv))
        att = (torch.matmul(Q, K.transpose(-1, -2)) / math.sqrt(self.dim_head)).softmax(-1)
        return q + self.proj(torch.matmul(att, V).transpose(1, 2).reshape(B, n, -1))


class CrossDomainBlock(nn.Module):
    """Local-window cross attention + MLP, grid cross attention + MLP, LayerNorm."""

    def __init__(self, dim: int, heads: int, dim_head: int, window: int):
        super().__init__()
        self.window = window
        self.cross_local, self.cross_grid = CrossAttention(dim, heads, dim_head), CrossAttention(dim, heads, dim_head)
        self.mlp_local, self.mlp_grid = (_PreNorm(dim, _mlp(dim, 2 * dim)) for _ in range(2))
        self.norm = nn.LayerNorm(dim)

    def forward(self, cav: Tensor, ego: Tensor) -> Tensor:
        for grid, cross, mlp in ((False, self.cross_local, self.mlp_local), (True, self.cross_grid, self.mlp_grid)):
            q, info = partition(cav, self.window, grid)
            kv, _ = partition(ego, self.window, grid)
            cav = merge(mlp(cross(q, kv)), info)
        return self.norm(cav.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class CrossDomainEncoder(nn.Module):
    """``depth`` cross-domain blocks and a channel head: (cav, ego) (b, C, H, W) each -> (b, C, H, W).
    Reference sizes: heads 16, dim_head 32, window 2, depth 1."""

    def __init__(self, channels: int, heads: int = 16, dim_head: int = 32, window: int = 2, depth: int = 1):
        super().__init__()
        self.blocks = nn.ModuleList([CrossDomainBlock(channels, heads, dim_head, window) for _ in range(depth)])
        self.head = _ChannelHead(channels)

    def forward(self, cav: Tensor, ego: Tensor) -> Tensor:
        for block in self.blocks:
            cav = block(cav, ego)
        return self.head(cav)


class _ReverseGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.scale * grad, None


class DomainClassifier(nn.Module):
    """Per-cell domain logit (b, 1, H, W) of a (b, C, H, W) feature: 1x1 conv to ``hidden``, ReLU,
    1x1 conv to 1, behind a gradient reversal layer that multiplies the gradient reaching the
    feature by -``reverse_scale`` (the reference: hidden 512, scale 9.1, weights N(0, 0.001))."""

    def __init__(self, channels: int, hidden: int = 512, reverse_scale: float = 9.1):
        super().__init__()
        self.reverse_scale = float(reverse_scale)
        self.conv1, self.conv2 = nn.Conv2d(channels, hidden, 1), nn.Conv2d(hidden, 1, 1)
        for conv in (self.conv1, self.conv2):
            nn.init.normal_(conv.weight, std=0.001)
            nn.init.zeros_(conv.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv2(F.relu(self.conv1(_ReverseGradient.apply(x, self.reverse_scale))))
