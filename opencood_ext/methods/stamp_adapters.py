"""STAMP's adapter variants besides the ConvNeXt one (:class:`~.stamp.DomainAdapter`), and the
builder that picks one by the name STAMP's yamls give it (``adapter.core_method``).

Facts read from taco-group/STAMP ``opencood/models/fuse_modules/adapter.py`` (``AdapterConv``,
``AdapterAtt``) and ``sub_modules/feature_alignnet_modules.py`` (``AttBlock``); all three map a
(n, C, H, W) feature to (n, C, H, W) on the same grid here (the reference's bilinear resize and
zero pad are the identity when ``in_feature_shape`` equals ``out_feature_shape``, which the
importer requires):

* ``adapterconvnext``: :class:`~.stamp.DomainAdapter` (1x1 conv to ``dim``, ConvNeXt blocks, 1x1 back).
* ``adapterconv``: :class:`ConvAdapter`, ONE 1x1 conv C -> C with bias; nothing else.
* ``adapteratt``: :class:`AttentionAdapter`: 1x1 conv C -> dim; a p x p conv of stride p (the
  "patch embedding", p = ``patch_size``) to (n, dim, H/p, W/p), flattened to N = HW/p^2 tokens
  per row; plus a learned position table (N, dim); ``depth`` pre-norm blocks (LayerNorm, multi-head
  attention without biases and residual; LayerNorm, dim -> 4 dim -> dim MLP with GELU and residual);
  a final LayerNorm; back to (n, dim, H/p, W/p), bilinear upsampling by p (align_corners False),
  1x1 conv dim -> C. STAMP builds a 3x3 "smoothing" conv it never applies (not built here).

The attention's sequence axis: the reference hands ``nn.MultiheadAttention`` (sequence-first) a
(n, N, dim) tensor, so its sequence is the n ROWS passed together and its batch the N token
positions: at each position the rows attend to each other; the tokens of one row never do. The
reference passes all agents of one type in the batch to an adapter at once, and to a reverter the
protocol features of all agents of one sending type. A row's output thus depends on the other rows
of its call (:data:`ROW_COUPLED`); a single row attends to itself only (softmax over one score: its
value projection). Callers must group rows as the reference does (:mod:`.stamp_collab`).
"""
from __future__ import annotations

import math
from typing import Literal, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .stamp import DomainAdapter

AdapterKind = Literal["adapterconvnext", "adapterconv", "adapteratt"]
#: variants whose output for one row depends on the other rows of the same call
ROW_COUPLED = frozenset({"adapteratt"})
#: STAMP's defaults (its submodule_args.get(...) fall-backs)
ATT_DEFAULTS = {"hidden_channels": 64, "blocks": 3, "num_heads": 4, "patch_size": 16}
CONVNEXT_DEFAULTS = {"hidden_channels": 64, "blocks": 3, "kernel_size": 7}


