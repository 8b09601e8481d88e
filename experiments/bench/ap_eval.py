"""AP evaluation cost: ``python tools/bench.py ap [--frames 1000] [--boxes 50]``.

Each frame has ``--boxes`` ground-truth cars and as many predictions: most are
GT boxes with position / yaw noise, the rest false positives. Reports seconds
for all ``add`` calls and for ``result`` in both accumulation orders, plus the
AP figures themselves (they differ between orders).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from opencood_ext.eval.ap import APAccumulator


def _frame(rng, n):
    gt = np.column_stack([rng.uniform(-140, 140, n), rng.uniform(-40, 40, n), np.zeros(n),
                          rng.uniform(3.5, 5.0, n), rng.uniform(1.6, 2.1, n), np.full(n, 1.6),
                          rng.uniform(-np.pi, np.pi, n)])
    n_tp = int(0.8 * n)
    pred = np.concatenate([gt[:n_tp], gt[rng.integers(0, n, n - n_tp)]])
    pred[:, :2] += rng.normal(0, 0.35, (n, 2))
    pred[:, 6] += rng.normal(0, 0.05, n)
    pred[n_tp:, :2] += rng.uniform(3, 10, (n - n_tp, 2))  # mostly misses
    scores = np.clip(rng.normal(0.7, 0.15, n) - 0.3 * (np.arange(n) >= n_tp), 0.01, 1.0)
    return pred, scores, gt


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="bench ap", description=__doc__)
    p.add_argument("--frames", type=int, default=1000)
    p.add_argument("--boxes", type=int, default=50)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    frames = [_frame(rng, args.boxes) for _ in range(args.frames)]
    acc = APAccumulator()
    t0 = time.perf_counter()
    for pred, scores, gt in frames:
        acc.add(pred, scores, gt)
    t_add = time.perf_counter() - t0
    t0 = time.perf_counter()
    glob = acc.result(True)
    t_glob = time.perf_counter() - t0
    t0 = time.perf_counter()
    per_frame = acc.result(False)
    t_frame = time.perf_counter() - t0
    out = {"frames": args.frames, "boxes_per_frame": args.boxes, "add_s": t_add,
           "add_ms_per_frame": 1e3 * t_add / args.frames,
           "result_global_s": t_glob, "result_per_frame_s": t_frame}
    for t in acc.iou_thresholds:
        out[f"AP@{t:g}_global"] = round(glob.ap[t], 4)
        out[f"AP@{t:g}_per_frame"] = round(per_frame.ap[t], 4)
    return out
