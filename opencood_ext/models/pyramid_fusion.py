"""Pyramid Fusion: HEAL's multi-scale fusion backbone with per-scale foreground maps
(Lu et al., HEAL, ICLR 2024; the computation of its ``heter_pyramid_collab`` model).

Every agent's BEV feature (sum N, C, H, W), each in ITS OWN frame, goes through a
shared multi-scale ResNet: level i is ``layer_nums[i]`` residual blocks, the first
with stride ``layer_strides[i]``, so level i has ``num_filters[i]`` channels on a
grid ``s_i = prod(layer_strides[:i + 1])`` times coarser than the input. A 1x1 conv
per level (the foreground head) gives an occupancy logit map ``o_i`` (N, 1, H/s_i,
W/s_i). At each level, per sample:

* the agents' level features and scores ``sigmoid(o_i) + 1e-4`` are warped into the
  ego frame (bilinear, zeros outside the sender's map, :func:`~.warp.warp_to_ego`:
  the same normalised affine at every resolution);
* a warped score of exactly 0 (outside the agent's map) becomes -inf, the scores are
  softmaxed over the sample's agents per cell (a cell no agent covers gets 0), and the
  fused level is ``sum_j softmax_j * feature_j``.

The fused levels are resampled to the input grid (``upsample_strides[i]``: transposed
conv, BN eps 1e-3, ReLU), concatenated (sum(num_upsample_filters) channels) and
optionally shrunk by a :class:`~.backbone.DownsampleConv` (HEAL's ``shrink_conv``).

Training adds HEAL's foreground loss on each agent's own maps (:meth:`occupancy_loss`):
a focal loss of ``o_i`` against "a cell holds a positive anchor", max-pooled to level
i, weighted ``pos_weight`` on positives and 1 on negatives (all anchors of the cell
negative, min-pooled), normalised per agent by its positive count, summed, divided by
the number of agents and multiplied by ``occupancy_weights[i]``.

Blocks: ``resnext: true`` uses HEAL's ResNeXt bottleneck (expansion 1, 32 groups of
width 4 per 64 planes); else basic blocks. Their BatchNorms use torch's default eps
(1e-5), as HEAL's ResNetModified does.
"""
from __future__ import annotations

import math
from typing import List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .backbone import BasicBlock, DownsampleConv, _LevelBackbone
from .losses import sigmoid_focal_loss
from .warp import warp_to_ego

GROUPS, WIDTH_PER_GROUP = 32, 4  # HEAL's ResNeXt setting (groups=32, width_per_group=4)
SCORE_FLOOR = 1e-4  # added to sigmoid(o_i), so every cell an agent covers has a positive score