class ConvAdapter(nn.Module):
    """STAMP's AdapterConv at feature ratio 1: (n, C, H, W) -> (n, C, H, W) by one 1x1 conv with bias."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


class RowAttention(nn.Module):
    """Multi-head attention across the ROWS of (n, N, dim) at each of the N positions (module
    docstring), without biases: q, k, v = x W_qkv^T split in three; per head (dim / heads wide)
    softmax(q k^T / sqrt(dim / heads)) v over the n rows; heads concatenated; out = that W_out^T."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"STAMP attention adapter: hidden_channels {dim} must be divisible by num_heads "
                             f"{num_heads}")
        self.heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        n, N, dim = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each (n, N, dim)

        def split(t: Tensor) -> Tensor:  # (n, N, dim) -> (N, heads, n, dim / heads)
            return t.reshape(n, N, self.heads, dim // self.heads).permute(1, 2, 0, 3)

        q, k, v = split(q), split(k), split(v)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dim // self.heads), dim=-1)  # (N, h, n, n)
        y = (weights @ v).permute(2, 0, 1, 3).reshape(n, N, dim)
        return self.out(y)


class AttentionBlock(nn.Module):
    """(n, N, dim) -> same: x + attn(LN(x)), then + MLP(LN(.)) (dim -> 4 dim -> dim, GELU)."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = RowAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.expand = nn.Linear(dim, 4 * dim)
        self.project = nn.Linear(4 * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.project(F.gelu(self.expand(self.norm2(x))))


class AttentionAdapter(nn.Module):
    """STAMP's AdapterAtt at feature ratio 1 (module docstring): (n, C, H, W) -> (n, C, H, W) with
    (H, W) = ``feature_shape`` (the learned position table has one entry per patch of that grid)."""

    def __init__(self, channels: int, feature_shape: Sequence[int], hidden_channels: int = 64, blocks: int = 3,
                 num_heads: int = 4, patch_size: int = 16):
        super().__init__()
        H, W = (int(v) for v in feature_shape)
        if min(channels, hidden_channels, blocks, num_heads, patch_size) < 1 or H % patch_size or W % patch_size:
            raise ValueError(f"STAMP attention adapter: channels {channels}, hidden_channels {hidden_channels}, "
                             f"blocks {blocks}, num_heads {num_heads}, patch_size {patch_size} must be >= 1 and "
                             f"feature_shape {[H, W]} divisible by patch_size")
        self.feature_shape = (H, W)
        self.patch_size = int(patch_size)
        self.reduce = nn.Conv2d(channels, hidden_channels, 1)
        self.embed = nn.Conv2d(hidden_channels, hidden_channels, patch_size, stride=patch_size)
        self.position = nn.Parameter(torch.zeros(1, (H // patch_size) * (W // patch_size), hidden_channels))
        self.blocks = nn.Sequential(*[AttentionBlock(hidden_channels, num_heads) for _ in range(blocks)])
        self.norm = nn.LayerNorm(hidden_channels)
        self.restore = nn.Conv2d(hidden_channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        if tuple(x.shape[-2:]) != self.feature_shape:
            raise ValueError(f"STAMP attention adapter built for a {list(self.feature_shape)} feature grid "
                             f"(model.link.feature_shape) got {list(x.shape[-2:])}")
        y = self.embed(self.reduce(x))  # (n, dim, h, w), h = H / p
        n, dim, h, w = y.shape
        tokens = self.norm(self.blocks(y.flatten(2).transpose(1, 2) + self.position))  # (n, h w, dim)
        y = tokens.transpose(1, 2).reshape(n, dim, h, w)
        if self.patch_size > 1:
            y = F.interpolate(y, scale_factor=self.patch_size, mode="bilinear", align_corners=False)
        return self.restore(y)


def build_adapter(kind: AdapterKind, channels: int, hidden_channels: Optional[int] = None,
                  blocks: Optional[int] = None, kernel_size: Optional[int] = None, num_heads: Optional[int] = None,
                  patch_size: Optional[int] = None, feature_shape: Optional[Sequence[int]] = None) -> nn.Module:
    """One adapter or reverter of variant ``kind`` on ``channels``; an argument the variant does not
    read must be unset (model.link: a key the code would ignore is refused, one line)."""
    given = {"hidden_channels": hidden_channels, "blocks": blocks, "kernel_size": kernel_size,
             "num_heads": num_heads, "patch_size": patch_size, "feature_shape": feature_shape}
    reads = {"adapterconvnext": CONVNEXT_DEFAULTS, "adapterconv": {},
             "adapteratt": {**ATT_DEFAULTS, "feature_shape": None}}
    if kind not in reads:
        raise ValueError(f"model.link.adapter {kind!r}: one of {sorted(reads)}")
    unread = sorted(k for k, v in given.items() if v is not None and k not in reads[kind])
    if unread:
        raise ValueError(f"model.link: {unread} are not arguments of the {kind} adapter (it reads "
                         f"{sorted(reads[kind]) or 'none'})")
    args = {k: (given[k] if given[k] is not None else default) for k, default in reads[kind].items()}
    if kind == "adapterconv":
        return ConvAdapter(channels)
    if kind == "adapteratt":
        if feature_shape is None:
            raise ValueError("model.link.feature_shape: the attention adapter needs the feature grid [H, W] "
                             "(its position table has one entry per patch)")
        return AttentionAdapter(channels, **args)
    return DomainAdapter(channels, **args)
