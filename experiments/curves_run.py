"""``gencomm-curves`` / ``python tools/learning_curves.py``: run and report the learning curves
(:mod:`experiments.curves` says what they are).

    python tools/learning_curves.py run --out OUT [--data DATA] [--seed S] [--budgets 1,2,4] [--max_budget 32]
                                        [--profile default|quick] [--keep_feature_cache] [--jobs N]
    python tools/learning_curves.py seeds --out OUT --budget K [--seeds 0,1,2] [--fair DEST] [--data DATA]
                                          [--profile default|quick|...] [--jobs N]
    python tools/learning_curves.py status OUT [--budgets 2,4] [--profile ...] [--jobs N]
    python tools/learning_curves.py report OUT [-o FOLDER]
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from .curves import STAGE1_RUNS, budget_folders, collect, folder_bytes
from .curves_report import write_report

log = logging.getLogger(__name__)
PAIR = ("m1", "m3")


def budgets_upto(max_budget: int) -> List[int]:
    """1, 2, 4, ... up to ``max_budget`` (at least 1)."""
    if max_budget < 1:
        raise ValueError(f"--max_budget must be >= 1, got {max_budget}")
    out, b = [], 1
    while b <= max_budget:
        out.append(b)
        b *= 2
    return out


def score_stage1(folder: Path, data: Path, profile_name: str, seed: int, budget: int) -> List[Path]:
    """Evaluate every stage-1 run of one budget's job among its own type (its own config's agents,
    intermediate fusion) on the job's test set; ``gencomm-infer --reuse`` skips a current evaluation."""
    from opencood_ext.config_files import configs_root
    from opencood_ext.run_folder import RunFolder
    from .pipeline import evaluate_run, test_set_root
    from .profiles import PROFILES
    from .report_epochs import seed_runs
    from .reproduce import scale_budget
    profile = scale_budget(PROFILES[profile_name], budget, configs_root())
    if profile.test_scenes > 0:
        profile = dataclasses.replace(profile, overrides=[*profile.overrides, f"data.root={test_set_root(data)}"])
    else:
        profile = dataclasses.replace(profile, overrides=[*profile.overrides, f"data.root={data}"])
    profile = dataclasses.replace(profile, feature_cache=str(folder / "cache" / "features"))
    runs = seed_runs(folder / "runs", seed)
    scored = []
    for name in STAGE1_RUNS.values():
        run = runs / name
        weights = RunFolder(run).checkpoints
        if weights.best.is_file() or weights.latest.is_file():  # trained by this budget's job
            evaluate_run(run, "intermediate", profile)
            scored.append(run)
    return scored


def drop_feature_cache(folder: Path) -> int:
    """Remove a finished budget's feature cache (``<folder>/cache/features``); -> the bytes freed. It only
    saves time while the budget runs: each budget has its own stage-1 weights, so no other budget reads it,
    and the budget's evaluations are reused through their stamps, not the cache. About 22 GB at budget 1 of
    the full profile, so budgets that kept theirs would fill a disk."""
    import shutil
    cache = Path(folder) / "cache" / "features"
    if not cache.is_dir():
        return 0
    size = folder_bytes(cache)
    shutil.rmtree(cache)
    log.info("learning curves: removed %s (%.1f GB; --keep_feature_cache keeps it)", cache, size / 1e9)
    return size


