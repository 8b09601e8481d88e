"""Robustness sweep: AP@0.5 / 0.7 of several trained runs under pose noise,
latency and message loss, every run on the same seeded channel.

    python tools/robustness.py --runs GenComm=runs/onboard_gencomm_m3 --runs Late=runs/m1m3_late:late \\
        --sweep all -o results/robustness
    python tools/robustness.py --runs LABEL=RUN_DIR[:FUSION] ... --sweep noise|latency|drop|all -o OUT
        [--noise 0,0.2,0.4,0.6] [--latency 0,1,2,3] [--drop 0,0.25,0.5,1] [--channel_seed 0]
        [--split test] [--max_frames N] [--set KEY=VALUE]

--runs: a label for the tables, the run folder (ours, or a reference OpenCOOD/HEAL one), and
optionally the fusion method to run it with (default: the one it was trained for). Levels: pose
noise std in m (x, y) and deg (yaw) at once; latency in frames; drop as a probability.

Each evaluation lands in its run folder as eval_<label>.json (the label tools/inference.py gives
the same settings, e.g. eval_late_noise0.2m0.2deg.json) with its stamp eval_<label>.inputs.json; one
already there is reused when its stamp records the same settings, code and input files (the run's
config and weights, the test data), so an interrupted sweep resumes, and an edit of the code, a
retrained checkpoint or another data.root evaluates again. The drop sweep also
evaluates each run with its collaborators off (eval_none.json). Writes OUT/robustness.json,
OUT/robustness.md (tables) and OUT/robustness.png (AP against the level, one panel per effect).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv=None) -> int:
    from opencood_ext.eval.robustness import EFFECTS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", action="append", required=True, metavar="LABEL=RUN_DIR[:FUSION]")
    p.add_argument("--sweep", choices=[*EFFECTS, "all"], default="all")
    p.add_argument("-o", "--out", type=Path, required=True, help="folder for robustness.{json,md,png}")
    for name, eff in EFFECTS.items():
        p.add_argument(f"--{name}", default=",".join(f"{v:g}" for v in eff.defaults), metavar="LEVELS",
                       help=f"{eff.title.lower()} levels: {eff.axis} (default %(default)s)")
    p.add_argument("--channel_seed", type=int, default=0)
    p.add_argument("--split", default=None, help="default: eval.split of each run's config")
    p.add_argument("--max_frames", type=int, default=None, help="default: eval.max_frames of each run's config")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every run (e.g. data.root=...)")
    p.add_argument("--no_progress", action="store_true")
    p.add_argument("--feature_cache", type=Path, default=None, metavar="DIR",
                   help="keep the encoder stacks' features in DIR and reuse them across levels and runs (keyed by "
                        "weights and input: never another checkpoint's or frame's; opencood_ext.models.feature_cache)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from opencood_ext.cli.errors import USER_ERRORS, data_hint, report
    from opencood_ext.eval.robustness import parse_run, sweep, write_outputs
    from opencood_ext.models.fusion_methods import FUSION_METHODS
    from opencood_ext.run_folder import FUSION_ALIASES

    try:
        methods = [*FUSION_METHODS.keys(), *FUSION_ALIASES]
        specs = [parse_run(text, methods) for text in args.runs]
        specs = [s if s.fusion is None else type(s)(s.label, s.run_dir, FUSION_ALIASES.get(s.fusion, s.fusion))
                 for s in specs]
        names = list(EFFECTS) if args.sweep == "all" else [args.sweep]
        levels = {n: EFFECTS[n].parse(getattr(args, n), f"--{n}") for n in names}
        for s in specs:
            if not s.run_dir.is_dir():
                raise FileNotFoundError(f"--runs {s.label}: run folder {s.run_dir} does not exist")
        from opencood_ext.models.feature_cache import FeatureCache
        data = sweep(specs, levels, seed=args.channel_seed, split=args.split, max_frames=args.max_frames,
                     overrides=args.overrides, progress=not args.no_progress,
                     feature_cache=FeatureCache(args.feature_cache) if args.feature_cache else None)
    except (*USER_ERRORS, ValueError) as exc:  # a bad --runs or level, a truncated checkpoint, a config error
        return report(exc, data_hint(exc, skipping=False))
    paths = write_outputs(data, args.out)
    print((paths["md"]).read_text())
    print("wrote " + ", ".join(str(v) for v in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
