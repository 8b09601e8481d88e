"""Recall split by who could see each ground-truth object: the ego, only a
collaborator, or none of the selected agents. It shows what cooperation buys
(objects only a collaborator sees) apart from how well the ego detects what it
sees itself, which a single AP number mixes.

An agent "sees" a box when at least ``min_points`` of its LiDAR points (the scan
its type uses, e.g. 32 rings for m3) fall inside it. Camera agents are not counted
as seeing anything here; with a camera ego the split is not defined (None).
Every agent also "sees" its own vehicle (the box around its sensor in BEV): the
GT holds the ego's own car, which its LiDAR never hits but any detector finds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np

from ..data.frame import Frame
from ..geometry import invert_transform, points_in_boxes, points_per_box, transform_points
from .ap import BEV_COLUMNS, match_frames

GROUPS = ("ego", "collaborators_only", "nobody")
MIN_POINTS = 5


def visibility_groups(dataset, index: int, gt_boxes: np.ndarray, min_points: int = MIN_POINTS,
                      frame: Optional[Frame] = None) -> Optional[np.ndarray]:
    """(G,) index into ``GROUPS`` for each box of ``gt_boxes`` (G, 7), given in the
    un-augmented ego LiDAR frame of ``dataset``'s frame ``index`` (evaluation frames).
    None when the ego is not a LiDAR agent. ``frame``: that frame as ``dataset.read_frame(index)``
    gives it, when the caller has it already (it is then not read again)."""
    if frame is None:
        frame = dataset.read_frame(index)
    agents = dataset.select_agents(frame, np.random.default_rng(0), with_collaborators=True)
    types = dataset.cfg.agent_types
    if types[agents[0].agent_type].sensor != "lidar":
        return None
    boxes = np.asarray(gt_boxes, dtype=np.float64).reshape(-1, 7)
    T_ego_from_world = invert_transform(agents[0].T_world_from_lidar)
    seen = np.zeros((len(agents), len(boxes)), dtype=bool)
    for k, agent in enumerate(agents):
        spec = types[agent.agent_type]
        if spec.sensor != "lidar" or not len(boxes):
            continue
        T = T_ego_from_world @ agent.T_world_from_lidar
        pts = transform_points(T, dataset.lidar_points(agent, spec.lidar_beams, frame)[:, :3])
        own_car = points_in_boxes(T[None, :2, 3], boxes, bev_only=True)[0]
        seen[k] = (points_per_box(pts, boxes) >= min_points) | own_car
    return np.where(seen[0], 0, np.where(seen[1:].any(axis=0), 1, 2)).astype(np.int64)


def matched_gt(pred_boxes: np.ndarray, scores: np.ndarray, gt_boxes: np.ndarray, iou_threshold: float) -> np.ndarray:
    """(G,) bool: GT boxes a detection claims under the AP protocol's greedy rule
    (:func:`opencood_ext.eval.ap.match_frames`, the matcher AP uses)."""
    gt = np.asarray(gt_boxes, dtype=np.float64).reshape(-1, 7)
    pred = np.asarray(pred_boxes, dtype=np.float64).reshape(-1, 7)
    order = np.argsort(-np.asarray(scores), kind="stable")
    frame = (pred[order][:, BEV_COLUMNS], gt[:, BEV_COLUMNS])
    _, (gt_of,) = match_frames([frame], [iou_threshold], with_gt=True)
    hit = np.zeros(len(gt), dtype=bool)
    hit[gt_of[0][gt_of[0] >= 0]] = True
    return hit


@dataclass
class VisibilityRecall:
    """Accumulates, per group, GT boxes and how many a detection matched."""

    iou_threshold: float = 0.5
    total: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(GROUPS, 0))
    found: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(GROUPS, 0))

    def add(self, groups: np.ndarray, pred_boxes, scores, gt_boxes) -> None:
        hit = matched_gt(pred_boxes, scores, gt_boxes, self.iou_threshold)
        if len(groups) != len(hit):
            raise ValueError(f"{len(groups)} visibility groups for {len(hit)} GT boxes")
        for g, name in enumerate(GROUPS):
            self.total[name] += int((groups == g).sum())
            self.found[name] += int(hit[groups == g].sum())

    def summary(self) -> Dict[str, dict]:
        """{group: {"gt": n, "recall": found / n or None}}."""
        return {g: {"gt": self.total[g], "recall": self.found[g] / self.total[g] if self.total[g] else None}
                for g in GROUPS}