def run_curves(out: Path, data: Path, seed: int = 0, budgets: Sequence[int] = (1, 2, 4, 8, 16, 32),
               profile_name: str = "default", command: str = "gencomm-curves", keep_feature_cache: bool = False,
               jobs: Optional[int] = None) -> Path:
    """The main job on the LiDAR pair at each budget (module docstring of :mod:`experiments.curves`),
    stopping after the first budget at which every trained run has converged; each finished budget's
    feature cache is removed (:func:`drop_feature_cache`) unless ``keep_feature_cache``; ``jobs``: its
    trainings and onboardings side by side (:mod:`experiments.lanes`; None: one lane per thread up to 4);
    -> OUT/CURVES.md."""
    from .reproduce import reproduce
    out, data = Path(out).resolve(), Path(data).resolve()
    report = out / "CURVES.md"
    for b in sorted(set(budgets)):
        folder = out / f"budget{b}"
        log.info("learning curves: budget %dx into %s", b, folder)
        reproduce(folder, data, profile_name, seeds=[seed], robustness=False, benchmark_types=list(PAIR),
                  command=f"{command} (budget {b})", budget=b, jobs=jobs)
        score_stage1(folder, data, profile_name, seed, b)
        if not keep_feature_cache:
            drop_feature_cache(folder)
        curves = collect(out)
        write_report(curves, out)
        trained = {k: v for k, v in curves.converged_at.items()
                   if any(p.key == k and p.val_detection_loss is not None for p in curves.points)}
        if len(curves.budgets) > 1 and trained and all(v is not None for v in trained.values()):
            log.info("learning curves: every run converged by budget %dx", b)
            break
    return report


def run_seeds(out: Path, data: Path, budget: int, seeds: Sequence[int], profile_name: str = "default",
              fair: Optional[Path] = None, command: str = "gencomm-curves seeds", jobs: Optional[int] = None) -> Path:
    """The fair benchmark at one budget of the curves (issue 49 item 6): the main job of ``OUT/budget<K>``
    again with training seeds ``seeds``, the curves' own seed first, so its runs are found done and only
    the other seeds train (into ``runs/seed<s>``), each leaving a seed archive in ``OUT/budget<K>/seeds``;
    with ``fair``, those archives combined by :func:`experiments.fair.write_fair_benchmark` into that folder.
    The budget's feature cache is removed afterwards, as :func:`run_curves` does; ``jobs`` as there.
    results.json keeps the first seed's rows, so the curves' points do not change. -> the report written
    last (``fair``'s REPORT.md, else the budget's)."""
    from .reproduce import reproduce
    from .results import Results
    out, data = Path(out).resolve(), Path(data).resolve()
    folder = out / f"budget{budget}"
    if not (folder / "results.json").is_file():
        raise FileNotFoundError(f"{folder}: no results.json; run the curves to budget {budget} first "
                                f"(gencomm-curves run --budgets {budget})")
    curve_seed = (Results.load(folder / "results.json").training_seeds or [0])[0]
    seeds = list(dict.fromkeys(seeds))
    if not seeds or seeds[0] != curve_seed:
        raise ValueError(f"--seeds must begin with the curves' own training seed {curve_seed} (their runs are "
                         f"reused and their results.json rows kept), got {','.join(map(str, seeds)) or 'none'}")
    log.info("learning curves: seeds %s at budget %dx in %s", seeds, budget, folder)
    report = reproduce(folder, data, profile_name, seeds=seeds, robustness=False, benchmark_types=list(PAIR),
                       command=command, budget=budget, jobs=jobs)
    drop_feature_cache(folder)
    if fair is None:
        return report
    from .fair import write_fair_benchmark
    Path(fair).mkdir(parents=True, exist_ok=True)
    return write_fair_benchmark([folder / "seeds" / f"seed{s}" for s in seeds], Path(fair))


