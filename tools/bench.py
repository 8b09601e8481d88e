#!/usr/bin/env python
"""Benchmarks (never assertions): ``python tools/bench.py NAME [args]``.

Each benchmark is a module in ``bench/`` with ``main(argv) -> dict``; the dict
is printed as a table and, with ``--json FILE``, written out. A bad input (a
truncated checkpoint, a missing run folder, a config error) is one line on
stderr and exit status 2. Run
``python tools/bench.py --list`` to see them.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gencomm  # noqa: E402,F401  (registers the GenComm link with opencood_ext)

# name -> (module in bench/, one-line description). Explicit on purpose.
BENCHMARKS = {
    "pcd": ("bench.pcd_parse", "PCD decoding on the fixture: ours vs Open3D vs numpy (ascii, binary_compressed)"),
    "loading": ("bench.data_loading", "PCD decoding + dataset samples/s: ours, ours with warm cache, Open3D"),
    "iou": ("bench.rotated_iou", "BEV rotated-box IoU pairs per second, NMS time"),
    "ap": ("bench.ap_eval", "AP evaluation over 1000 frames x 50 boxes"),
    "bootstrap": ("bench.bootstrap", "scene-bootstrap AP intervals: 1000 resamples over 50 frames, vs re-matching"),
    "sim": ("bench.sim", "simulator LiDAR agent-scans/s, rays/s vs bare Embree, camera cost"),
    "train": ("bench.train_step", "train step / inference frame: no fusion vs intermediate vs GenComm, module shares"),
    "gencomm": ("bench.gencomm_modules", "message extractor, generator, wire format cost"),
    "fusion": ("bench.fusion_ops", "fusion ops (max, att, V2X-ViT sim / reference setting): params, fwd+bwd time"),
    "warp": ("bench.warp_sensitivity", "AP a trained detector loses when its own feature is warped"),
}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", nargs="?", choices=sorted(BENCHMARKS))
    parser.add_argument("--list", action="store_true", help="list benchmarks")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args, rest = parser.parse_known_args(argv)
    if args.list or not args.name:
        for name, (_, desc) in BENCHMARKS.items():
            print(f"{name:10s} {desc}")
        return 0
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
