"""How precise the boxes are that find an object: the figures behind a gap between
AP@0.5 and AP@0.7.

For each GT box the detection of highest BEV IoU with it is taken (any score the
post-processing kept); a GT counts as found when that IoU is at least
``min_iou`` (``FOUND_IOU`` = 0.3, the loosest AP threshold). Over the found ones: mean IoU, the
share that reach IoU 0.7, and median centre (m), length / width (m) and yaw
errors (degrees, modulo 180: IoU does not see the heading's direction). Split by
the visibility groups of :mod:`opencood_ext.eval.visibility` when given, so
boxes built from a collaborator's feature can be told from the ego's own.
Boxes (N, 7) x, y, z, l, w, h, yaw in the ego frame.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from ..geometry.iou import bev_iou
from .visibility import GROUPS

FOUND_IOU = 0.3  # a GT counts as found at this IoU: the loosest AP threshold
FIGURES = ("mean_iou", "share_iou_0.7", "median_centre_m", "median_length_m", "median_width_m", "median_yaw_deg")


@dataclass
class LocalisationStats:
    """Accumulates per-GT best-IoU matches; :meth:`summary` gives the figures per group."""

    min_iou: float = FOUND_IOU
    rows: List[np.ndarray] = field(default_factory=list)  # (G, 6): group, iou, centre_m, dl_m, dw_m, dyaw_deg

    def add(self, groups: Optional[np.ndarray], pred_boxes, gt_boxes) -> None:
        """groups: (G,) int visibility group per GT (0 ego, 1 collaborators only, 2 nobody), or None
        where the split is undefined (a camera ego): those GT count under "all" only."""
        gt = np.asarray(gt_boxes, dtype=np.float64).reshape(-1, 7)
        pred = np.asarray(pred_boxes, dtype=np.float64).reshape(-1, 7)
        g = np.full(len(gt), -1, dtype=np.int64) if groups is None else np.asarray(groups)  # -1: "all" only
        if len(g) != len(gt):
            raise ValueError(f"{len(g)} visibility groups for {len(gt)} GT boxes")
        if not len(pred):  # nothing found: IoU 0, errors undefined
            self.rows.append(np.column_stack([g, np.zeros(len(gt)), np.full((len(gt), 4), np.nan)]))
            return
        iou = bev_iou(gt, pred)
        best = iou.argmax(axis=1)
        p = pred[best]
        dyaw = np.abs((p[:, 6] - gt[:, 6] + np.pi / 2) % np.pi - np.pi / 2)
        self.rows.append(np.column_stack([
            g, iou[np.arange(len(gt)), best], np.hypot(p[:, 0] - gt[:, 0], p[:, 1] - gt[:, 1]),
            np.abs(p[:, 3] - gt[:, 3]), np.abs(p[:, 4] - gt[:, 4]), np.degrees(dyaw)]))

    def summary(self) -> Dict[str, dict]:
        """{"all" and each group: {"gt", "found", "mean_iou", "share_iou_0.7", "median_centre_m",
        "median_length_m", "median_width_m", "median_yaw_deg"}}; figures are None with nothing found."""
        a = np.concatenate(self.rows) if self.rows else np.zeros((0, 6))
        out = {}
        for name, sel in [("all", np.ones(len(a), dtype=bool))] + [(n, a[:, 0] == k) for k, n in enumerate(GROUPS)]:
            m = sel & (a[:, 1] >= self.min_iou)
            found = a[m]
            stats = {"gt": int(sel.sum()), "found": int(m.sum())}
            if len(found):
                vals = (found[:, 1].mean(), (found[:, 1] >= 0.7).mean(), *np.median(found[:, 2:], axis=0))
                stats.update({k: round(float(v), 4) for k, v in zip(FIGURES, vals)})
            else:
                stats.update(dict.fromkeys(FIGURES))
            out[name] = stats
        return out


def format_localisation(summary: Dict[str, dict]) -> str:
    """One line per group with something found."""
    lines = []
    for name, s in summary.items():
        if not s["found"]:
            continue
        lines.append(f"  {name}: found {s['found']} of {s['gt']} at IoU >= {FOUND_IOU}, mean IoU {s['mean_iou']:.3f}, "
                     f"{s['share_iou_0.7']:.2f} reach 0.7; median errors centre {s['median_centre_m']:.2f} m, "
                     f"length {s['median_length_m']:.2f} m, width {s['median_width_m']:.2f} m, "
                     f"yaw {s['median_yaw_deg']:.1f} deg")
    return "\n".join(lines)