def _budget_list_of(option: str, minimum: int = 1):
    """An argparse type: comma-separated whole numbers >= ``minimum`` (``option`` names them in the error)."""
    def parse(text: str) -> List[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            values = []
        if not values or min(values) < minimum:
            kind = "positive whole numbers, e.g. 1,2,4" if minimum == 1 else f"whole numbers >= {minimum}, e.g. 0,1,2"
            raise argparse.ArgumentTypeError(f"{option} must be {kind}; got {text!r}")
        return values
    return parse


_budget_list = _budget_list_of("--budgets")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Exit 0, or 2 with one line on stderr for bad input (a missing or malformed results file)."""
    from .profiles import PROFILES, default_data_dir
    from .results import ResultsError
    from .steps import StepError
    p = argparse.ArgumentParser(prog="gencomm-curves", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train and score the LiDAR pair at doubling budgets")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--data", type=Path, default=None, help="default data/sim (data/sim_<profile> otherwise)")
    r.add_argument("--seed", type=int, default=0, help="the training seed")
    r.add_argument("--profile", choices=list(PROFILES), default="default")
    r.add_argument("--keep_feature_cache", action="store_true",
                   help="keep each finished budget's feature cache (about 22 GB a budget with --profile full; "
                        "default: removed once the budget is scored)")
    r.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="trainings, then onboardings, side by side in N lanes, each on "
                   "threads/N threads (default: one per thread up to 4, so OMP_NUM_THREADS=1 gives one)")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--max_budget", type=int, default=32, help="double up to this budget (default 32)")
    g.add_argument("--budgets", type=_budget_list, default=None, help="exactly these budgets, e.g. 1,2,4")
    f = sub.add_parser("seeds", help="more training seeds at one budget (the converged one), and their fair "
                                      "benchmark")
    f.add_argument("--out", type=Path, required=True, help="the curves' folder (holding budget<K>/)")
    f.add_argument("--budget", type=int, required=True, metavar="K", help="the budget to add seeds at")
    f.add_argument("--seeds", type=_budget_list_of("--seeds", minimum=0), default=[0, 1, 2],
                   help="training seeds, the curves' own first (default 0,1,2)")
    f.add_argument("--data", type=Path, default=None, help="default data/sim (data/sim_<profile> otherwise)")
    f.add_argument("--profile", choices=list(PROFILES), default="default", help="the curves' profile")
    f.add_argument("--fair", type=Path, default=None, metavar="DEST",
                   help="also combine the seeds' archives into a fair benchmark there (tools/fair_benchmark.py)")
    f.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="trainings, then onboardings, side by side in N lanes, each on "
                   "threads/N threads (default: one per thread up to 4, so OMP_NUM_THREADS=1 gives one)")
    t = sub.add_parser("status", help="per budget: each training and onboarding's epochs done and core-hours left")
    t.add_argument("out", type=Path)
    t.add_argument("--budgets", type=_budget_list, default=None, help="these budgets (default: every budget<K>/)")
    t.add_argument("--profile", choices=list(PROFILES), default="default", help="the curves' profile")
    t.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="also the wall-clock hours left with run --jobs N (one-thread lanes)")
    s = sub.add_parser("report", help="curves.json, CURVES.md and curves.png from OUT/budget<K>/")
    s.add_argument("out", type=Path)
    s.add_argument("-o", "--to", type=Path, default=None, help="write them here (default: OUT)")
    args = p.parse_args(None if argv is None else list(argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    words = sys.argv[1:] if argv is None else list(argv)
    try:
        if args.cmd == "run":
            data = args.data or default_data_dir(args.profile)
            budgets = args.budgets or budgets_upto(args.max_budget)
            report = run_curves(args.out, data, args.seed, budgets, args.profile,
                                command=shlex.join(["gencomm-curves", *words]),
                                keep_feature_cache=args.keep_feature_cache, jobs=args.jobs)
        elif args.cmd == "seeds":
            report = run_seeds(args.out, args.data or default_data_dir(args.profile), args.budget, args.seeds,
                               args.profile, args.fair, command=shlex.join(["gencomm-curves", *words]), jobs=args.jobs)
        elif args.cmd == "status":
            from .curves_status import status_markdown
            budgets = args.budgets or [k for k, _ in budget_folders(args.out)]
            if not budgets:
                raise FileNotFoundError(f"{args.out}: no budget<K>/ folder (run `learning_curves.py run` first)")
            print(status_markdown(args.out, budgets, args.profile, args.jobs), end="")
            return 0
        else:
            report = [f for f in write_report(collect(args.out), args.to or args.out) if f.suffix == ".md"][0]
    except (ValueError, FileNotFoundError, StepError, ResultsError) as exc:
        print(f"error: gencomm-curves: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(report.read_text())
    print(f"report: {report}")
    return 0
