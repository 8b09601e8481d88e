"""Head output -> final detections (the field's OpenCOOD-style post-processing).

Per batch item and class: sigmoid scores above ``score_threshold`` -> decode
the anchors' deltas (:class:`BoxCoder`) -> put each yaw in the half-turn its
direction bin predicts -> rotated NMS at ``nms_iou`` (BEV IoU, per class) ->
keep boxes whose 8 corners all lie inside ``gt_range``, z included (the field's
rule, :func:`~opencood_ext.geometry.boxes_inside_range`) -> at most
``max_boxes`` by score. Boxes are ``[x, y, z, l, w, h, yaw]`` in the ego LiDAR frame.

``protocol="reference"`` computes instead what the GenComm reference / HEAL code's
``VoxelPostprocessor`` does (:func:`decode_reference`, rules in :class:`ReferenceRules`;
docs/protocol.md "Reference protocol: evaluation" lists each rule with its source), in two pieces
that late fusion uses apart: each agent's candidates (:func:`reference_candidates`), then the
merge of every agent's in the ego frame (:func:`reference_merge`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Literal, Optional, Sequence, Tuple

import numpy as np
import torch

from opencood_ext.geometry.boxes import boxes_inside_range, boxes_to_corners, limit_period
from opencood_ext.geometry.iou import rotated_nms
from opencood_ext.models.anchors import BoxCoder
from opencood_ext.models.head import HeadOutput


@dataclass
class Detections:
    """boxes (N, 7), scores (N,) in (0, 1), labels (N,) long class index; sorted by score, high first."""

    boxes: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.scores.shape[0])


def _flat_with_anchors(head_out: HeadOutput, anchors: torch.Tensor
                       ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """``head_out.flat()`` -> (cls (B, N, ncls), reg (B, N, 7), dirs or None) plus the anchors as (N, 7)
    on reg's device and dtype; ValueError when the anchor count is not the head's N."""
    cls, reg, dirs = head_out.flat()
    anchors = anchors.reshape(-1, 7).to(reg.device, reg.dtype)
    if anchors.shape[0] != reg.shape[1]:
        raise ValueError(f"decode_detections: {anchors.shape[0]} anchors for {reg.shape[1]} head predictions")
    return cls, reg, dirs, anchors


def decode_detections(head_out: HeadOutput, anchors: torch.Tensor, score_threshold: float = 0.2,
                      nms_iou: float = 0.15, max_boxes: int = 150,
                      gt_range: Optional[Sequence[float]] = None, coder: Optional[BoxCoder] = None,
                      pre_nms_max: Optional[int] = 2000,
                      protocol: Literal["native", "reference"] = "native") -> List[Detections]:
    """Decode a batch of head outputs.

    head_out: maps (B, K * ., H, W); anchors: (H, W, K, 7) or (H * W * K, 7).
    gt_range: (xmin, ymin, zmin, xmax, ymax, zmax); a box is kept when all 8 corners are
        inside (bounds inclusive, z included), as for the ground truth.
    coder: must be the one used for the targets (direction offset and bins).
    pre_nms_max: per class, only the best this-many candidates enter NMS (a guard
        for untrained models; None disables it).
    Boxes with non-finite decoded values are dropped.
    protocol: "native" (above) or "reference": the reference code's order and rules
        (:func:`decode_reference`), where ``max_boxes`` and ``pre_nms_max`` do not apply.
    """
    coder = coder or BoxCoder()
    if protocol == "reference":
        return decode_reference(head_out, anchors, score_threshold, nms_iou, gt_range, coder)
    if protocol != "native":
        raise ValueError(f"decode_detections: protocol must be 'native' or 'reference', got {protocol!r}")
    cls, reg, dirs, anchors = _flat_with_anchors(head_out, anchors)
    results = []
    for b in range(cls.shape[0]):
        scores_all = torch.sigmoid(cls[b].detach().float())  # (N, ncls)
        boxes_l, scores_l, labels_l = [], [], []
        for c in range(scores_all.shape[1]):
            s = scores_all[:, c]
            idx = (s > score_threshold).nonzero().squeeze(1)
            if pre_nms_max is not None and idx.numel() > pre_nms_max:
                idx = idx[s[idx].topk(pre_nms_max).indices]
            if idx.numel() == 0:
                continue
            boxes = coder.decode(reg[b, idx].detach().float(), anchors[idx].float())
            if dirs is not None:
                boxes[:, 6] = coder.apply_direction(boxes[:, 6], dirs[b, idx].argmax(dim=-1))
            else:
                boxes[:, 6] = limit_period(boxes[:, 6], 0.5, 2 * torch.pi)
            finite = torch.isfinite(boxes).all(dim=1)
            boxes, sc = boxes[finite], s[idx][finite]
            keep = rotated_nms(boxes, sc, nms_iou)
            boxes_l.append(boxes[keep])
            scores_l.append(sc[keep])
            labels_l.append(torch.full((keep.numel(),), c, dtype=torch.long, device=boxes.device))
        if boxes_l:
            boxes, scores, labels = torch.cat(boxes_l), torch.cat(scores_l), torch.cat(labels_l)
        else:
            boxes, scores = reg.new_zeros(0, 7).float(), reg.new_zeros(0).float()
            labels = torch.zeros(0, dtype=torch.long, device=reg.device)
        if gt_range is not None:
            inside = torch.from_numpy(boxes_inside_range(boxes, gt_range)).to(boxes.device)
            boxes, scores, labels = boxes[inside], scores[inside], labels[inside]
        order = torch.sort(scores, descending=True, stable=True).indices[:max_boxes]
        results.append(Detections(boxes=boxes[order], scores=scores[order], labels=labels[order]))
    return results


@dataclass(frozen=True)
class ReferenceRules:
    """The reference code's fixed prediction filters (not read from any config there).

    max_extent: metres; a box whose 8 corners span more than this in x or in y (world-axis
        extent, not its length) is dropped before NMS.
    z_bounds: (zmin, zmax); a box with a corner below zmin or above zmax is dropped before NMS.
    top_k: NMS considers only the best this-many boxes (after the two filters).
    range_z: the final range mask checks z as well as x and y.
    best_class: one candidate per anchor, its best class (class-agnostic NMS, direction bins
        unused); else per anchor the single class's score, with direction bins.
    """

    max_extent: float
    z_bounds: Tuple[float, float]
    top_k: int
    range_z: bool
    best_class: bool

    def may_survive(self, boxes: torch.Tensor) -> torch.Tensor:
        """(P,) bool for boxes (P, 7): False for a box that step 4 of :func:`decode_reference`
        drops wherever a yaw rotation and a translation put it (late fusion's sender leaves those
        out of its message): non-finite, longer or wider than sqrt(2) ``max_extent`` (an l x w
        rectangle spans at least max(l, w) / sqrt(2) along x or along y), or taller than the
        z bounds' span."""
        finite = torch.isfinite(boxes).all(dim=1)
        z_span = self.z_bounds[1] - self.z_bounds[0]
        return finite & (boxes[:, 3:5].amax(dim=1) <= math.sqrt(2) * self.max_extent) & (boxes[:, 5] <= z_span)


