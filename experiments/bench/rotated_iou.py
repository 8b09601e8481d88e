"""Rotated BEV IoU throughput and rotated-NMS time (figures only, no assertions).

``python tools/bench.py iou [--n 2000] [--dense_n 1000] [--nms 5000] [--threads 1]``

* scene: N x N car-sized boxes spread over the OPV2V detection range
  (x in [-140.8, 140.8], y in [-40, 40] m), random yaw: most pairs are disjoint
  and skipped by the bounding-circle test, as in real use.
* dense: all boxes within a 6 x 6 m patch, so every pair is clipped: the worst case.
* nms: clustered detections (N / 50 objects x 50 noisy proposals), threshold 0.15.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from opencood_ext.geometry.iou import bev_iou, rotated_nms


def _cars(rng, n, x_range, y_range):
    return np.column_stack([rng.uniform(*x_range, n), rng.uniform(*y_range, n), np.zeros(n),
                            rng.uniform(3.5, 5.0, n), rng.uniform(1.6, 2.1, n),
                            np.full(n, 1.6), rng.uniform(-np.pi, np.pi, n)])


def _best_of(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="bench iou", description=__doc__)
    p.add_argument("--n", type=int, default=2000, help="scene boxes per side (N x N pairs)")
    p.add_argument("--dense_n", type=int, default=1000, help="dense-patch boxes per side")
    p.add_argument("--nms", type=int, default=5000, help="boxes fed to NMS")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    out = {"threads": args.threads}

    a = torch.as_tensor(_cars(rng, args.n, (-140.8, 140.8), (-40, 40)), dtype=torch.float32)
    b = torch.as_tensor(_cars(rng, args.n, (-140.8, 140.8), (-40, 40)), dtype=torch.float32)
    t, iou = _best_of(lambda: bev_iou(a, b), args.repeat)
    out.update({"scene_pairs": args.n * args.n, "scene_overlapping_pairs": int((iou > 0).sum()),
                "scene_s": t, "scene_pairs_per_s": args.n * args.n / t})

    d = torch.as_tensor(_cars(rng, args.dense_n, (-3, 3), (-3, 3)), dtype=torch.float32)
    t, iou = _best_of(lambda: bev_iou(d, d), args.repeat)
    out.update({"dense_pairs": args.dense_n ** 2, "dense_s": t,
                "dense_pairs_per_s": args.dense_n ** 2 / t})
    t64, _ = _best_of(lambda: bev_iou(d.double(), d.double()), args.repeat)
    out["dense_float64_pairs_per_s"] = args.dense_n ** 2 / t64

    n_obj = max(1, args.nms // 50)
    centres = _cars(rng, n_obj, (-140.8, 140.8), (-40, 40))
    props = np.repeat(centres, 50, axis=0)[: args.nms]
    props[:, :2] += rng.normal(0, 0.6, (len(props), 2))
    props[:, 6] += rng.normal(0, 0.1, len(props))
    props = torch.as_tensor(props, dtype=torch.float32)
    scores = torch.rand(len(props), generator=torch.Generator().manual_seed(0))
    t, keep = _best_of(lambda: rotated_nms(props, scores, 0.15), args.repeat)
    out.update({"nms_boxes": len(props), "nms_kept": int(keep.numel()), "nms_s": t})
    return out
