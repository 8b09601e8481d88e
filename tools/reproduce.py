#!/usr/bin/env python
"""The main job: simulate the embedded default dataset, train the baselines and
GenComm (stage 1 for m1 and m3, then onboard m3), evaluate, write the report.

    python tools/reproduce.py [--quick | --profile default|quick|paper] [--seeds 0,1,2]
                              [--out results] [--data data/sim]

Resumable: rerunning skips finished steps. ``--quick`` is a minutes-long smoke
run of every step (tiny data, a few training steps); ``--profile paper`` is
sized for one GPU (more data, every method, training seeds 0, 1, 2).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _seed_list(text: str):
    """"0,1,2" -> [0, 1, 2]: distinct integers >= 0 (argparse turns the error into one line, exit 2)."""
    try:
        seeds = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, e.g. 0,1,2; got {text!r}") from None
    if any(v < 0 for v in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must be distinct integers >= 0, got {text!r}")
    return seeds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke-run profile (= --profile quick)")
    p.add_argument("--profile", choices=["default", "quick", "paper"], default=None)
    p.add_argument("--no_benchmark", action="store_true",
                   help="skip the heterogeneous benchmark (step 6): the main table, robustness and report only")
    p.add_argument("--no_robustness", action="store_true",
                   help="skip the robustness sweep (step 5), e.g. when adding a training seed to an earlier run")
    p.add_argument("--benchmark_types", default=None, metavar="m1,m3",
                   help="the benchmark's alliance in joining order, ego first (default m1,m2,m3,m4; m1,m3 is the "
                        "LiDAR pair and needs no camera stage 1; m1,m2 the camera pair: one camera stage 1)")
    p.add_argument("--competitor_stage1", choices=["own", "gencomm"], default=None,
                   help="the stage-1 runs BackAlign, STAMP, MPDA and CodeFilling start from: 'own' (default: "
                        "full-feature homogeneous runs, as the reference code trains them) or 'gencomm' "
                        "(GenComm's stage-1 runs; run folders onboard_<method>_<types> without _own_stage1)")
    p.add_argument("--seeds", type=_seed_list, default=None, metavar="S1,S2,...", help="training seeds (default: the profile's)")
    p.add_argument("--test_scenes", type=int, default=None, metavar="N",
                   help="scenes of the separate test set every table evaluates on (default: the profile's, 230 "
                        "for default; 0: the dataset's own test split); more scenes, narrower intervals")
    p.add_argument("--out", type=Path, default=None, help="default results/ (results/quick with --quick)")
    p.add_argument("--data", type=Path, default=None, help="default data/sim (data/sim_quick with --quick)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gencomm.reproduce import reproduce
    profile = args.profile or ("quick" if args.quick else "default")
    out = args.out or Path("results" if profile == "default" else f"results/{profile}")
    data = args.data or Path("data/sim" if profile == "default" else f"data/sim_{profile}")
    report = reproduce(out.resolve(), data.resolve(), profile, args.seed, args.seeds, benchmark=not args.no_benchmark,
                       robustness=not args.no_robustness,
                       benchmark_types=args.benchmark_types.split(",") if args.benchmark_types else None,
                       competitor_stage1=args.competitor_stage1, test_scenes=args.test_scenes)
    print(report.read_text())
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
