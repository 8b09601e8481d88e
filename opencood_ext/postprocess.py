"""Head output -> final detections (the field's OpenCOOD-style post-processing).

Per batch item and class: sigmoid scores above ``score_threshold`` -> decode
the anchors' deltas (:class:`BoxCoder`) -> put each yaw in the half-turn its
direction bin predicts -> rotated NMS at ``nms_iou`` (BEV IoU, per class) ->
keep boxes whose 8 corners all lie inside ``gt_range``, z included (the field's
rule, :func:`~opencood_ext.geometry.boxes_inside_range`) -> at most
``max_boxes`` by score. Boxes are ``[x, y, z, l, w, h, yaw]`` in the ego LiDAR frame.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from opencood_ext.geometry.boxes import boxes_inside_range, limit_period
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


def decode_detections(head_out: HeadOutput, anchors: torch.Tensor, score_threshold: float = 0.2,
                      nms_iou: float = 0.15, max_boxes: int = 150,
                      gt_range: Optional[Sequence[float]] = None, coder: Optional[BoxCoder] = None,
                      pre_nms_max: Optional[int] = 2000) -> List[Detections]:
    """Decode a batch of head outputs.

    head_out: maps (B, K * ., H, W); anchors: (H, W, K, 7) or (H * W * K, 7).
    gt_range: (xmin, ymin, zmin, xmax, ymax, zmax); a box is kept when all 8 corners are
        inside (bounds inclusive, z included), as for the ground truth.
    coder: must be the one used for the targets (direction offset and bins).
    pre_nms_max: per class, only the best this-many candidates enter NMS (a guard
        for untrained models; None disables it).
    Boxes with non-finite decoded values are dropped.
    """
    coder = coder or BoxCoder()
    cls, reg, dirs = head_out.flat()
    anchors = anchors.reshape(-1, 7).to(reg.device, reg.dtype)
    if anchors.shape[0] != reg.shape[1]:
        raise ValueError(f"decode_detections: {anchors.shape[0]} anchors for {reg.shape[1]} head predictions")
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
