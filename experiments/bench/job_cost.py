"""The main job's cost, projected from measured steps: ``gencomm-bench job [--profile default]``.

Running the default job takes hours; this measures each kind of work it does on a small simulated
set of the profile's own sizes (cameras included) and multiplies by how often the job does it:

* simulation: seconds per frame of ``gencomm-sim`` (the job's workers), times the dataset's and the
  separate test set's frames;
* every training run (the main table's baselines, GenComm's and the competitors' stage 1): seconds
  per optimizer step of its config (forward, backward, optimizer; after a warm-up step), times
  ``epochs x ceil(train frames / batch size)``, plus its validation forwards;
* every onboarding (the main table's GenComm m3 and each benchmark method): the same, with the
  method's frozen set, with and without a warm feature cache (:mod:`opencood_ext.models.feature_cache`);
* evaluations: seconds per test frame of each evaluated model, with and without the cache, times
  the frames of every evaluation the job runs (main table twice per row, the robustness sweep's
  levels, the benchmark's dynamic alliances, late and no fusion).

Data loading runs in a worker beside the model and is not added. A projection, not a run: the
real figure is the job's own ``total_wall_s`` (REPORT.md). Report ratios from one run only.
"""
from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from experiments.profiles import BASELINES, COMPETITOR_STAGE1, PROFILES, STAGE1, STAGE2, Profile


def _train_frames(profile: Profile) -> Tuple[int, int]:
    """(train frames, validation frames) of the profile's dataset (the simulator's split rule)."""
    from opencood_ext.sim.recorder import split_plan
    plan = split_plan(profile.scenarios, profile.split)
    return plan.count("train") * profile.frames, plan.count("validate") * profile.frames


def _simulate(root: Path, profile: Profile, scenarios: int) -> float:
    """Seconds per frame of the simulator writing ``scenarios`` scenes of the profile (cameras on)."""
    from experiments.steps import Command, call
    w, h = profile.camera_size
    t0 = time.perf_counter()
    call(Command("gencomm-sim", ["-o", root, "--scenarios", scenarios, "--frames", profile.frames, "--seed", 0,
                                 "--split_ratio", 1, 1, 1, "--camera_size", f"{w}x{h}"]))
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


def _training(config: Path, data: Path, steps: int, profile: Profile) -> Dict[str, float]:
    from opencood_ext.experiment import build_model, load_experiment
    cfg = load_experiment(config, [f"data.root={data}", *profile.overrides])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    step = _step_seconds(model, _batches(cfg, "train", steps + 1, True), list(model.parameters()))
    train_frames, val_frames = _train_frames(profile)
    per_epoch = min(math.ceil(train_frames / cfg.train.batch_size), cfg.train.max_steps_per_epoch or 10 ** 9)
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
    train_frames, _ = _train_frames(profile)
    epochs = profile.onboard_epochs or cfg.train.epochs
    n = epochs * math.ceil(train_frames / cfg.train.batch_size)
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


def project(profile_name: str = "default", steps: int = 3, frames: int = 3, data: Optional[Path] = None,
            configs: Optional[Path] = None) -> Dict[str, object]:
    """The projection (module docstring) -> {row: value}; minutes per kind of step and the total."""
    from experiments.benchmark import METHODS, stage2_config
    from opencood_ext.config_files import configs_root
    from opencood_ext.eval.robustness import EFFECTS
    profile = PROFILES[profile_name]
    root = Path(configs) if configs else configs_root()
    out: Dict[str, object] = {"profile": profile_name}
    with tempfile.TemporaryDirectory() as tmp:
        if data is None:
            data = Path(tmp) / "data"
            out["simulate_s_per_frame"] = _simulate(data, profile, scenarios=3)
        sim = float(out.get("simulate_s_per_frame", 0.0))
        test_frames = profile.test_scenes * profile.test_frames
        minutes: Dict[str, float] = {"simulation": sim * (profile.scenarios * profile.frames + test_frames) / 60}
        runs: List[Tuple[str, Path]] = [(Path(c).stem, root / c) for _, c, _ in BASELINES]
        runs += [(Path(c).stem, root / c) for t, c in STAGE1.items() if t in ("m1", "m3") or t in profile.benchmark_types]
        runs += [(Path(c).stem, root / c) for t, c in COMPETITOR_STAGE1.items() if t in profile.benchmark_types]
        minutes["training"] = 0.0
        for name, cfg in runs:
            r = _training(cfg, data, steps, profile)
            out[f"train {name}: s/step x steps = min"] = f"{r['step_s']:.2f} x {r['steps']} = {r['seconds'] / 60:.1f}"
            minutes["training"] += r["seconds"] / 60
        onboard = [("gencomm_m1_m3", root / STAGE2)]
        onboard += [(m, stage2_config(profile.family, m, profile.benchmark_types, root)) for _, m in METHODS]
        minutes["onboarding"] = minutes["onboarding, feature cache"] = 0.0
        for name, cfg in onboard:
            r = _onboarding(cfg, data, steps, profile)
            out[f"onboard {name}: s/step (cached) x steps"] = (f"{r['step_s']:.2f} ({r['cached_step_s']:.2f}) x "
                                                              f"{r['steps']}")
            minutes["onboarding"] += r["seconds"] / 60
            minutes["onboarding, feature cache"] += r["cached_seconds"] / 60
        levels = sum(len(e.defaults) for e in EFFECTS.values()) + 1  # + drop's collaborators-off
        lidar_plain, lidar_cached = _evaluation(root / STAGE2, data, frames, profile)
        four = stage2_config(profile.family, "gencomm", profile.benchmark_types, root)
        cam_plain, cam_cached = _evaluation(four, data, frames, profile)
        out["evaluate s/frame: LiDAR pair (cached)"] = f"{lidar_plain:.2f} ({lidar_cached:.2f})"
        out["evaluate s/frame: benchmark alliance (cached)"] = f"{cam_plain:.2f} ({cam_cached:.2f})"
        main_evals = 2 * (len(BASELINES) + 1) + (len(BASELINES) + 1) * levels  # table twice, sweep per level
        alliances = len(profile.benchmark_types)
        bench_evals = (len(METHODS) + 1) * alliances + 1  # methods and late fusion per alliance, no fusion
        minutes["evaluation"] = test_frames * (main_evals * lidar_plain + bench_evals * cam_plain) / 60
        # with the cache every evaluation after the first on the same encoders reads its features
        minutes["evaluation, feature cache"] = test_frames * (
            lidar_plain + (main_evals - 1) * lidar_cached + cam_plain + (bench_evals - 1) * cam_cached) / 60
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
    args = ap.parse_args(argv)
    if args.steps < 1 or args.frames < 1:
        raise ValueError("--steps and --frames must be >= 1")
    return project(args.profile, args.steps, args.frames, args.data, args.configs)
