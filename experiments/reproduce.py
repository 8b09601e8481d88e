"""The whole story on the embedded default, end to end:

1. simulate the default dataset when it is missing (built-in world, OPV2V-H format);
2. train the baselines (no / late / early / full-feature intermediate fusion,
   the latter three retrained with both types) and GenComm stage 1 for m1
   (PointPillars, 64-beam) and m3 (SECOND, 32-beam), side by side in ``--jobs`` lanes
   (:mod:`experiments.lanes`);
3. onboard m3 into m1's alliance (stage 2: only m3's message extractor trains), with the
   benchmark's onboardings side by side in the same lanes once the trainings are done;
4. evaluate everything on the test split with an m1 ego and m3 collaborators,
   and again with the same weights and the collaborators off (what cooperation
   adds, paired);
5. sweep every row under pose noise, latency and message loss on one seeded
   channel (``robustness/``);
6. with ``--benchmark`` (or ``--benchmark_types``; the ``paper`` profile always), the heterogeneous
   benchmark (:mod:`experiments.benchmark`): GenComm stage 1 also
   for the camera types m2 and m4, then m2, m3, m4 join m1's alliance by every
   method (GenComm, BackAlign, STAMP, MPDA, CodeFilling), evaluated as the
   alliance grows, with No fusion and Late fusion built from GenComm's stage-1
   runs. The competitors start from their own full-feature stage-1 runs
   (``sim/baseline_stage1_<t>.yaml`` under the configs root) unless ``competitor_stage1`` is
   "gencomm";
7. write ``REPORT.md`` (tables with 95% intervals, paired differences, plots)
   and ``results.json``.

Every step is resumable: a finished run is skipped, an interrupted one
continues from its last checkpoint, and an evaluation is skipped when its
command, the code (its Python sources) and every file it reads (the
run's config and checkpoints, the test split) are as its
``eval_<label>.inputs.json`` stamp records them. The ``quick`` profile shrinks data and training
to a smoke run that exercises every step in minutes.

Every step runs a command-line program in this process (:mod:`experiments.steps`); the configs are
read from the configs root given (``--configs``, default the shipped ones), ``--out`` and ``--data``
are relative to the working directory, so ``gencomm-reproduce`` runs from an installed wheel.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

import yaml

from .pipeline import Steps, found_finished, one_seed, simulate, simulate_test_set
from .profiles import PROFILES, Profile, default_data_dir
from .report_epochs import seed_runs
from .family_figures import compute_family_figures
from .results import Results, ResultsError
from .steps import StepError

SOURCE = Path(__file__).resolve().parents[1]  # the checkout (or site-packages) this package runs from
log = logging.getLogger(__name__)


def seed_archives(out: Path, profile_name: str, data_seed: int, like: Optional[Path] = None) -> List[Path]:
    """The seed archives in ``out/seeds`` of this experiment (same profile and data seed and, when
    ``like`` names an archive, the same test frames as it), by seed; archives of another experiment
    (e.g. evaluated on an earlier test split) are left out with a warning."""
    from .archives import load_archive
    frames = None if like is None else load_archive(like).test_frames()
    keep = []
    for folder in sorted((out / "seeds").glob("seed*")):
        if not (folder / "rows.json").is_file():
            continue
        archive = load_archive(folder)
        meta = archive.meta
        if (meta.get("profile"), meta.get("data_seed")) != (profile_name, data_seed):
            log.warning("%s: profile %s, data seed %s, not this run's (%s, %s); left out of the seed spread",
                        folder, meta.get("profile"), meta.get("data_seed"), profile_name, data_seed)
            continue
        if frames is not None and archive.test_frames() != frames:
            log.warning("%s: evaluated on other test frames than %s; left out of the seed spread", folder, like)
            continue
        keep.append(folder)
    return keep


def reproduce(out: Path, data: Path, profile_name: str = "default", seed: int = 0,
              seeds: Optional[Sequence[int]] = None, benchmark: Optional[bool] = None, robustness: bool = True,
              benchmark_types: Optional[Sequence[str]] = None, competitor_stage1: Optional[str] = None,
              test_scenes: Optional[int] = None, configs: Optional[Path] = None,
              command: str = "gencomm-reproduce", feature_cache: bool = True, score_epochs=(),
              protocol: Optional[str] = None, budget: int = 1, jobs: Optional[int] = None) -> Path:
    """The main job (module docstring). ``seed``: the data and channel seed; ``seeds``: training seeds
    (default: the profile's); every row is trained once per training seed (seed 0's runs in ``runs``,
    another seed's in ``runs/seed<s>``), the report shows the first seed's rows and the spread across seeds.
    Every seed leaves an archive in ``out/seeds/seed<s>`` (:mod:`experiments.seeds`); the spread covers every
    archive there of this profile and data seed, so a seed added by a later invocation joins it.
    ``robustness``: sweep the first seed's rows (step 5). ``test_scenes``: size of the separate test set
    (None: the profile's; 0: the dataset's own test split). ``configs``: the configs root (default the
    shipped configs); ``command``: the invocation's command line, recorded in results.json and the archives;
    ``feature_cache``: keep frozen encoders' features in ``out/cache/features`` (results equal the uncached
    ones; False computes every encoding, for a side-by-side check); ``score_epochs``: the benchmark methods (keys,
    "all", or True for all) whose every kept onboarding epoch is evaluated too (:attr:`Profile.score_epochs`),
    for the report's AP per onboarding epoch and what the camera adds at each. ``protocol``: run every step under this protocol
    (``--set protocol=...`` for every training, onboarding and evaluation; None: the configs' own,
    ``equalized`` for the shipped sim configs), e.g. ``reference`` for the LiDAR pair under the reference
    code's placement (issue 31). ``budget``: every training and onboarding runs ``budget`` times its
    epochs (:func:`scale_budget`; 1: the configs' own), for the learning curves (:mod:`experiments.curves`).
    ``benchmark``: run the heterogeneous benchmark (step 6; None: the profile's, off for ``default``, on when
    ``benchmark_types`` is given). ``jobs``: trainings, then onboardings, side by side
    (:func:`experiments.lanes.lane_plan`; None: automatic, one per core up to 4, one on a CUDA machine)."""
    from opencood_ext.config_files import configs_root
    profile = PROFILES[profile_name]
    if benchmark_types is not None:
        profile = dataclasses.replace(profile, benchmark_types=tuple(benchmark_types))
        benchmark = True if benchmark is None else benchmark  # naming an alliance asks for its benchmark
    if benchmark is not None:
        profile = dataclasses.replace(profile, benchmark=benchmark)
    from .lanes import lane_plan
    plan = lane_plan(jobs)
    if competitor_stage1 is not None:
        if competitor_stage1 not in ("own", "gencomm"):
            raise ValueError(f"competitor_stage1 must be 'own' or 'gencomm', got {competitor_stage1!r}")
        profile = dataclasses.replace(profile, competitor_stage1=competitor_stage1)
    if score_epochs:
        from .benchmark import scored_methods
        profile = dataclasses.replace(profile, score_epochs=tuple(scored_methods(score_epochs)))
    if protocol is not None:
        from opencood_ext.protocol import PROTOCOLS
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        profile = dataclasses.replace(profile, overrides=[*profile.overrides, f"protocol={protocol}"])
    if test_scenes is not None:
        if test_scenes < 0:
            raise ValueError(f"test_scenes must be >= 0, got {test_scenes}")
        profile = dataclasses.replace(profile, test_scenes=test_scenes)
    configs = Path(configs).resolve() if configs is not None else configs_root()
    if not configs.is_dir():
        raise FileNotFoundError(f"--configs {configs}: no such folder")
    profile = scale_budget(profile, budget, configs)
    seeds = list(seeds if seeds is not None else profile.seeds)
    out.mkdir(parents=True, exist_ok=True)
    if feature_cache:
        profile = dataclasses.replace(profile, feature_cache=str(out / "cache" / "features"))
    from opencood_ext.training.precision import job_precision
    precision = job_precision()  # float32 everywhere until bf16 is validated (the module says why)
    log.info("precision: %s (%s)", precision.choice, precision.reason)
    if precision.choice != "float32":
        profile = dataclasses.replace(profile, overrides=[*profile.overrides, f"train.amp={precision.choice}"])
    runs = out / "runs"
    reused = found_finished(out, data)
    started = time.time()
    steps = Steps()
    steps.run("simulate", simulate, data, profile, seed)
    test_root = steps.run("simulate the test set", simulate_test_set, data, profile, seed)
    per_seed = {}
    from .archives import archive_seed, git_commit, load_archives
    from .seeds import spread_json
    commit = git_commit(SOURCE)
    for k, s in enumerate(seeds):
        # seed 0's runs in runs/, another seed's in runs/seed<s> (so adding a seed later never resumes seed 0's)
        per_seed[s] = one_seed(out, seed_runs(runs, s), data, profile, s, steps, configs,
                               robustness=robustness and k == 0, test_root=test_root, plan=plan)
        archive_seed(per_seed[s].rows, s, out / "seeds",  # the main table's and the benchmark's rows
                     {"profile": profile_name, "data_seed": seed, "commit": commit, "command": command},
                     test_root=test_root or data)
    first = per_seed[seeds[0]]
    # this invocation's seeds and earlier ones evaluated on the same test frames
    archives = seed_archives(out, profile_name, seed, like=out / "seeds" / f"seed{seeds[0]}")
    results = Results(profile=profile_name, seed=seed, training_seeds=seeds, data=str(data),
                      test_data=str(test_root or data), commit=commit, command=command, configs=str(configs),
                      rows=first.rows, onboarding=first.onboarding, stage1_wall_s=first.stage1_wall_s,
                      steps=steps.rows, total_wall_s=time.time() - started, from_scratch=not reused,
                      found_finished=reused, seed_archives=[str(a) for a in archives],
                      seed_spread=spread_json(load_archives(archives)) if len(archives) > 1 else None,
                      feature_cache=profile.feature_cache, precision=precision.to_dict(),
                      scene_families=compute_family_figures(first.rows, test_root or data)[0],
                      lanes={"lanes": plan.lanes, "threads": plan.threads})
    results.write(out / "results.json")
    from .report import write_report
    return write_report(results, out)


def scale_budget(profile: Profile, budget: int, configs: Path) -> Profile:
    """``profile`` with every training and onboarding run at ``budget`` times its epochs: the profile's
    own ``train.epochs`` override (which reaches the onboardings too), else ``sim/base.yaml``'s for the
    trainings and ``sim/stage2/methods/gencomm.yaml``'s for the onboardings, times ``budget``; the
    profile's onboarding epochs, when it sets them, times ``budget``.
    Budget 1 returns the profile unchanged (the same commands, so earlier runs are reused)."""
    if budget < 1:
        raise ValueError(f"budget must be a positive whole number, got {budget}")
    if budget == 1:
        return profile
    given = [o.split("=", 1)[1] for o in profile.overrides if o.startswith("train.epochs=")]
    epochs = int(given[-1]) if given else _config_epochs(configs / "sim" / "base.yaml")
    if profile.onboard_epochs is not None:
        onboard = profile.onboard_epochs * budget
    elif given:  # the profile's train.epochs reaches the onboardings too: they scale with it
        onboard = None
    else:  # the stage-2 configs' own epochs (every method's the same, tests/experiments/test_equal_budgets.py)
        onboard = _config_epochs(configs / "sim" / "stage2" / "methods" / "gencomm.yaml") * budget
    return dataclasses.replace(profile, overrides=[*profile.overrides, f"train.epochs={epochs * budget}"],
                               onboard_epochs=onboard)


def _config_epochs(path: Path) -> int:
    """A config file's own ``train.epochs`` (the epochs --budget multiplies); ValueError naming file and field."""
    try:
        return int(yaml.safe_load(path.read_text())["train"]["epochs"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: field 'train.epochs' (the epochs --budget multiplies) unreadable: {exc}") from None


def _seed_list(text: str):
    """"0,1,2" -> [0, 1, 2]: distinct integers >= 0 (argparse turns the error into one line, exit 2)."""
    try:
        seeds = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, e.g. 0,1,2; got {text!r}") from None
    if any(v < 0 for v in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must be distinct integers >= 0, got {text!r}")
    return seeds


USAGE = """The main job: simulate the embedded default dataset, train the baselines and
GenComm (stage 1 for m1 and m3, then onboard m3), evaluate, write the report.

    gencomm-reproduce [--quick | --profile default|quick|paper] [--benchmark] [--seeds 0,1,2]
                      [--jobs N] [--out results] [--data data/sim] [--configs DIR]

From a checkout, ``python tools/reproduce.py`` runs the same command. Resumable: rerunning skips
finished steps. ``--quick`` is a minutes-long smoke run of every step (tiny data, a few training
steps); ``--benchmark`` adds the four-type onboarding study (m2, m3, m4 join by every method);
``--profile paper`` is sized for one GPU (more data, every method, training seeds 0, 1, 2).
--out and --data are relative to the working directory.
"""


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``gencomm-reproduce``: exit 0 with the report printed, or 2 with one line on stderr."""
    p = argparse.ArgumentParser(prog="gencomm-reproduce", description=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke-run profile (= --profile quick)")
    p.add_argument("--profile", choices=list(PROFILES), default=None)
    bench = p.add_mutually_exclusive_group()
    bench.add_argument("--benchmark", action="store_true",
                       help="also run the heterogeneous benchmark (step 6): m2, m3, m4 join m1's alliance by every "
                            "onboarding method (the four-type study; camera images simulated; hours on a CPU)")
    bench.add_argument("--no_benchmark", action="store_true",
                       help="skip the heterogeneous benchmark even where the profile (paper) or --benchmark_types "
                            "asks for it: the main table, robustness and report only")
    p.add_argument("--no_robustness", action="store_true",
                   help="skip the robustness sweep (step 5), e.g. when adding a training seed to an earlier run")
    p.add_argument("--benchmark_types", default=None, metavar="m1,m3",
                   help="run the benchmark on this alliance in joining order, ego first (default with --benchmark: "
                        "m1,m2,m3,m4; m1,m3 is the LiDAR pair and needs no camera stage 1; m1,m2 the camera pair)")
    p.add_argument("--competitor_stage1", choices=["own", "gencomm"], default=None,
                   help="the stage-1 runs BackAlign, STAMP, MPDA and CodeFilling start from: 'own' (default: "
                        "full-feature homogeneous runs, as the reference code trains them) or 'gencomm' "
                        "(GenComm's stage-1 runs; run folders onboard_<method>_<types> without _own_stage1)")
    p.add_argument("--seeds", type=_seed_list, default=None, metavar="S1,S2,...",
                   help="training seeds (default: the profile's)")
    p.add_argument("--test_scenes", type=int, default=None, metavar="N",
                   help="scenes of the separate test set every table evaluates on (default: the profile's, 230 "
                        "for default; 0: the dataset's own test split); more scenes, narrower intervals")
    p.add_argument("--out", type=Path, default=None, help="default results/ (results/quick with --quick)")
    p.add_argument("--data", type=Path, default=None, help="default data/sim (data/sim_quick with --quick)")
    p.add_argument("--configs", type=Path, default=None,
                   help="configs root holding sim/... (default: the shipped configs)")
    p.add_argument("--seed", type=int, default=0, help="data and channel seed")
    p.add_argument("--no_feature_cache", action="store_true",
                   help="encode every frame in every onboarding and evaluation (default: frozen encoder stacks' "
                        "features are kept in OUT/cache/features and reused; the results are the same)")
    p.add_argument("--protocol", choices=["equalized", "reference", "native"], default=None,
                   help="run every step under this protocol (default: the configs' own, equalized for the shipped "
                        "sim configs); reference: the reference code's placement (GenComm generates before the warp, "
                        "nothing but the 1x1 head after fusion). Default --out results_<protocol> when given")
    p.add_argument("--score_epochs", nargs="?", const="all", default="", metavar="METHODS",
                   help="the benchmark also evaluates every kept epoch of these onboarding methods on the test set "
                        "(comma-separated keys, e.g. gencomm; alone: all) for REPORT.md's AP per onboarding epoch and "
                        "what the camera adds at each; costs epochs x alliances more evaluations per method (4 x 4: "
                        "16 per method, 96 for the six rows)")
    p.add_argument("--budget", type=int, default=1, metavar="K",
                   help="train and onboard every run for K times its epochs (default 1: the configs' own); the "
                        "learning curves (tools/learning_curves.py) run the LiDAR pair at K = 1, 2, 4, ...")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="trainings, then onboardings, side by side, each on threads/N threads (default: one per core up "
                        "to 4; one with CUDA). On a CPU two one-thread runs finish far sooner than one after another "
                        "on two")
    args = p.parse_args(None if argv is None else list(argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    profile = args.profile or ("quick" if args.quick else "default")
    tail = f"_{args.protocol}" if args.protocol else ""
    out = args.out or Path(f"results{tail}" if profile == "default" else f"results/{profile}{tail}")
    data = args.data or default_data_dir(profile)
    words = sys.argv[1:] if argv is None else list(argv)
    try:
        report = reproduce(out.resolve(), data.resolve(), profile, args.seed, args.seeds,
                           benchmark=False if args.no_benchmark else (True if args.benchmark else None),
                           robustness=not args.no_robustness,
                           benchmark_types=args.benchmark_types.split(",") if args.benchmark_types else None,
                           competitor_stage1=args.competitor_stage1, test_scenes=args.test_scenes,
                           configs=args.configs, command=shlex.join(["gencomm-reproduce", *words]),
                           feature_cache=not args.no_feature_cache, score_epochs=[m for m in args.score_epochs.split(",") if m],
                           protocol=args.protocol, budget=args.budget, jobs=args.jobs)
    except (ValueError, FileNotFoundError, StepError, ResultsError) as exc:
        print(f"error: gencomm-reproduce: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(report.read_text())
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