# VoxelPostprocessor.post_process (OPV2V, OPV2V-H, V2XSet, DAIR-V2X: one class)
REFERENCE_ONE_CLASS = ReferenceRules(max_extent=6.0, z_bounds=(-3.0, 1.0), top_k=1000, range_z=True,
                                     best_class=False)
# VoxelPostprocessor.post_process_v2xreal (V2X-Real: several classes)
REFERENCE_MULTI_CLASS = ReferenceRules(max_extent=100.0, z_bounds=(-100.0, 100.0), top_k=1000, range_z=False,
                                       best_class=True)


def reference_rules(num_classes: int) -> ReferenceRules:
    """The reference's rules for a head with ``num_classes`` classes (its multi-class
    post-processing is V2X-Real's, the only multi-class dataset it evaluates)."""
    return REFERENCE_ONE_CLASS if num_classes == 1 else REFERENCE_MULTI_CLASS


def decode_reference(head_out: HeadOutput, anchors: torch.Tensor, score_threshold: float, nms_iou: float,
                     gt_range: Optional[Sequence[float]], coder: BoxCoder,
                     rules: Optional[ReferenceRules] = None) -> List[Detections]:
    """The reference's post-processing, per batch item (it evaluates one frame at a time):
    :func:`reference_candidates` (steps 1-3), then :func:`reference_merge` (steps 4-6).

    1. sigmoid scores; one class: each anchor's score; several: each anchor's best class;
    2. keep anchors scoring above ``score_threshold`` (strictly), decode them;
    3. one class with direction bins: the yaw put in the predicted half-turn (as native);
    4. drop boxes larger than ``max_extent`` in x or y, or with a corner outside ``z_bounds``;
    5. order by score (numpy's argsort, reversed: the reference's tie order), keep the first
       ``top_k``, greedy NMS (BEV IoU above ``nms_iou`` suppresses; class-agnostic);
    6. keep boxes whose 8 corners lie inside ``gt_range`` (bounds inclusive; z only with
       ``range_z``). No cap on the number of boxes.

    -> :class:`Detections` in NMS order (score descending). Non-finite boxes are dropped (the
    reference's extent test drops them too).
    """
    rules = rules or reference_rules(head_out.flat()[0].shape[2])
    return [reference_merge(d.boxes, d.scores, d.labels, nms_iou, gt_range, rules)
            for d in reference_candidates(head_out, anchors, score_threshold, coder, rules)]


