"""Anchors, the box coder and anchor-to-ground-truth target assignment.

Boxes are ``[x, y, z, l, w, h, yaw]`` (centre, FULL sizes, radians) in the ego
LiDAR frame. Anchors sit at BEV cell centres: on a feature map ``(H, W)`` over
``lidar_range``, cell (row r, column c) has centre
``x = xmin + (c + 0.5) (xmax - xmin) / W``, ``y = ymin + (r + 0.5) (ymax - ymin) / H``.
Anchors are ``(H, W, K, 7)`` with ``K = len(sizes) * len(rotations)``, slot
``k = size_index * len(rotations) + rotation_index``; flattened ``(H * W * K, 7)``
in that order, which is also the order of the head's channels (see head.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import List, Optional, Sequence, Union

import numpy as np
import torch

from opencood_ext.geometry.boxes import limit_period


def check_anchors(sizes, rotations) -> List[tuple]:
    """``sizes`` as (l, w, h) float triples, each positive, and ``rotations`` not empty; ValueError
    otherwise (what the config loader checks too: :mod:`opencood_ext.experiment_checks`)."""
    try:
        triples = [tuple(float(v) for v in size) for size in sizes]
        n_rot = len(rotations)
    except (TypeError, ValueError):
        triples, n_rot = [], 0
    if not triples or any(len(t) != 3 or not min(t) > 0 for t in triples) or not n_rot:
        raise ValueError(f"anchors: sizes must be positive (l, w, h) triples and rotations non-empty; "
                         f"got {sizes!r}, {rotations!r}")
    return triples


class AnchorGenerator:
    """Anchor boxes on a BEV feature grid.

    sizes: (l, w, h) per anchor size; rotations: yaw angles (radians);
    z_center: one value or one per size; size_classes: class index per size
    (multi-class, e.g. V2X-Real: one size per class); default all class 0.
    margin: None puts anchors at the cell centres (module docstring); ``(mx, my)`` metres
    places them as the reference VoxelPostprocessor does: ``W`` points evenly from
    ``xmin + mx`` to ``xmax - mx`` (both ends included), ``H`` from ``ymin + my`` to
    ``ymax - my``; the reference's margin is its voxel size, not half a feature cell, so its
    anchors sit up to half a cell off the feature cells' centres.
    protocol: "reference" without a margin computes the cell centres as the reference's
    ``generate_anchor_box_v2xreal`` (``align_center``): numpy's ``arange`` from ``xmin + dx / 2``
    by ``dx = (xmax - xmin) / W`` in float64, then float32 (up to one float32 step off the native
    float32 formula in about half the cells).
    """

    def __init__(self, lidar_range: Sequence[float], feature_size: Sequence[int],
                 sizes: Sequence[Sequence[float]] = ((3.9, 1.6, 1.56),),
                 rotations: Sequence[float] = (0.0, math.pi / 2),
                 z_center: Union[float, Sequence[float]] = -1.0,
                 size_classes: Optional[Sequence[int]] = None,
                 margin: Optional[Sequence[float]] = None, protocol: str = "native"):
        sizes = check_anchors(sizes, rotations)
        zs = [float(z_center)] * len(sizes) if isinstance(z_center, (int, float)) else [float(z) for z in z_center]
        classes = [0] * len(sizes) if size_classes is None else [int(c) for c in size_classes]
        if len(zs) != len(sizes) or len(classes) != len(sizes):
            raise ValueError(f"anchors: z_center and size_classes need one value per size ({len(sizes)})")
        H, W = (int(v) for v in feature_size)
        xmin, ymin, _, xmax, ymax, _ = (float(v) for v in lidar_range)
        self.feature_size = (H, W)
        self.num_per_loc = len(sizes) * len(rotations)
        self.num_rotations = len(rotations)
        self.num_classes = max(classes) + 1
        if margin is None and protocol == "reference":
            xs, ys = _aligned_centres(xmin, xmax, W, "x"), _aligned_centres(ymin, ymax, H, "y")
        elif margin is None:
            xs = (xmin + (torch.arange(W, dtype=torch.float32) + 0.5) * (xmax - xmin) / W).double()
            ys = (ymin + (torch.arange(H, dtype=torch.float32) + 0.5) * (ymax - ymin) / H).double()
        else:
            mx, my = (float(v) for v in margin) if len(margin) == 2 else (-1.0, -1.0)
            if not (0 <= mx < (xmax - xmin) / 2 and 0 <= my < (ymax - ymin) / 2):
                raise ValueError(f"anchors.margin must be (mx, my) metres, >= 0 and inside half the range, "
                                 f"got {list(margin)}")
            # as numpy's linspace in float64, then float32 (the reference's anchors are float64 arrays)
            xs = torch.linspace(xmin + mx, xmax - mx, W, dtype=torch.float64)
            ys = torch.linspace(ymin + my, ymax - my, H, dtype=torch.float64)
        per_loc = torch.tensor([[0.0, 0.0, z, *s, float(r)] for s, z in zip(sizes, zs) for r in rotations],
                               dtype=torch.float64)
        anchors = per_loc[None, None].repeat(H, W, 1, 1)  # (H, W, K, 7)
        anchors[..., 0] = xs[None, :, None]
        anchors[..., 1] = ys[:, None, None]
        # float64 as computed (the reference's anchors are float64 arrays; its targets use them so)
        self.anchors64 = anchors
        self.anchors = anchors.float()
        self.anchor_classes = torch.tensor([c for c in classes for _ in rotations], dtype=torch.long)  # (K,)

    def flat(self) -> torch.Tensor:
        """(H * W * K, 7) anchors."""
        return self.anchors.reshape(-1, 7)

    def flat64(self) -> torch.Tensor:
        """(H * W * K, 7) float64 anchors before their rounding to float32 (:attr:`anchors`)."""
        return self.anchors64.reshape(-1, 7)

    def flat_classes(self) -> torch.Tensor:
        """(H * W * K,) class index of each anchor."""
        return self.anchor_classes.repeat(self.feature_size[0] * self.feature_size[1])


def _aligned_centres(lo: float, hi: float, n: int, axis: str) -> torch.Tensor:
    """(n,) float64 cell centres as the reference's ``generate_anchor_box_v2xreal`` with
    ``align_center``: ``np.arange(lo + step / 2, hi + 1e-5, step)``, ``step = (hi - lo) / n``."""
    step = (hi - lo) / n
    centres = np.arange(lo + step / 2, hi + 1e-5, step)
    if len(centres) != n:
        raise ValueError(f"anchors: the reference's aligned centres give {len(centres)} values along {axis} "
                         f"for a feature map of {n} cells over [{lo}, {hi}]")
    return torch.from_numpy(centres)


class BoxCoder:
    """Residual encoding of boxes against anchors, and the direction bins.

    encode: dx = (x - xa) / da, dy = (y - ya) / da with da = sqrt(la^2 + wa^2),
    dz = (z - za) / ha, dl = log(l / la), dw, dh likewise, dyaw = yaw - yaw_a.
    Direction: ``num_dir_bins`` bins of ``2 pi / num_dir_bins`` starting at
    ``dir_offset``: ``bin = floor(((yaw - dir_offset) mod 2 pi) / period)``. The yaw
    regression cannot tell a box from its 180-degree turn; the bin can.
    """

    def __init__(self, dir_offset: float = math.pi / 4, num_dir_bins: int = 2):
        if num_dir_bins < 1:
            raise ValueError(f"num_dir_bins must be >= 1, got {num_dir_bins}")
        self.dir_offset = float(dir_offset)
        self.num_dir_bins = int(num_dir_bins)
        self.period = 2 * math.pi / self.num_dir_bins

    @staticmethod
    def encode(boxes: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """(N, 7) boxes, (N, 7) anchors -> (N, 7) deltas."""
        diag = torch.sqrt(anchors[:, 3] ** 2 + anchors[:, 4] ** 2)
        return torch.stack([
            (boxes[:, 0] - anchors[:, 0]) / diag,
            (boxes[:, 1] - anchors[:, 1]) / diag,
            (boxes[:, 2] - anchors[:, 2]) / anchors[:, 5],
            torch.log(boxes[:, 3] / anchors[:, 3]),
            torch.log(boxes[:, 4] / anchors[:, 4]),
            torch.log(boxes[:, 5] / anchors[:, 5]),
            boxes[:, 6] - anchors[:, 6],
        ], dim=1)

    @staticmethod
    def decode(deltas: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """(..., 7) deltas, (..., 7) anchors -> (..., 7) boxes (inverse of :meth:`encode`)."""
        diag = torch.sqrt(anchors[..., 3] ** 2 + anchors[..., 4] ** 2)
        return torch.stack([
            deltas[..., 0] * diag + anchors[..., 0],
            deltas[..., 1] * diag + anchors[..., 1],
            deltas[..., 2] * anchors[..., 5] + anchors[..., 2],
            torch.exp(deltas[..., 3]) * anchors[..., 3],
            torch.exp(deltas[..., 4]) * anchors[..., 4],
            torch.exp(deltas[..., 5]) * anchors[..., 5],
            deltas[..., 6] + anchors[..., 6],
        ], dim=-1)

    def dir_target(self, yaw: torch.Tensor) -> torch.Tensor:
        """(N,) yaw -> (N,) long direction bin."""
        rot = limit_period(yaw - self.dir_offset, 0.0, 2 * math.pi)
        return torch.floor(rot / self.period).long().clamp(0, self.num_dir_bins - 1)

    def apply_direction(self, yaw: torch.Tensor, dir_bin: torch.Tensor) -> torch.Tensor:
        """Put ``yaw`` into the half-turn (bin) ``dir_bin`` predicts; result in [-pi, pi)."""
        rot = limit_period(yaw - self.dir_offset, 0.0, self.period)
        out = rot + self.dir_offset + self.period * dir_bin.to(yaw.dtype)
        return limit_period(out, 0.5, 2 * math.pi)


@dataclass
class Targets:
    """Per-anchor training targets, shapes (N, ...) for one sample or (B, N, ...) stacked.

    labels: long, 1 positive, 0 negative, -1 ignored.
    gt_class: long class index of the matched GT for positives, -1 elsewhere.
    matched_gt: long index of the matched GT for positives, -1 elsewhere.
    reg_targets: (.., 7) :class:`BoxCoder` deltas (zero where not positive).
    dir_targets: long direction bin of the matched GT (0 where not positive).
    """

    labels: torch.Tensor
    gt_class: torch.Tensor
    matched_gt: torch.Tensor
    reg_targets: torch.Tensor
    dir_targets: torch.Tensor

    @property
    def cls_weights(self) -> torch.Tensor:
        """1 for positives and negatives, 0 for ignored anchors."""
        return (self.labels >= 0).float()

    @property
    def reg_weights(self) -> torch.Tensor:
        """1 for positives (box and direction losses), else 0."""
        return (self.labels > 0).float()

    @classmethod
    def stack(cls, items: List["Targets"]) -> "Targets":
        """Per-sample targets -> batched (B, N, ...)."""
        return cls(**{f.name: torch.stack([getattr(t, f.name) for t in items]) for f in fields(cls)})

    def to(self, device) -> "Targets":
        return type(self)(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def _per_class(value, classes: torch.Tensor) -> torch.Tensor:
    """Threshold given once or per class -> (len(classes),) tensor."""
    if isinstance(value, (int, float)):
        return torch.full(classes.shape, float(value))
    table = torch.tensor([float(v) for v in value])
    if classes.numel() and int(classes.max()) >= len(table):
        raise ValueError(f"IoU thresholds {list(value)} do not cover class {int(classes.max())}")
    return table[classes]


def _target_inputs(anchors, gt_boxes, gt_classes, anchor_classes, who: str):
    """(anchors (N, 7), gt (G, 7) float32, anchor classes (N,), gt classes (G,) long; class 0 when
    not given), checked; ValueError naming ``who`` on a shape mismatch."""
    anchors = torch.as_tensor(anchors, dtype=torch.float32)
    gt = torch.as_tensor(gt_boxes, dtype=torch.float32).reshape(-1, 7)
    n, g = anchors.shape[0], gt.shape[0]
    a_cls = torch.zeros(n, dtype=torch.long) if anchor_classes is None else torch.as_tensor(anchor_classes).long()
    g_cls = torch.zeros(g, dtype=torch.long) if gt_classes is None else torch.as_tensor(gt_classes).long()
    if a_cls.shape != (n,) or g_cls.shape != (g,):
        raise ValueError(f"{who}: anchor_classes must be ({n},) and gt_classes ({g},); got "
                         f"{tuple(a_cls.shape)}, {tuple(g_cls.shape)}")
    return anchors, gt, a_cls, g_cls


def _targets(labels, matched, anchors, gt, g_cls, coder) -> Targets:
    """Labels (N,) and matched box per anchor (N,) -> Targets: box, direction and class targets of
    the positives (both assigners end here)."""
    n = anchors.shape[0]
    pos = labels == 1
    reg = torch.zeros(n, 7)
    dirs = torch.zeros(n, dtype=torch.long)
    gt_class = torch.full((n,), -1, dtype=torch.long)
    if bool(pos.any()):
        m = matched[pos]
        reg[pos] = coder.encode(gt[m], anchors[pos])
        dirs[pos] = coder.dir_target(gt[m, 6])
        gt_class[pos] = g_cls[m]
    return Targets(labels=labels, gt_class=gt_class, matched_gt=matched, reg_targets=reg, dir_targets=dirs)


def assign_targets(anchors: torch.Tensor, gt_boxes: torch.Tensor,
                   pos_iou: Union[float, Sequence[float]] = 0.6,
                   neg_iou: Union[float, Sequence[float]] = 0.45,
                   coder: Optional[BoxCoder] = None, gt_classes: Optional[torch.Tensor] = None,
                   anchor_classes: Optional[torch.Tensor] = None) -> Targets:
    """Match anchors (N, 7) to ground truth (G, 7) by BEV rotated IoU.

    An anchor is positive when its best IoU >= pos_iou, negative when < neg_iou,
    else ignored. Each GT's best anchor(s) (ties included, IoU > 0) are positive
    for that GT even below pos_iou. Multi-class: anchors only match GTs of their
    own class (``anchor_classes`` (N,), ``gt_classes`` (G,)); thresholds may be
    given per class.
    """
    from opencood_ext.geometry.iou import bev_iou

    coder = coder or BoxCoder()
    anchors, gt, a_cls, g_cls = _target_inputs(anchors, gt_boxes, gt_classes, anchor_classes, "assign_targets")
    n, g = anchors.shape[0], gt.shape[0]
    labels = torch.zeros(n, dtype=torch.long)
    matched = torch.full((n,), -1, dtype=torch.long)
    if g:
        iou = bev_iou(anchors, gt)  # (N, G)
        iou = torch.where(a_cls[:, None] == g_cls[None, :], iou, torch.zeros_like(iou))
        best_iou, best_gt = iou.max(dim=1)
        pos_t, neg_t = _per_class(pos_iou, a_cls), _per_class(neg_iou, a_cls)
        labels = torch.where(best_iou >= pos_t, 1, torch.where(best_iou < neg_t, 0, -1)).long()
        matched = torch.where(labels == 1, best_gt, matched)
        # each GT's best anchors (ties included) are positive for that GT
        gt_best = iou.max(dim=0).values  # (G,)
        is_best = (iou == gt_best[None, :]) & (gt_best[None, :] > 0)  # (N, G)
        a_idx, g_idx = is_best.nonzero(as_tuple=True)
        labels[a_idx] = 1
        matched[a_idx] = g_idx
    return _targets(labels, matched, anchors, gt, g_cls, coder)


# corner offsets in units of (l, w, h): the bottom face, then the top (the reference's corner template)
_CORNER_SIGNS = ((1, -1, -1), (1, 1, -1), (-1, 1, -1), (-1, -1, -1), (1, -1, 1), (1, 1, 1), (-1, 1, 1), (-1, -1, 1))


def standup_reference(boxes: torch.Tensor) -> torch.Tensor:
    """(N, 7) boxes -> (N, 4) float32 ``[x1, y1, x2, y2]``, the axis-aligned BEV rectangle of the 8
    corners computed in the reference's arithmetic (``boxes_to_corners_3d``, ``corner2d_to_standup_box``):
    offsets ``(+-l/2, +-w/2, +-h/2)`` in float64 (its boxes are float64 arrays), then float32; the
    rotation ``[[c, s, 0], [-s, c, 0], [0, 0, 1]]`` from cos / sin in float64, then float32; the
    offsets times it in float32; the centre added in place (rounded to float32). Anchors fully inside
    a large box tie in exact arithmetic; the reference breaks such ties by these roundings."""
    boxes = boxes.double()
    signs = boxes.new_tensor(_CORNER_SIGNS) / 2
    local = (boxes[:, None, 3:6] * signs[None]).float()  # (N, 8, 3)
    c, s = torch.cos(boxes[:, 6]), torch.sin(boxes[:, 6])
    zero, one = torch.zeros_like(c), torch.ones_like(c)
    rot = torch.stack((c, s, zero, -s, c, zero, zero, zero, one), dim=1).view(-1, 3, 3).float()
    corners = torch.matmul(local, rot)
    corners += boxes[:, None, 0:3]
    xy = corners[..., :2]
    return torch.cat([xy.amin(dim=1), xy.amax(dim=1)], dim=1)


def standup_iou_reference(anchors: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
    """(N, G) IoU of the axis-aligned BEV rectangles (:func:`standup_reference`) around anchors (N, 7)
    and boxes (G, 7), as the reference's target assignment computes it (Fast R-CNN's ``bbox_overlaps``
    in float32): every side length and overlap counts one unit MORE than it measures (``x2 - x1 + 1``,
    in metres here), so rectangles up to 1 m apart still overlap a little and IoUs of car-sized boxes
    are pulled up. Give float64 anchors and boxes where the reference has them (its anchors are)."""
    a, g = standup_reference(anchors), standup_reference(gt)
    iw = (torch.minimum(a[:, None, 2], g[None, :, 2]) - torch.maximum(a[:, None, 0], g[None, :, 0]) + 1).clamp(min=0)
    ih = (torch.minimum(a[:, None, 3], g[None, :, 3]) - torch.maximum(a[:, None, 1], g[None, :, 1]) + 1).clamp(min=0)
    inter = iw * ih
    area_a = (a[:, 2] - a[:, 0] + 1) * (a[:, 3] - a[:, 1] + 1)
    area_g = (g[:, 2] - g[:, 0] + 1) * (g[:, 3] - g[:, 1] + 1)
    return torch.where(inter > 0, inter / (area_a[:, None] + area_g[None, :] - inter), torch.zeros_like(inter))


def assign_targets_reference(anchors: torch.Tensor, gt_boxes: torch.Tensor,
                             pos_iou: Union[float, Sequence[float]] = 0.6,
                             neg_iou: Union[float, Sequence[float]] = 0.45,
                             coder: Optional[BoxCoder] = None, gt_classes: Optional[torch.Tensor] = None,
                             anchor_classes: Optional[torch.Tensor] = None) -> Targets:
    """The reference VoxelPostprocessor's ``generate_label`` (protocol ``reference``), same arguments
    and result as :func:`assign_targets`. IoU is :func:`standup_iou_reference` (axis-aligned, +1);
    an anchor is positive when an IoU is ABOVE ``pos_iou`` (strictly), matched to the lowest-index
    such box; each box's single best anchor (the first on a tie, IoU > 0) is positive too, matched
    to it unless the anchor is a threshold positive already; negative when every IoU is below
    ``neg_iou`` and it is no box's best anchor; else ignored. Multi-class: IoUs across classes are 0
    (the reference's single-class rule per class: V2X-Real's ``generate_label_v2xreal``). The IoU
    takes anchors and boxes in the precision given (the model passes its float64 anchors, as the
    reference's); the box targets are encoded in float32."""
    coder = coder or BoxCoder()
    given = (torch.as_tensor(anchors), torch.as_tensor(gt_boxes).reshape(-1, 7))  # their precision, for the IoU
    anchors, gt, a_cls, g_cls = _target_inputs(anchors, gt_boxes, gt_classes, anchor_classes,
                                               "assign_targets_reference")
    n, g = anchors.shape[0], gt.shape[0]
    labels = torch.zeros(n, dtype=torch.long)
    matched = torch.full((n,), -1, dtype=torch.long)
    if g:
        iou = standup_iou_reference(*given)
        iou = torch.where(a_cls[:, None] == g_cls[None, :], iou, torch.zeros_like(iou))
        pos_t, neg_t = _per_class(pos_iou, a_cls), _per_class(neg_iou, a_cls)
        above = iou > pos_t[:, None]
        best = iou.argmax(dim=0)  # (G,) the first best anchor of each box
        best_ok = iou[best, torch.arange(g)] > 0
        is_best = torch.zeros(n, dtype=torch.bool)
        is_best[best[best_ok]] = True
        # a box index larger than any, for "no such box"
        first_above = torch.where(above, torch.arange(g)[None, :], torch.full_like(iou, g, dtype=torch.long)).amin(1)
        best_gt = torch.full((n,), g, dtype=torch.long)
        for j in reversed(torch.arange(g)[best_ok].tolist()):  # the lowest box index wins
            best_gt[best[j]] = j
        pos = (first_above < g) | is_best
        matched = torch.where(first_above < g, first_above, torch.where(is_best, best_gt, matched))
        neg = (iou < neg_t[:, None]).all(dim=1) & ~is_best
        labels = torch.where(pos, 1, torch.where(neg, 0, -1)).long()
    return _targets(labels, matched, anchors, gt, g_cls, coder)
