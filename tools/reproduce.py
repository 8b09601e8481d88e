#!/usr/bin/env python
"""The main job: simulate the embedded default dataset, train the baselines and
GenComm (stage 1 for m1 and m3, then onboard m3), evaluate, write the report.

    python tools/reproduce.py [--quick] [--out results] [--data data/sim]

Resumable: rerunning skips finished steps. ``--quick`` is a minutes-long smoke
run of every step (tiny data, a few training steps).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke-run profile")
    p.add_argument("--out", type=Path, default=None, help="default results/ (results/quick with --quick)")
    p.add_argument("--data", type=Path, default=None, help="default data/sim (data/sim_quick with --quick)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gencomm.reproduce import reproduce
    profile = "quick" if args.quick else "default"
    out = args.out or Path("results/quick" if args.quick else "results")
    data = args.data or Path("data/sim_quick" if args.quick else "data/sim")
    report = reproduce(out.resolve(), data.resolve(), profile, args.seed)
    print(report.read_text())
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
