"""The main job's cost, projected from measured steps: ``gencomm-bench job [--profile default]``.

Running the default job takes hours; this measures each kind of work it does on a small simulated
set of the profile's own sizes (cameras where the job has camera types) and multiplies by how often the job does it:

* simulation: seconds per frame of ``gencomm-sim`` (the job's workers), times the dataset's and the
  separate test set's frames;
* every training run (the main table's baselines, GenComm's and, with the benchmark, the
  competitors' stage 1): seconds per optimizer step of its config (forward, backward, optimizer;
  after a warm-up step), times ``epochs x min(ceil(train frames / batch size),
  train.max_steps_per_epoch)``, plus its validation forwards;
* every onboarding (the main table's GenComm m3, its variant row where the profile has it, and
  with the benchmark each benchmark method): the same, with the method's frozen set, with and
  without a warm feature cache (:mod:`opencood_ext.models.feature_cache`);
* evaluations: seconds per test frame of each evaluated model, with and without the cache, times
  the frames of every evaluation the job runs (each main-table row with and without its
  collaborators and at the robustness sweep's levels; with the benchmark its dynamic alliances,
  late and no fusion).

What the job runs is :func:`job_plan`, which follows :func:`experiments.pipeline.run_seed`'s choices
for the profile (``--benchmark`` adds the benchmark as ``gencomm-reproduce --benchmark`` does).

Data loading runs in a worker beside the model and is not added. A projection, not a run: the
real figure is the job's own ``total_wall_s`` (REPORT.md). Report ratios from one run only.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from experiments.profiles import (BASELINES, CAMERA_TYPES, COMPETITOR_STAGE1, PROFILES, STAGE1, STAGE2, STAGE2_EGOTARGET,
                                  MAIN_ONBOARDING, Profile, onboarding_folder, starts_from_own_stage1,
                                  trained_types)


def _train_frames(profile: Profile) -> Tuple[int, int]:
    """(train frames, validation frames) of the profile's dataset (the simulator's split rule)."""
    from opencood_ext.sim.recorder import split_plan
    plan = split_plan(profile.scenarios, profile.split)
    return plan.count("train") * profile.frames, plan.count("validate") * profile.frames


def _simulate(root: Path, profile: Profile, scenarios: int, cameras: bool) -> float:
    """Seconds per frame of the simulator writing ``scenarios`` scenes of the profile (cameras as the job's)."""
    from experiments.steps import Command, call
    w, h = profile.camera_size
    t0 = time.perf_counter()
    call(Command("gencomm-sim", ["-o", root, "--scenarios", scenarios, "--frames", profile.frames, "--seed", 0,
                                 "--split_ratio", 1, 1, 1, "--camera_size", f"{w}x{h}",
                                 *(() if cameras else ("--no_cameras",))]))
    return (time.perf_counter() - t0) / (scenarios * profile.frames)


def _batches(cfg, split: str, n: int, train: bool):
    from opencood_ext.experiment import build_dataset, collate
    ds = build_dataset(cfg, split, train=train)
    bs = cfg.train.batch_size
    items = [ds[i % len(ds)] for i in range(n * bs)]
    return [collate(items[k * bs:(k + 1) * bs]) for k in range(n)]


def _step_seconds(model, batches, params) -> float:
    """Mean seconds of forward + backward + Adam step over ``batches[1:]`` (the first warms up)."""
    opt = torch.optim.Adam(params, lr=1e-4)
    times = []
    for b in batches:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model.loss(model(b), b).total.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return sum(times[1:]) / max(1, len(times) - 1)


@torch.no_grad()
def _frame_seconds(model, batches) -> float:
    """Mean seconds of ``predict`` per frame over ``batches[1:]`` (one frame each)."""
    model.eval()
    times = []
    for b in batches:
        t0 = time.perf_counter()
        model.predict(b)
        times.append(time.perf_counter() - t0)
    return sum(times[1:]) / max(1, len(times) - 1)


def _steps_per_epoch(cfg, profile: Profile) -> int:
    """Optimizer steps per epoch: every training frame once, at most ``train.max_steps_per_epoch``."""
    train_frames, _ = _train_frames(profile)
    return min(math.ceil(train_frames / cfg.train.batch_size), cfg.train.max_steps_per_epoch or 10 ** 9)


def _training(config: Path, data: Path, steps: int, profile: Profile) -> Dict[str, float]:
    from opencood_ext.experiment import build_model, load_experiment
    cfg = load_experiment(config, [f"data.root={data}", *profile.overrides])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    step = _step_seconds(model, _batches(cfg, "train", steps + 1, True), list(model.parameters()))
    per_epoch = _steps_per_epoch(cfg, profile)
    _, val_frames = _train_frames(profile)
    val = min(math.ceil(val_frames / cfg.train.batch_size), cfg.train.max_val_batches or 10 ** 9)
    return {"step_s": step, "steps": cfg.train.epochs * per_epoch,
            "seconds": cfg.train.epochs * (per_epoch * step + val * step / 3)}  # a forward ~ a third of a step


def _onboarding(config: Path, data: Path, steps: int, profile: Profile) -> Dict[str, float]:
    """Step seconds of an onboarding config with the method's frozen set, without and with a warm cache."""
    from opencood_ext.experiment import build_model, load_experiment
    from opencood_ext.methods.base import ONBOARDING
    from opencood_ext.models.feature_cache import FeatureCache
    from opencood_ext.training.freeze import FreezePolicy
    cfg = load_experiment(config, [f"data.root={data}", *profile.overrides])
    method = ONBOARDING.get_class(cfg.stage.method, "stage.method")()
    torch.manual_seed(0)
    model = build_model(cfg).train()
    params = FreezePolicy([p for t in cfg.stage.new_types for p in method.trainable(t)],
                          freeze_batchnorm_stats=True).apply(model)
    batches = _batches(cfg, "train", steps + 1, True)
    plain = _step_seconds(model, batches, params)
    with tempfile.TemporaryDirectory() as tmp:
        model.feature_cache = FeatureCache(tmp)
        _step_seconds(model, batches, params)  # fills the cache
        cached = _step_seconds(model, batches, params)
        model.feature_cache = None
    epochs = profile.onboard_epochs or cfg.train.epochs
    n = epochs * _steps_per_epoch(cfg, profile)
    return {"step_s": plain, "cached_step_s": cached, "steps": n,
            # the first epoch fills the cache; later epochs (and methods on the same weights) read it
            "seconds": n * plain, "cached_seconds": n / epochs * plain + (n - n / epochs) * cached}


def _evaluation(config: Path, data: Path, frames: int, profile: Profile) -> Tuple[float, float]:
    """(seconds per test frame, the same with a warm feature cache) of ``config``'s model."""
    from opencood_ext.experiment import build_model, load_experiment
    from opencood_ext.models.feature_cache import FeatureCache
    cfg = load_experiment(config, [f"data.root={data}", "train.batch_size=1", *profile.overrides])
    torch.manual_seed(0)
    model = build_model(cfg)
    batches = _batches(cfg, "test", frames + 1, False)
    plain = _frame_seconds(model, batches)
    with tempfile.TemporaryDirectory() as tmp:
        model.feature_cache = FeatureCache(tmp)
        _frame_seconds(model, batches)
        cached = _frame_seconds(model, batches)
    return plain, cached


@dataclass
class JobPlan:
    """What the main job of a profile runs, as :func:`experiments.pipeline.run_seed` chooses it.

    trainings / onboardings: (name, config path relative to the configs root; onboardings: None for a
    benchmark method, whose config :func:`experiments.benchmark.stage2_config` names); main_rows: the
    main table's rows, each evaluated with and without its collaborators; sweep_levels: the robustness
    sweep's evaluations per row (its levels other than 0; latency not swept on one-frame test scenes);
    benchmark_evals: the benchmark's alliance evaluations (0 without it); cameras: whether the benchmark
    alliance has a camera type."""

    trainings: List[Tuple[str, str]]
    onboardings: List[Tuple[str, Optional[str]]]
    main_rows: int
    sweep_levels: int
    benchmark_evals: int
    cameras: bool


def _sweep_levels(profile: Profile) -> int:
    from opencood_ext.eval.robustness import EFFECTS
    levels = {name: list(e.defaults) for name, e in EFFECTS.items()}
    for name, text in profile.robustness.items():
        levels[name] = EFFECTS[name].parse(text, f"profile robustness {name}")
    if profile.test_scenes > 0 and profile.test_frames == 1:
        levels["latency"] = [0]
    return sum(1 for values in levels.values() for v in values if v != 0)


def job_plan(profile: Profile, benchmark: Optional[bool] = None, robustness: bool = True) -> JobPlan:
    """The plan of ``profile``'s main job; ``benchmark`` overrides ``profile.benchmark`` (``--benchmark``),
    ``robustness`` False leaves the sweep out (``--no_robustness``)."""
    from experiments.benchmark import METHODS
    bench = profile.benchmark if benchmark is None else benchmark
    trainings = [(Path(c).stem, c) for _, _, c, _ in BASELINES]
    stage1_types, competitor_types = trained_types(profile, bench)
    trainings += [(Path(STAGE1[t]).stem, STAGE1[t]) for t in stage1_types]
    trainings += [(Path(COMPETITOR_STAGE1[t]).stem, COMPETITOR_STAGE1[t]) for t in competitor_types]
    onboardings: List[Tuple[str, Optional[str]]] = [("gencomm_m1_m3", STAGE2)]
    if profile.variant_rows:
        onboardings.append(("gencomm_egotarget_m1_m3", STAGE2_EGOTARGET))
    main_rows = len(BASELINES) + len(onboardings)
    if bench:  # the LiDAR pair's benchmark GenComm run is the main table's (onboarding_folder): trained once
        own = profile.competitor_stage1 == "own"
        onboardings += [(m, None) for _, m in METHODS if onboarding_folder(
            m, profile.benchmark_types, starts_from_own_stage1(m, own)) != MAIN_ONBOARDING]
    alliances = len(profile.benchmark_types)
    return JobPlan(trainings, onboardings, main_rows=main_rows,
                   sweep_levels=_sweep_levels(profile) if robustness else 0,
                   # methods and late fusion per dynamic alliance, and no fusion
                   benchmark_evals=((len(METHODS) + 1) * alliances + 1) if bench else 0,
                   cameras=bench and any(t in CAMERA_TYPES for t in profile.benchmark_types))


def project(profile_name: str = "default", steps: int = 3, frames: int = 3, data: Optional[Path] = None,
            configs: Optional[Path] = None, benchmark: Optional[bool] = None,
            benchmark_types: Optional[Sequence[str]] = None, robustness: bool = True) -> Dict[str, object]:
    """The projection (module docstring) -> {row: value}; minutes per kind of step and the total.
    ``benchmark_types`` (the benchmark's alliance) implies the benchmark, as in gencomm-reproduce."""
    from experiments.benchmark import stage2_config
    from opencood_ext.config_files import configs_root
    profile = PROFILES[profile_name]
    if benchmark_types is not None:
        profile = dataclasses.replace(profile, benchmark_types=tuple(benchmark_types))
        benchmark = True if benchmark is None else benchmark
    plan = job_plan(profile, benchmark, robustness)
    root = Path(configs) if configs else configs_root()
    out: Dict[str, object] = {"profile": profile_name, "benchmark": bool(plan.benchmark_evals)}
    with tempfile.TemporaryDirectory() as tmp:
        if data is None:
            data = Path(tmp) / "data"
            out["simulate_s_per_frame"] = _simulate(data, profile, scenarios=3, cameras=plan.cameras)
        sim = float(out.get("simulate_s_per_frame", 0.0))
        test_frames = profile.test_scenes * profile.test_frames
        minutes: Dict[str, float] = {"simulation": sim * (profile.scenarios * profile.frames + test_frames) / 60}
        minutes["training"] = 0.0
        for name, cfg in plan.trainings:
            r = _training(root / cfg, data, steps, profile)
            out[f"train {name}: s/step x steps = min"] = f"{r['step_s']:.2f} x {r['steps']} = {r['seconds'] / 60:.1f}"
            minutes["training"] += r["seconds"] / 60
        minutes["onboarding"] = minutes["onboarding, feature cache"] = 0.0
        for name, cfg in plan.onboardings:
            path = root / cfg if cfg else stage2_config(profile.family, name, profile.benchmark_types, root)
            r = _onboarding(path, data, steps, profile)
            out[f"onboard {name}: s/step (cached) x steps"] = (f"{r['step_s']:.2f} ({r['cached_step_s']:.2f}) x "
                                                              f"{r['steps']}")
            minutes["onboarding"] += r["seconds"] / 60
            minutes["onboarding, feature cache"] += r["cached_seconds"] / 60
        lidar_plain, lidar_cached = _evaluation(root / STAGE2, data, frames, profile)
        out["evaluate s/frame: LiDAR pair (cached)"] = f"{lidar_plain:.2f} ({lidar_cached:.2f})"
        cam_plain = cam_cached = 0.0
        if plan.benchmark_evals:
            four = stage2_config(profile.family, "gencomm", profile.benchmark_types, root)
            cam_plain, cam_cached = _evaluation(four, data, frames, profile)
            out["evaluate s/frame: benchmark alliance (cached)"] = f"{cam_plain:.2f} ({cam_cached:.2f})"
        main_evals = plan.main_rows * (2 + plan.sweep_levels)  # with and without collaborators, sweep levels
        bench_evals = plan.benchmark_evals
        minutes["evaluation"] = test_frames * (main_evals * lidar_plain + bench_evals * cam_plain) / 60
        # with the cache every evaluation after the first on the same encoders reads its features
        minutes["evaluation, feature cache"] = test_frames * (
            lidar_plain + (main_evals - 1) * lidar_cached
            + ((cam_plain + (bench_evals - 1) * cam_cached) if bench_evals else 0.0)) / 60
    for k, v in minutes.items():
        out[f"minutes: {k}"] = round(v, 1)
    out["minutes: total"] = round(minutes["simulation"] + minutes["training"] + minutes["onboarding"]
                                  + minutes["evaluation"], 1)
    out["minutes: total, feature cache"] = round(minutes["simulation"] + minutes["training"]
                                                 + minutes["onboarding, feature cache"]
                                                 + minutes["evaluation, feature cache"], 1)
    out["threads"] = torch.get_num_threads()
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="bench job", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="default")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps timed per training config (after one)")
    ap.add_argument("--frames", type=int, default=3, help="test frames timed per evaluated model (after one)")
    ap.add_argument("--data", type=Path, default=None, help="a simulated dataset with cameras (default: simulate "
                    "three scenes of the profile into a temporary folder, timing the simulator)")
    ap.add_argument("--configs", type=Path, default=None, help="configs root (default: the shipped configs)")
    ap.add_argument("--benchmark", action="store_true", help="project the job with the heterogeneous benchmark "
                    "(gencomm-reproduce --benchmark); default: the profile's own choice")
    ap.add_argument("--benchmark_types", default=None, metavar="m1,m3",
                    help="the benchmark's alliance (implies --benchmark), as gencomm-reproduce takes it")
    ap.add_argument("--no_robustness", action="store_true", help="without the robustness sweep (the learning "
                    "curves' jobs: gencomm-curves runs each budget so)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.frames < 1:
        raise ValueError("--steps and --frames must be >= 1")
    types = args.benchmark_types.split(",") if args.benchmark_types else None
    return project(args.profile, args.steps, args.frames, args.data, args.configs, True if args.benchmark else None,
                   types, robustness=not args.no_robustness)
