"""Detection losses: sigmoid focal classification, smooth-L1 box, direction cross-entropy.

Per sample, every term is summed over anchors and divided by that sample's
number of positive anchors (at least 1); the batch value is the mean over
samples. Classification covers positives and negatives (ignored anchors weigh
0); box and direction cover positives only.

Yaw: the box term uses ``sin(yaw_pred - yaw_target)`` in place of the raw
difference (SECOND's sine-difference encoding), so a box turned by 180 degrees
costs nothing there; the direction bins resolve that ambiguity.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .anchors import Targets
from .head import HeadOutput


def sigmoid_focal_loss(logits: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25,
                       gamma: float = 2.0) -> torch.Tensor:
    """Element-wise focal loss ``-alpha_t (1 - p_t)^gamma log(p_t)`` for 0/1 ``targets``."""
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return alpha_t * (1 - p_t).pow(gamma) * ce


@dataclass
class LossOutput:
    """What a model's ``loss(output, batch)`` returns (the training engine's contract):
    ``total`` (scalar tensor to minimise), ``parts`` (name -> scalar tensor, for logging),
    ``detection`` (scalar tensor: the task's own terms alone, for a detector the weighted
    classification + box + direction terms, without auxiliary terms such as generation MSE,
    camera depth or occupancy; validation selects ``best.pth`` on it, ``train.select_on``;
    None: the model does not say, and only ``select_on: total_loss`` can select for it)."""
    total: torch.Tensor
    parts: Dict[str, torch.Tensor] = field(default_factory=dict)
    detection: Optional[torch.Tensor] = None


@dataclass
class LossTerms:
    """Weighted loss terms (scalars) and their sum; ``num_positives`` is the batch total."""

    cls: torch.Tensor
    box: torch.Tensor
    dir: torch.Tensor
    total: torch.Tensor
    num_positives: int

    def as_dict(self) -> dict:
        return {"cls": float(self.cls), "box": float(self.box), "dir": float(self.dir),
                "total": float(self.total), "num_positives": self.num_positives}


class DetectionLoss(nn.Module):
    """HeadOutput + batched Targets (B, N = H W K) -> :class:`LossTerms`.

    pos_cls_weight: weight of a positive anchor's classification term against a negative's 1
    (the reference's ``loss.args.pos_cls_weight``, 2.0 in its yamls; 1.0 here by default)."""

    def __init__(self, cls_weight: float = 2.0, box_weight: float = 2.0, dir_weight: float = 0.2,
                 focal_alpha: float = 0.25, focal_gamma: float = 2.0, smooth_l1_beta: float = 1.0 / 9.0,
                 pos_cls_weight: float = 1.0):
        super().__init__()
        if not float(pos_cls_weight) > 0:
            raise ValueError(f"model.loss.pos_cls_weight must be > 0, got {pos_cls_weight}")
        self.pos_cls_weight = float(pos_cls_weight)
        self.cls_weight, self.box_weight, self.dir_weight = float(cls_weight), float(box_weight), float(dir_weight)
        self.focal_alpha, self.focal_gamma = float(focal_alpha), float(focal_gamma)
        self.smooth_l1_beta = float(smooth_l1_beta)

    def forward(self, out: HeadOutput, targets: Targets) -> LossTerms:
        cls, reg, dirs = out.flat()  # (B, N, ncls), (B, N, 7), (B, N, nbins)
        labels = targets.labels
        if labels.shape != cls.shape[:2]:
            raise ValueError(f"targets cover {tuple(labels.shape)} anchors but the head predicts "
                             f"{tuple(cls.shape[:2])}; are anchors and feature size consistent?")
        pos_w = targets.reg_weights.to(reg.dtype)  # (B, N)
        npos = pos_w.sum(dim=1)
        norm = npos.clamp(min=1.0)[:, None]  # (B, 1)

        ncls = cls.shape[-1]
        onehot = torch.zeros_like(cls)
        if ncls == 1:
            onehot[..., 0] = pos_w
        else:
            onehot = F.one_hot(targets.gt_class.clamp(min=0), ncls).to(cls.dtype) * pos_w[..., None]
        focal = sigmoid_focal_loss(cls, onehot, self.focal_alpha, self.focal_gamma).sum(-1)
        cls_w = targets.cls_weights.to(cls.dtype)
        if self.pos_cls_weight != 1.0:
            cls_w = cls_w + (self.pos_cls_weight - 1.0) * pos_w
        cls_loss = (focal * cls_w / norm).sum(1).mean()

        diff = reg - targets.reg_targets.to(reg.dtype)
        diff = torch.cat([diff[..., :6], torch.sin(diff[..., 6:7])], dim=-1)
        box = F.smooth_l1_loss(diff, torch.zeros_like(diff), beta=self.smooth_l1_beta,
                               reduction="none").sum(-1)
        box_loss = (box * pos_w / norm).sum(1).mean()

        if dirs is not None:
            ce = F.cross_entropy(dirs.reshape(-1, dirs.shape[-1]), targets.dir_targets.reshape(-1),
                                 reduction="none").view_as(pos_w)
            dir_loss = (ce * pos_w / norm).sum(1).mean()
        else:
            dir_loss = reg.new_zeros(())
        cls_loss, box_loss, dir_loss = (self.cls_weight * cls_loss, self.box_weight * box_loss,
                                        self.dir_weight * dir_loss)
        return LossTerms(cls=cls_loss, box=box_loss, dir=dir_loss, total=cls_loss + box_loss + dir_loss,
                         num_positives=int(npos.sum().item()))
