"""Average precision of BEV box detections, the OpenCOOD protocol (docs/formats.md section 4).

Per frame, predictions are sorted by score, highest first (a stable sort: equal
scores keep their input order). Each prediction is a true positive (TP) if its
best BEV rotated IoU with a ground-truth box not yet matched in that frame is
>= the threshold (that ground truth is then consumed), otherwise a false
positive (FP). Detections of all frames are then accumulated in one of two
orders, which papers mix up and which differ by 10-20 AP points:

* ``global_sort=True`` (HEAL's default): all detections of all frames sorted by
  score, highest first (stable: equal scores keep frame order, then the
  per-frame order).
* ``global_sort=False`` (OpenCOOD's default): the per-frame sorted lists simply
  concatenated in the order the frames were added.

AP is the VOC all-points area: with cumulative ``recall = TP / num_gt`` and
``precision = TP / (TP + FP)`` after each detection, prepend (0, 0), append
(1, 0), make precision non-increasing from the right, and sum
``(r_i - r_{i-1}) * p_i`` over the points where recall changes. Each detection
is its own point; equal scores are not merged.

Edge cases, explicitly:

* no ground truth in any frame (``num_gt == 0``): recall is undefined, so AP is
  ``nan`` (never a silent 0 that would be averaged into a table) and the
  recall array is all ``nan``;
* ground truth but no detections at all: AP is ``0.0`` and the
  precision / recall arrays are empty;
* frames without ground truth still count: all their detections are FPs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from ..geometry.iou import bev_iou_aligned

ORDER_GLOBAL = "global"
ORDER_PER_FRAME = "per_frame"


@dataclass
class APResult:
    """AP for one accumulation order.

    ap: {threshold: AP} (nan when num_gt == 0).
    precision, recall: {threshold: (D,) float64} after each of the D detections, in the
        accumulation order (for PR plots).
    num_gt, num_pred, num_frames: totals over all added frames.
    order: ``"global"`` (all detections sorted by score) or ``"per_frame"``
        (per-frame sorted lists concatenated).
    thresholds: the IoU thresholds, in the accumulator's order.
    """

    ap: Dict[float, float]
    precision: Dict[float, np.ndarray]
    recall: Dict[float, np.ndarray]
    num_gt: int
    num_pred: int
    num_frames: int
    order: str
    thresholds: Tuple[float, ...] = ()


BEV_COLUMNS = [0, 1, 3, 4, 6]  # x, y, l, w, yaw of a (N, 7) box


def voc_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """VOC all-points AP of a PR curve given in detection order (see module docstring)."""
    mrec = np.concatenate([[0.0], np.asarray(recall, dtype=np.float64), [1.0]])
    mpre = np.concatenate([[0.0], np.asarray(precision, dtype=np.float64), [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    changed = np.nonzero(mrec[1:] != mrec[:-1])[0] + 1
    return float(np.sum((mrec[changed] - mrec[changed - 1]) * mpre[changed]))


def _to_numpy(x, name: str, cols) -> np.ndarray:
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if arr.size == 0:
        return np.zeros((0,) if cols is None else (0, 7), dtype=np.float64)
    arr = arr.astype(np.float64, copy=False)
    if cols is None:
        if arr.ndim != 1:
            raise ValueError(f"APAccumulator.add: {name} must have shape (P,), got {arr.shape}")
    elif arr.ndim != 2 or arr.shape[1] not in cols:
        raise ValueError(f"APAccumulator.add: {name} must have shape (N, 7) "
                         f"[x, y, z, l, w, h, yaw], got {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"APAccumulator.add: {name} contains NaN or infinite values")
    return arr


def _bev_radius(bev: np.ndarray) -> np.ndarray:
    return 0.5 * np.hypot(bev[:, 2], bev[:, 3])


def match_frames(frames: Sequence[Tuple[np.ndarray, np.ndarray]],
                 thresholds: Sequence[float], with_gt: bool = False):
    """Greedy TP/FP decisions for many frames at once.

    frames: per frame ``(pred (P, 5|7) sorted by score high first, gt (G, 5|7))``.
    Returns per frame a (T, P) bool array, True where the prediction is a TP at
    threshold ``thresholds[t]``. Frames are independent, so the k-th prediction of
    every frame is decided in the same vectorised step (a loop over max P, not over
    frames); within a frame the order is the protocol's sequential one.
    ``with_gt``: also return per frame a (T, P) int64 array, the GT index each
    prediction matched (-1 for a FP), as ``(tp_list, gt_list)``.
    """
    thr = np.asarray(thresholds, dtype=np.float64)
    T = len(thr)
    P = np.array([len(p) for p, _ in frames], dtype=np.int64)
    G = np.array([len(g) for _, g in frames], dtype=np.int64)
    out = [np.zeros((T, p), dtype=bool) for p in P]
    out_gt = [np.full((T, p), -1, dtype=np.int64) for p in P]
    live = np.nonzero((P > 0) & (G > 0))[0]
    if len(live) == 0:
        return (out, out_gt) if with_gt else out
    Pl, Gl = P[live], G[live]
    pred_all = np.concatenate([frames[f][0] for f in live])
    gt_all = np.concatenate([frames[f][1] for f in live])
    n_pairs = Pl * Gl
    frame_of = np.repeat(np.arange(len(live)), n_pairs)
    k = np.arange(n_pairs.sum()) - np.repeat(np.cumsum(n_pairs) - n_pairs, n_pairs)
    i, j = k // Gl[frame_of], k % Gl[frame_of]
    p_idx, g_idx = (np.cumsum(Pl) - Pl)[frame_of] + i, (np.cumsum(Gl) - Gl)[frame_of] + j
    L, p_max, g_max = len(live), int(Pl.max()), int(Gl.max())
    D = np.full((L, p_max, g_max), -1.0)  # -1: padding, never a match (thresholds > 0)
    D[frame_of, i, j] = 0.0
    # Only pairs whose bounding circles meet can overlap (same test as bev_iou, cheaper here).
    rp, rg = _bev_radius(pred_all), _bev_radius(gt_all)
    d2 = ((pred_all[p_idx, 0] - gt_all[g_idx, 0]) ** 2
          + (pred_all[p_idx, 1] - gt_all[g_idx, 1]) ** 2)
    near = np.nonzero(d2 <= ((rp[p_idx] + rg[g_idx]) * (1 + 1e-5) + 1e-6) ** 2)[0]
    D[frame_of[near], i[near], j[near]] = bev_iou_aligned(pred_all[p_idx[near]],
                                                          gt_all[g_idx[near]])
    unmatched = np.ones((L, T, g_max), dtype=bool)
    tp = np.zeros((L, T, p_max), dtype=bool)
    gt_of = np.full((L, T, p_max), -1, dtype=np.int64)
    for r in range(p_max):
        cand = np.where(unmatched, D[:, None, r, :], -1.0)  # (L, T, G)
        best = cand.argmax(axis=-1)  # first GT among equal IoUs
        hit = np.take_along_axis(cand, best[..., None], axis=-1)[..., 0] >= thr
        tp[:, :, r] = hit
        l_idx, t_idx = np.nonzero(hit)
        unmatched[l_idx, t_idx, best[l_idx, t_idx]] = False
        gt_of[l_idx, t_idx, r] = best[l_idx, t_idx]
    for n, f in enumerate(live):
        out[f] = tp[n, :, :P[f]]
        out_gt[f] = gt_of[n, :, :P[f]]
    return (out, out_gt) if with_gt else out


class APAccumulator:
    """Collects per-frame TP/FP decisions; :meth:`result` turns them into AP.

    iou_thresholds: BEV IoU thresholds, default (0.3, 0.5, 0.7).
    batch_pairs: frames are matched lazily in batches holding about this many
        prediction-GT pairs (bounds memory; any value gives the same result).
    """

    def __init__(self, iou_thresholds: Sequence[float] = (0.3, 0.5, 0.7),
                 batch_pairs: int = 1 << 20):
        thr = tuple(float(t) for t in iou_thresholds)
        if not thr or any(not 0.0 < t <= 1.0 for t in thr) or len(set(thr)) != len(thr):
            raise ValueError(f"APAccumulator: iou_thresholds must be distinct values in (0, 1], "
                             f"got {iou_thresholds!r}")
        if batch_pairs < 1:
            raise ValueError(f"APAccumulator: batch_pairs must be >= 1, got {batch_pairs}")
        self.iou_thresholds = thr
        self.batch_pairs = int(batch_pairs)
        self._scores: List[np.ndarray] = []  # per frame, sorted high first
        self._tp: List[np.ndarray] = []  # per matched frame, (T, P) bool
        self._pending: List[Tuple[np.ndarray, np.ndarray]] = []  # (pred sorted, gt) not matched yet
        self._pending_pairs = 0
        self._gt_counts: List[int] = []  # per frame
        self.num_gt = 0

    @property
    def num_frames(self) -> int:
        return len(self._scores)

    def add(self, pred_boxes, scores, gt_boxes) -> None:
        """Add one frame: pred_boxes (P, 7), scores (P,), gt_boxes (G, 7), all in the
        same frame (numpy or torch). (P, 5) / (G, 5) BEV boxes are accepted too."""
        pred = _to_numpy(pred_boxes, "pred_boxes", (5, 7))
        sc = _to_numpy(scores, "scores", None)
        gt = _to_numpy(gt_boxes, "gt_boxes", (5, 7))
        if len(sc) != len(pred):
            raise ValueError(f"APAccumulator.add: {len(sc)} scores for {len(pred)} pred_boxes")
        pred = pred[:, BEV_COLUMNS] if pred.shape[1] == 7 else pred
        gt = gt[:, BEV_COLUMNS] if gt.shape[1] == 7 else gt
        order = np.argsort(-sc, kind="stable")
        self._scores.append(sc[order])
        self._pending.append((pred[order], gt))
        self._pending_pairs += len(pred) * len(gt)
        self.num_gt += len(gt)
        self._gt_counts.append(len(gt))
        if self._pending_pairs >= self.batch_pairs:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._tp.extend(match_frames(self._pending, self.iou_thresholds))
        self._pending, self._pending_pairs = [], 0

    def frame_decisions(self) -> Tuple[List[np.ndarray], List[np.ndarray], np.ndarray]:
        """The matched frames in the order added: per frame the scores sorted high first (P,) and
        the TP flags (T, P) bool (``iou_thresholds`` order), and the GT count of every frame (F,)
        int64: what :mod:`opencood_ext.eval.bootstrap` resamples."""
        self._flush()
        return list(self._scores), list(self._tp), np.asarray(self._gt_counts, dtype=np.int64)

    def result(self, global_sort: bool) -> APResult:
        """AP, precision and recall per threshold for the chosen accumulation order."""
        self._flush()
        T = len(self.iou_thresholds)
        scores = np.concatenate(self._scores) if self._scores else np.zeros(0)
        tp = np.concatenate(self._tp, axis=1) if self._tp else np.zeros((T, 0), dtype=bool)
        if global_sort:
            order = np.argsort(-scores, kind="stable")
            tp = tp[:, order]
        ap, prec, rec = {}, {}, {}
        for k, thr in enumerate(self.iou_thresholds):
            ctp = np.cumsum(tp[k]).astype(np.float64)
            cfp = np.cumsum(~tp[k]).astype(np.float64)
            precision = ctp / np.maximum(ctp + cfp, 1.0)
            if self.num_gt == 0:
                recall = np.full_like(ctp, np.nan)
                ap[thr] = math.nan
            else:
                recall = ctp / self.num_gt
                ap[thr] = voc_ap(recall, precision) if len(ctp) else 0.0
            prec[thr], rec[thr] = precision, recall
        return APResult(ap=ap, precision=prec, recall=rec, num_gt=self.num_gt,
                        num_pred=int(scores.shape[0]), num_frames=self.num_frames,
                        order=ORDER_GLOBAL if global_sort else ORDER_PER_FRAME,
                        thresholds=self.iou_thresholds)

    def results(self) -> Dict[str, APResult]:
        """Both orders: ``{"global": ..., "per_frame": ...}``."""
        return {ORDER_GLOBAL: self.result(True), ORDER_PER_FRAME: self.result(False)}


def format_ap_table(results: Dict[str, APResult]) -> str:
    """Plain-text table: one row per named result with its order and AP@0.3/0.5/0.7
    (or whatever thresholds it was computed with); ``n/a`` for nan."""
    thresholds: List[float] = []
    for res in results.values():
        for t in res.ap:
            if t not in thresholds:
                thresholds.append(t)
    header = ["name", "order"] + [f"AP@{t:g}" for t in thresholds] + ["num_gt", "num_pred"]
    rows = [header]
    for name, res in results.items():
        cells = [str(name), res.order]
        for t in thresholds:
            v = res.ap.get(t)
            cells.append("n/a" if v is None or math.isnan(v) else f"{v:.4f}")
        rows.append(cells + [str(res.num_gt), str(res.num_pred)])
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def pr_envelope(result: APResult, threshold: float, points: int = 101) -> Dict[str, List[float]]:
    """The PR curve AP integrates, sampled for plots and JSON: at recall ``r`` on a grid of
    ``points`` values over [0, 1] (up to the highest recall reached), the best precision at
    any recall >= r (the VOC envelope, non-increasing). Far fewer numbers than one per
    detection, and monotone by construction. ``{"recall": [...], "precision": [...]}``,
    both empty when there are no detections or no ground truth."""
    if points < 2:
        raise ValueError(f"pr_envelope: points must be >= 2, got {points}")
    rec = np.asarray(result.recall[threshold], dtype=np.float64)
    prec = np.asarray(result.precision[threshold], dtype=np.float64)
    if len(rec) == 0 or result.num_gt == 0:
        return {"recall": [], "precision": []}
    env = np.maximum.accumulate(prec[::-1])[::-1]
    grid = np.linspace(0.0, 1.0, points)
    grid = grid[grid <= rec[-1] + 1e-12]
    first = np.searchsorted(rec, grid - 1e-12, side="left")  # first detection reaching each recall
    return {"recall": [round(float(r), 4) for r in grid],
            "precision": [round(float(v), 4) for v in env[first]]}


def plot_pr_curves(result: APResult, path) -> Path:
    """Save precision-recall curves (one per threshold) of ``result`` to ``path`` (PNG, PDF...)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: leaves the global backend alone

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(5, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for thr in result.ap:
        ap = result.ap[thr]
        label = f"IoU {thr:g}: AP " + ("n/a" if math.isnan(ap) else f"{ap:.3f}")
        ax.plot(result.recall[thr], result.precision[thr], label=label)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_title(f"PR curves ({result.order} order, {result.num_gt} GT, {result.num_pred} det)")
    ax.legend(loc="lower left")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return path
