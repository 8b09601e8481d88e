"""Scene-bootstrap cost: ``python tools/bench.py bootstrap [--frames 50] [--scenes 10] [--boxes 30]``.

Frames like ``bench ap`` (noisy GT copies plus false positives), spread over ``--scenes``
scenes. Times, side by side in one run: the point AP plus ``--resamples`` scene resamples
(both orders, AP@0.3/0.5/0.7) from per-frame records matched once; the paired difference of two
such methods; and the naive way, re-matching every frame of a resample with a fresh
APAccumulator (``--naive`` resamples, extrapolated per resample).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from experiments.bench.ap_eval import _frame
from opencood_ext.eval.ap import APAccumulator
from opencood_ext.eval.bootstrap import bootstrap_ap, paired_difference, resample_frames, scene_draws
from opencood_ext.eval.records import FrameRecords


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="bench bootstrap", description=__doc__)
    p.add_argument("--frames", type=int, default=50)
    p.add_argument("--scenes", type=int, default=10)
    p.add_argument("--boxes", type=int, default=30)
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--naive", type=int, default=50)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    methods = []
    for _ in range(2):
        frames = [_frame(rng, args.boxes) for _ in range(args.frames)]
        scenes = [f"s{k * args.scenes // args.frames:03d}" for k in range(args.frames)]
        t0 = time.perf_counter()
        rec = FrameRecords.from_detections((*f, s, f"{s}/{k}") for k, (f, s) in enumerate(zip(frames, scenes)))
        methods.append((frames, rec, time.perf_counter() - t0))
    (frames, rec, t_match), (_, rec_b, _) = methods
    t0 = time.perf_counter()
    boot = bootstrap_ap(rec, args.resamples, seed=0)
    t_boot = time.perf_counter() - t0
    t0 = time.perf_counter()
    paired_difference(rec, rec_b, args.resamples, seed=0)
    t_pair = time.perf_counter() - t0
    t0 = time.perf_counter()
    for row in scene_draws(rec.num_scenes, args.naive, seed=0):
        acc = APAccumulator()
        for f in resample_frames(rec, row):
            acc.add(*frames[f])
        acc.results()
    t_naive = (time.perf_counter() - t0) / args.naive
    half = (boot.hi["global"] - boot.lo["global"]) / 2
    return {"frames": args.frames, "scenes": rec.num_scenes, "detections": len(rec.scores),
            "resamples": args.resamples, "match_once_s": round(t_match, 4),
            "bootstrap_s": round(t_boot, 3), "paired_difference_s": round(t_pair, 3),
            "ms_per_resample": round(1e3 * t_boot / args.resamples, 3),
            "naive_ms_per_resample": round(1e3 * t_naive, 2),
            "speedup_vs_rematching": round(t_naive / (t_boot / args.resamples), 1),
            "AP@0.5_global": round(float(boot.ap["global"][1]), 4),
            "AP@0.5_global_ci": [round(float(boot.lo["global"][1]), 4), round(float(boot.hi["global"][1]), 4)],
            "half_width@0.5": round(float(half[1]), 4)}