def reference_candidates(head_out: HeadOutput, anchors: torch.Tensor, score_threshold: float, coder: BoxCoder,
                         rules: ReferenceRules) -> List[Detections]:
    """Steps 1-3 of :func:`decode_reference` per batch item: what the reference's post-processing
    makes of one agent's maps before it projects them to the ego (late fusion merges these of
    every agent, :func:`reference_merge`). -> :class:`Detections` in anchor order (NOT sorted by
    score), boxes in the maps' frame."""
    cls, reg, dirs, anchors = _flat_with_anchors(head_out, anchors)
    results = []
    for b in range(cls.shape[0]):
        prob = torch.sigmoid(cls[b].detach().float())  # (N, ncls)
        if rules.best_class:
            scores_all, labels_all = prob.max(dim=1)
        else:
            scores_all, labels_all = prob[:, 0], torch.zeros(prob.shape[0], dtype=torch.long, device=prob.device)
        idx = (scores_all > score_threshold).nonzero().squeeze(1)
        boxes = coder.decode(reg[b, idx].detach().float(), anchors[idx].float())
        if dirs is not None and not rules.best_class and idx.numel():
            boxes[:, 6] = coder.apply_direction(boxes[:, 6], dirs[b, idx].argmax(dim=-1))
        results.append(Detections(boxes=boxes.reshape(-1, 7), scores=scores_all[idx], labels=labels_all[idx]))
    return results


def reference_merge(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, nms_iou: float,
                    gt_range: Optional[Sequence[float]], rules: ReferenceRules) -> Detections:
    """Steps 4-6 of :func:`decode_reference` on one frame's candidates (boxes (N, 7) in the ego
    frame, every agent's concatenated in the reference's agent order for late fusion: the order
    decides ties). -> :class:`Detections` in NMS order."""
    with np.errstate(invalid="ignore", over="ignore"):
        corners = boxes_to_corners(boxes.cpu().numpy())  # (N, 8, 3)
        span = corners.max(axis=1) - corners.min(axis=1)  # (N, 3) extent along x, y, z
        keep = ((span[:, 0] <= rules.max_extent) & (span[:, 1] <= rules.max_extent) & (span[:, 1] != 0)
                & (corners[:, :, 2].min(axis=1) >= rules.z_bounds[0])
                & (corners[:, :, 2].max(axis=1) <= rules.z_bounds[1]))
    keep_t = torch.from_numpy(keep).to(boxes.device)
    boxes, scores, labels = boxes[keep_t], scores[keep_t], labels[keep_t]
    order = np.argsort(scores.cpu().numpy())[::-1][:rules.top_k].copy()
    order_t = torch.from_numpy(order).to(boxes.device)
    boxes, scores, labels = boxes[order_t], scores[order_t], labels[order_t]
    if len(boxes):
        picked = rotated_nms(boxes, scores, nms_iou)  # equal scores keep the order given
        boxes, scores, labels = boxes[picked], scores[picked], labels[picked]
    if gt_range is not None and len(boxes):
        r = np.asarray(gt_range, dtype=np.float64)
        axes = 3 if rules.range_z else 2
        c = boxes_to_corners(boxes.cpu().numpy())[..., :axes]
        inside = torch.from_numpy(((c >= r[:axes]) & (c <= r[3:3 + axes])).all(axis=(1, 2))).to(boxes.device)
        boxes, scores, labels = boxes[inside], scores[inside], labels[inside]
    return Detections(boxes=boxes.reshape(-1, 7), scores=scores, labels=labels)