class ResNeXtBlock(nn.Module):
    """1x1 conv -> grouped 3x3 conv (``stride``) -> 1x1 conv, BN (eps 1e-5) after each, ReLU after the
    first two and after the residual sum; the shortcut is a strided 1x1 conv + BN when the shape changes.
    Width of the grouped conv: ``(cout * WIDTH_PER_GROUP // 64) * GROUPS``. (A, cin, H, W) -> (A, cout, H/s, W/s)."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        width = (cout * WIDTH_PER_GROUP // 64) * GROUPS
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, groups=GROUPS, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: Tensor) -> Tensor:
        y = self.bn1(self.conv1(x)).relu()
        y = self.bn2(self.conv2(y)).relu()
        y = self.bn3(self.conv3(y))
        return (y + self.shortcut(x)).relu()


def _resnext_level(cin: int, cout: int, num: int, stride: int) -> nn.Module:
    return nn.Sequential(ResNeXtBlock(cin, cout, stride), *[ResNeXtBlock(cout, cout) for _ in range(num - 1)])


def _basic_level(cin: int, cout: int, num: int, stride: int) -> nn.Module:
    return nn.Sequential(BasicBlock(cin, cout, stride, eps=1e-5),
                         *[BasicBlock(cout, cout, eps=1e-5) for _ in range(num - 1)])


class PyramidFusion(nn.Module):
    """See the module docstring. Constructor arguments are ``model.fusion_args`` (``fusion_op: pyramid``).

    channels: the agents' feature width (derived). layer_nums / layer_strides / num_filters: the levels.
    upsample_strides / num_upsample_filters: each level's way back to the input grid (every level must
        end there: ``prod(layer_strides[:i + 1]) == upsample_strides[i]``).
    resnext: ResNeXt bottleneck blocks (HEAL's setting) or basic blocks.
    shrink: optional DownsampleConv after the fusion (``{kernel_size, stride, padding, dims}``, stride 1:
        the grid is kept); ``out_channels`` is its last width, else sum(num_upsample_filters).
    occupancy_weights: the foreground loss weight of each level (0 everywhere: no foreground loss); None:
        0.4 halved per level (HEAL's 0.4, 0.2, 0.1).
    occupancy_pos_weight: weight of a positive cell in the foreground loss (HEAL's pos_cls_weight).

    Under ``model.fusion: pyramid`` (:mod:`.pyramid_method`) the features arrive in their senders' frames
    and :meth:`collab` warps each level (HEAL's order); under ``intermediate`` :meth:`forward` receives
    features the link already warped into the ego frame (any link; the pyramid then runs after the warp,
    and no foreground loss is taken). Under ``none`` / ``late`` the head would read the unfused feature:
    those methods do not run the fusion op, so a pyramid model is evaluated with ``pyramid``.
    """

    def __init__(self, channels: int, layer_nums: Sequence[int] = (3, 5, 8),
                 layer_strides: Sequence[int] = (1, 2, 2), num_filters: Sequence[int] = (64, 128, 256),
                 upsample_strides: Sequence[int] = (1, 2, 4), num_upsample_filters: Sequence[int] = (128, 128, 128),
                 resnext: bool = True, shrink: Optional[Mapping] = None,
                 occupancy_weights: Optional[Sequence[float]] = None, occupancy_pos_weight: float = 2.0):
        super().__init__()
        self.channels = int(channels)
        self.backbone = _LevelBackbone(channels, layer_nums, layer_strides, num_filters, upsample_strides,
                                       num_upsample_filters, _resnext_level if resnext else _basic_level)
        if abs(self.backbone.out_stride - 1.0) > 1e-9:
            raise ValueError(f"pyramid fusion: the levels must end on the input grid (prod(layer_strides[:i+1]) "
                             f"== upsample_strides[i]); they end at stride {self.backbone.out_stride}")
        self.strides = [int(math.prod(int(s) for s in layer_strides[:i + 1])) for i in range(len(layer_nums))]
        self.occupancy = nn.ModuleList(nn.Conv2d(int(c), 1, 1) for c in num_filters)
        if occupancy_weights is None:
            occupancy_weights = [0.4 / 2 ** i for i in range(len(layer_nums))]
        if len(occupancy_weights) != len(layer_nums) or any(float(w) < 0 for w in occupancy_weights):
            raise ValueError(f"pyramid fusion: occupancy_weights needs one weight >= 0 per level "
                             f"({len(layer_nums)}), got {list(occupancy_weights)}")
        self.occupancy_weights = [float(w) for w in occupancy_weights]
        self.occupancy_pos_weight = float(occupancy_pos_weight)
        width = self.backbone.out_channels
        self.shrink = None
        if shrink is not None:
            self.shrink = DownsampleConv(width, **dict(shrink))
            if self.shrink.stride != 1:
                raise ValueError(f"pyramid fusion: shrink.stride must keep the grid (product 1), got "
                                 f"{list(shrink.get('stride', []))}")
            width = self.shrink.out_channels
        self.out_channels = int(width)

    # ------------------------------------------------------------------ pieces
    def levels(self, x: Tensor) -> Tuple[List[Tensor], List[Tensor]]:
        """(N, C, H, W) -> level features [(N, c_i, H/s_i, W/s_i)] and occupancy logits [(N, 1, H/s_i, W/s_i)],
        each in the frame its row came in."""
        if x.dim() != 4 or x.shape[1] != self.channels:
            raise ValueError(f"PyramidFusion built for (N, {self.channels}, H, W) features, got {tuple(x.shape)}")
        feats, occ = [], []
        for level, head in zip(self.backbone.levels, self.occupancy):
            x = level(x)
            feats.append(x)
            occ.append(head(x))
        return feats, occ

    def decode(self, fused: List[Tensor]) -> Tensor:
        """Fused levels [(B, c_i, H/s_i, W/s_i)] -> (B, out_channels, H, W): resample, concatenate, shrink."""
        x = torch.cat([up(f) for up, f in zip(self.backbone.ups, fused)], dim=1)
        return x if self.shrink is None else self.shrink(x)

    @staticmethod
    def weighted_fuse(feature: Tensor, score: Tensor, counts: Sequence[int]) -> Tensor:
        """feature (N, c, h, w) and score (N, 1, h, w), already in the ego frames, rows grouped by sample
        -> (B, c, h, w): per cell, softmax over the sample's agents of the score, a score of exactly 0
        excluded (a cell nobody covers: 0)."""
        out, start = [], 0
        for n in counts:
            s = score[start:start + n].masked_fill(score[start:start + n] == 0, float("-inf"))
            w = torch.softmax(s, dim=0)
            w = torch.where(torch.isnan(w), torch.zeros_like(w), w)
            out.append((feature[start:start + n] * w).sum(dim=0))
            start += n
        return torch.stack(out)

    # ------------------------------------------------------------------ the two orders
    def collab(self, features: Tensor, agents_per_sample: Sequence[int], T_ego_from_agent: Tensor,
               lidar_range: Sequence[float]) -> Tuple[Tensor, List[Tensor]]:
        """HEAL's order. features (sum N, C, H, W), each row in its own agent frame, each sample's ego first;
        T_ego_from_agent (sum N, 4, 4): row frame -> its sample's ego frame; lidar_range: every map's extent.
        -> fused (B, out_channels, H, W) in the ego frames, occupancy logits per level (sum N, 1, h_i, w_i)
        in the rows' own frames."""
        counts = [int(c) for c in agent_count_check(agents_per_sample, features.shape[0])]
        feats, occ = self.levels(features)
        fused = []
        for f, o in zip(feats, occ):
            score = torch.sigmoid(o) + SCORE_FLOOR
            fused.append(self.weighted_fuse(warp_to_ego(f, T_ego_from_agent, lidar_range),
                                            warp_to_ego(score, T_ego_from_agent, lidar_range), counts))
        return self.decode(fused), occ

    def forward(self, features: Tensor, agents_per_sample: Sequence[int], valid: Optional[Tensor] = None) -> Tensor:
        """The fusion-op interface of ``model.fusion: intermediate``: features (sum N, C, H, W) already in the
        ego frames (the link warped them), optional ``valid`` (sum N, 1, H, W) coverage; a level cell counts
        for an agent when any input cell under it is valid. -> (B, out_channels, H, W)."""
        counts = [int(c) for c in agent_count_check(agents_per_sample, features.shape[0])]
        feats, occ = self.levels(features)
        fused = []
        for f, o in zip(feats, occ):
            score = torch.sigmoid(o) + SCORE_FLOOR
            if valid is not None:
                score = score * F.adaptive_max_pool2d(valid.to(score.dtype), score.shape[-2:])
            fused.append(self.weighted_fuse(f, score, counts))
        return self.decode(fused)

    # ------------------------------------------------------------------ loss
    def occupancy_loss(self, occupancy: List[Tensor], labels: Tensor, alpha: float, gamma: float) -> Tensor:
        """HEAL's foreground loss (module docstring). occupancy: per level (N, 1, H/s_i, W/s_i) logits;
        labels: (N, H, W, K) anchor labels on the input grid, each agent's own (1 positive, 0 negative,
        -1 ignored); alpha / gamma: the focal loss's."""
        n = labels.shape[0]
        pos = (labels == 1).any(dim=-1)[:, None].float()  # (N, 1, H, W)
        neg = (labels == 0).all(dim=-1)[:, None].float()
        total = occupancy[0].new_zeros(())
        for o, s, w in zip(occupancy, self.strides, self.occupancy_weights):
            if o.shape[-2:] != (pos.shape[-2] // s, pos.shape[-1] // s):
                raise ValueError(f"occupancy map {tuple(o.shape)} does not match labels {tuple(labels.shape)} "
                                 f"at stride {s}")
            p = F.max_pool2d(pos, s) if s > 1 else pos
            q = 1 - F.max_pool2d(1 - neg, s) if s > 1 else neg
            weights = (p * self.occupancy_pos_weight + q) / p.sum(dim=(1, 2, 3), keepdim=True).clamp(min=1.0)
            focal = sigmoid_focal_loss(o, p, alpha, gamma) * weights
            total = total + w * focal.sum() / n
        return total


def agent_count_check(agents_per_sample: Sequence[int], rows: int) -> List[int]:
    """The per-sample agent counts, each >= 1 and summing to ``rows``; ValueError otherwise."""
    counts = [int(c) for c in agents_per_sample]
    if not counts or min(counts) < 1 or sum(counts) != rows:
        raise ValueError(f"agents_per_sample {counts} must be >= 1 each and sum to {rows} features")
    return counts


class NoShrink(nn.Module):
    """No shrink header (HEAL's pyramid stacks end on the backbone, an identity aligner): the feature
    passes unchanged. in_channels: derived; out_channels = in_channels; stride 1."""

    stride = 1

    def __init__(self, in_channels: int):
        super().__init__()
        self.out_channels = int(in_channels)

    def out_shape(self, in_hw: Tuple[int, int]) -> Tuple[int, int]:
        return tuple(in_hw)

    def forward(self, x: Tensor) -> Tensor:
        return x
