"""AP per class for a multi-class dataset (V2X-Real's vehicle / pedestrian / truck), as GenComm's
``opencood/tools/inference_v2xreal.py`` reports it: for each class, the detections labelled with
it against the ground truth of that class only (a box of another class is neither matched nor
counted), AP@0.3/0.5/0.7 in both accumulation orders (``eval_utils.eval_final_results_v2xreal``
is called with ``global_sort_detections`` True and False), and mAP, the mean of the classes' APs.

A class without ground-truth boxes has no AP here (None) and mAP averages the classes that have
one, naming them (``classes_in_map``); the reference's ``calculate_ap`` gives such a class AP 0 when
it has no detections either (counted in its mean) and stops on a division by zero when it has some.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np

from .ap import ORDER_GLOBAL, ORDER_PER_FRAME, APAccumulator

ORDERS = (ORDER_GLOBAL, ORDER_PER_FRAME)


def _defined(v: float) -> Optional[float]:
    return None if v is None or math.isnan(v) else float(v)


class ClassAP:
    """One :class:`~.ap.APAccumulator` per class.

    class_names: the class of index k is ``class_names[k]`` (``data.class_groups`` order)."""

    def __init__(self, class_names: Sequence[str], iou_thresholds: Sequence[float] = (0.3, 0.5, 0.7)):
        self.class_names = [str(c) for c in class_names]
        if len(self.class_names) < 2 or len(set(self.class_names)) != len(self.class_names):
            raise ValueError(f"ClassAP needs two or more distinct class names, got {list(class_names)}")
        self.accumulators = [APAccumulator(iou_thresholds) for _ in self.class_names]

    def add(self, pred_boxes, scores, labels, gt_boxes, gt_classes) -> None:
        """One frame: pred_boxes (P, 7), scores (P,), labels (P,) class indices, gt_boxes (G, 7),
        gt_classes (G,) class indices (numpy arrays). An index outside the classes is an error."""
        pred, sc, lab = np.asarray(pred_boxes), np.asarray(scores), np.asarray(labels).reshape(-1)
        gt, gcl = np.asarray(gt_boxes), np.asarray(gt_classes).reshape(-1)
        if len(lab) != len(pred) or len(gcl) != len(gt):
            raise ValueError(f"ClassAP.add: {len(lab)} labels for {len(pred)} boxes, {len(gcl)} GT classes for "
                             f"{len(gt)} GT boxes")
        n = len(self.class_names)
        for name, v in (("labels", lab), ("gt_classes", gcl)):
            if len(v) and (v.min() < 0 or v.max() >= n):
                raise ValueError(f"ClassAP.add: {name} must be class indices in 0..{n - 1} "
                                 f"({self.class_names}), got {sorted(set(v.tolist()))}")
        for k, acc in enumerate(self.accumulators):
            acc.add(pred[lab == k], sc[lab == k], gt[gcl == k])

    def summary(self) -> Dict[str, dict]:
        """``{"classes": {name: {"global": {t: AP or None}, "per_frame": {...}, "num_gt", "num_pred"}},
        "map": {"global": {t: mAP or None}, "per_frame": {...}}, "classes_in_map": [names]}``."""
        classes, in_map = {}, []
        for name, acc in zip(self.class_names, self.accumulators):
            res = acc.results()
            classes[name] = {o: {t: _defined(v) for t, v in res[o].ap.items()} for o in ORDERS}
            classes[name].update(num_gt=res[ORDER_GLOBAL].num_gt, num_pred=res[ORDER_GLOBAL].num_pred)
            if res[ORDER_GLOBAL].num_gt:
                in_map.append(name)
        thresholds = self.accumulators[0].iou_thresholds
        mean = {o: {t: (float(np.mean([classes[c][o][t] for c in in_map])) if in_map else None)
                    for t in thresholds} for o in ORDERS}
        return {"classes": classes, "map": mean, "classes_in_map": in_map}


def to_json(summary: dict) -> dict:
    """:meth:`ClassAP.summary` with threshold keys as strings (JSON object keys)."""
    out = {"classes": {}, "map": {o: {str(t): v for t, v in aps.items()} for o, aps in summary["map"].items()},
           "classes_in_map": list(summary["classes_in_map"])}
    for name, c in summary["classes"].items():
        out["classes"][name] = {k: ({str(t): v for t, v in c[k].items()} if k in ORDERS else c[k]) for k in c}
    return out


def format_class_table(summary: dict) -> List[str]:
    """Printed rows: one per class and order, then mAP; ``n/a`` where undefined."""
    thresholds = list(summary["map"][ORDER_GLOBAL])
    cell = lambda v: f"{'n/a':>9}" if v is None else f"{v:>9.4f}"  # noqa: E731
    rows = [f"{'class':<12}{'order':<12}" + "".join(f"{'AP@' + format(t, 'g'):>9}" for t in thresholds)
            + f"{'num_gt':>8}"]
    for name, c in summary["classes"].items():
        for o in ORDERS:
            rows.append(f"{name:<12}{o:<12}" + "".join(cell(c[o][t]) for t in thresholds) + f"{c['num_gt']:>8}")
    for o in ORDERS:
        rows.append(f"{'mAP':<12}{o:<12}" + "".join(cell(summary["map"][o][t]) for t in thresholds)
                    + f"  (mean of {len(summary['classes_in_map'])} classes)")
    return rows
