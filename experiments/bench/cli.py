"""Benchmarks (never assertions): ``gencomm-bench NAME [args]`` (``python tools/bench.py`` in a checkout).

Each benchmark is a module in :mod:`experiments.bench` with ``main(argv) -> dict``; the dict
is printed as a table and, with ``--json FILE``, written out. A bad input (a
truncated checkpoint, a missing run folder, a config error) is one line on
stderr and exit status 2. Run ``gencomm-bench --list`` to see them.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

# name -> (module in experiments.bench, one-line description). Explicit on purpose.
BENCHMARKS = {
    "pcd": ("experiments.bench.pcd_parse", "PCD decoding on the fixture: ours vs Open3D vs numpy (ascii, binary_compressed)"),
    "loading": ("experiments.bench.data_loading", "PCD decoding + dataset samples/s: ours, ours with warm cache, Open3D"),
    "iou": ("experiments.bench.rotated_iou", "BEV rotated-box IoU pairs per second, NMS time"),
    "ap": ("experiments.bench.ap_eval", "AP evaluation over 1000 frames x 50 boxes"),
    "bootstrap": ("experiments.bench.bootstrap", "scene-bootstrap AP intervals: 1000 resamples over 50 frames, vs re-matching"),
    "sim": ("experiments.bench.sim", "simulator LiDAR agent-scans/s, rays/s vs bare Embree, camera cost"),
    "train": ("experiments.bench.train_step", "train step / inference frame: no fusion vs intermediate vs GenComm, module shares"),
    "gencomm": ("experiments.bench.gencomm_modules", "message extractor, generator, wire format cost"),
    "link": ("experiments.bench.link_cost", "GenComm link forward+backward: straightforward vs current "
             "computation, side by side"),
    "fusion": ("experiments.bench.fusion_ops", "fusion ops (max, att, V2X-ViT sim / reference setting): params, fwd+bwd time"),
    "warp": ("experiments.bench.warp_sensitivity", "AP a trained detector loses when its own feature is warped"),
    "job": ("experiments.bench.job_cost", "the main job's minutes per kind of step, projected from measured steps "
            "(with and without the feature cache)"),
    "receiver_load": ("experiments.bench.receiver_load", "senders x messages/s one core verifies, decodes and fuses "
                      "(late, intermediate, GenComm; unsigned, HMAC, Ed25519) over loopback, latency p50/p95/p99"),
    "voxelize": ("experiments.bench.voxelize", "voxeliser ms per 30k-120k point cloud: pure PyTorch vs spconv, equality"),
}


def build_parser() -> argparse.ArgumentParser:
    """The dispatcher's parser (each benchmark parses the rest of argv itself)."""
    parser = argparse.ArgumentParser(prog="gencomm-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", nargs="?", choices=sorted(BENCHMARKS))
    parser.add_argument("--list", action="store_true", help="list benchmarks")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run benchmark ``argv[0]`` with the remaining arguments; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = build_parser().parse_known_args(argv)
    if args.list or not args.name:
        for name, (_, desc) in BENCHMARKS.items():
            print(f"{name:10s} {desc}")
        return 0
    import gencomm  # noqa: F401  (registers the GenComm link with opencood_ext)
    from opencood_ext.cli.errors import USER_ERRORS, report
    module = importlib.import_module(BENCHMARKS[args.name][0])
    try:
        result = module.main(rest)
    except (*USER_ERRORS, ValueError) as exc:  # a truncated checkpoint, a bad run folder or argument
        return report(exc)
    width = max((len(k) for k in result), default=0)
    for k, v in result.items():
        print(f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
