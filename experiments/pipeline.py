"""The main job's steps for one training seed (:func:`one_seed`) and the step functions it is made
of: simulate, train, evaluate (resumable through a stamp), the robustness sweep. Each step is a
command-line program run in-process (:mod:`experiments.steps`); configs are found under the
configs root the job is given."""
from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from opencood_ext.run_folder import RunFolder, evaluation_label
from opencood_ext.training.runlog import training_wall_time

from .evaluation import Evaluation
from .lanes import LanePlan, enter_lane, side_by_side, train_side_by_side
from .method_ids import GENCOMM, GENCOMM_EGOTARGET
from .profiles import (BASELINES, CAMERA_TYPES, COMPETITOR_STAGE1, STAGE1, STAGE2, STAGE2_EGOTARGET, TEST_SEED_OFFSET,
                       EGOTARGET_ONBOARDING, MAIN_ONBOARDING, Profile, trained_types)
from .results import ResultRow, StepTime
from .run_facts import run_facts
from .steps import Command, cache_flag, call, onboard_command, sets


def found_finished(out: Path, data: Path) -> List[str]:
    """What an invocation could reuse instead of computing it: the dataset, the separate test set and
    the run folders, where they already exist. Empty: the invocation runs from scratch, so its
    ``total_wall_s`` is the main job's whole cost."""
    places = [data, test_set_root(data), out / "runs"]
    return [str(p) for p in places if p.exists() and (not p.is_dir() or any(p.iterdir()))]


def simulate(data: Path, profile: Profile, seed: int) -> None:
    """Write the dataset (scene family ``profile.scene_family``; camera images only when the benchmark
    has a camera type, which adds them to a LiDAR-only recording later, same LiDAR files); the simulator
    skips finished scenarios, so a present dataset costs nothing."""
    w, h = profile.camera_size
    cameras = profile.benchmark and any(t in CAMERA_TYPES for t in profile.benchmark_types)
    call(Command("gencomm-sim", ["-o", data, "--scenarios", profile.scenarios, "--frames", profile.frames,
                                     "--seed", seed, "--split_ratio", *profile.split,
                                     *(["--camera_size", f"{w}x{h}"] if cameras else ["--no_cameras"]),
                                     "--family", profile.scene_family,
                                     *(["--frame_interval", profile.frame_interval] if profile.frame_interval != 0.1
                                       else [])]))


def test_set_root(data: Path) -> Path:
    """Where the separate test set of dataset ``data`` goes: ``<data>_test`` beside it (its only split is test)."""
    return data.with_name(data.name + "_test")


def simulate_test_set(data: Path, profile: Profile, seed: int) -> Optional[Path]:
    """Write the separate test set (``profile.test_scenes`` scenes, all in the test split; camera images
    only when the benchmark has a camera type; scene family ``profile.scene_family``, so a ``mixed``
    profile tests on both families); None when the profile tests on the dataset's own split."""
    if profile.test_scenes <= 0:
        return None
    root = test_set_root(data)
    cameras = profile.benchmark and any(t in CAMERA_TYPES for t in profile.benchmark_types)
    w, h = profile.camera_size
    call(Command("gencomm-sim", ["-o", root, "--scenarios", profile.test_scenes, "--frames", profile.test_frames,
                                     "--seed", seed + TEST_SEED_OFFSET, "--split_ratio", "0", "0", "1",
                                     "--family", profile.scene_family,
                                     *(["--camera_size", f"{w}x{h}"] if cameras else ["--no_cameras"])]))
    return root


def train(config: Path, run: Path, data: Path, profile: Profile) -> float:
    """Train (or resume, or skip when done); returns the run's training wall time (s)."""
    call(Command("gencomm-train", ["-y", config, "--model_dir", run,
                                       *sets([f"data.root={data}", *profile.overrides])]))
    return training_wall_time(run)


def train_in_lane(config: Path, run: Path, data: Path, profile: Profile, threads: int) -> Tuple[str, float]:
    """:func:`train` as a lane of :func:`experiments.lanes.train_side_by_side` does it: in a spawned lane
    process on its share of threads (logging to stderr with the lane's pid), in this process as it is."""
    _enter(threads)
    return run.name, train(config, run, data, profile)


def _enter(threads: int) -> None:
    """In a lane process: its share of threads, and log lines to stderr marked with the lane's pid."""
    if multiprocessing.parent_process() is not None:
        enter_lane(threads)
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO,
                                format=f"%(asctime)s %(levelname)s [lane {os.getpid()}] %(name)s: %(message)s")


def evaluate_run(run: Path, fusion: str, profile: Profile) -> dict:
    """Evaluate ``run`` with ``fusion``. ``gencomm-infer --reuse`` skips it when the evaluation's stamp
    (command, code, the run's files and the test data: :class:`opencood_ext.run_folder.RunFolder`)
    shows nothing changed, the one reuse rule the robustness sweep and the benchmark use too."""
    call(Command("gencomm-infer", ["--model_dir", run, "--fusion_method", fusion, "--reuse",
                                   *cache_flag(profile.feature_cache), *sets(profile.overrides)]))
    return RunFolder(run).read_evaluation(evaluation_label(fusion))


def ego_only(run: Path, fusion: str, res: dict, profile: Profile) -> dict:
    """The same weights with the collaborators switched off (fusion 'none'): a paired measure of
    what cooperation adds that training noise between runs cannot blur."""
    return res if fusion == "none" else evaluate_run(run, "none", profile)


def robustness_sweep(rows: Sequence[ResultRow], out: Path, profile: Profile, seed: int) -> Path:
    """Every method row's run, as evaluated in the table, under pose noise, latency and message loss on
    the same seeded channel (``gencomm-robustness``; reuses the evaluations already in the run
    folders); -> ``out/robustness.json``. On a separate test set of one-frame scenes latency is not swept (its
    only level is 0): a collaborator's data cannot come from an earlier frame of its scene."""
    argv = ["--sweep", "all", "-o", str(out), "--channel_seed", str(seed), *cache_flag(profile.feature_cache)]
    for r in rows:
        argv += ["--runs", f"{r.method}={r.run}:{r.eval.details['fusion']}"]
    levels = dict(profile.robustness)
    if profile.test_scenes > 0 and profile.test_frames == 1:
        levels["latency"] = "0"  # one-frame scenes: no earlier frame to delay a collaborator to
    for effect, value in levels.items():
        argv += [f"--{effect}", value]
    call(Command("gencomm-robustness", argv + sets(profile.overrides)))
    return out / "robustness.json"


def count_trainable(run: Path) -> int:
    """Parameters a run trained: an onboarding run's from its onboarding.json; a run of
    gencomm-train trains every parameter of its model."""
    report = RunFolder(run).onboarding_report
    if report.is_file():
        return int(json.loads(report.read_text())["trainable_params_total"])
    from opencood_ext.experiment import build_model, load_experiment
    model = build_model(load_experiment(RunFolder(run).config))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class Steps:
    """Wall time of each step of this invocation (a step a rerun finds done takes seconds)."""

    def __init__(self):
        self.rows: List[StepTime] = []

    def run(self, name: str, fn, *args, **kw):
        t0 = time.time()
        result = fn(*args, **kw)
        self.rows.append(StepTime(name, time.time() - t0))
        return result

    def call(self, cmd: Command) -> None:
        """Run one program (:func:`call`) as its own timed step, named after what it does."""
        self.run(step_name(cmd), call, cmd)


def step_name(cmd: Command) -> str:
    """"onboard <run folder>" / "evaluate <run folder>" / the program's name: a step's row in the cost table."""
    if cmd.program == "gencomm-onboard":
        return f"onboard {Path(cmd.value('-o')).name}"
    if cmd.program == "gencomm-infer":
        folder = cmd.value("--model_dir") if "--model_dir" in cmd else cmd.value("-o")
        return f"evaluate {Path(folder).name}" + (f" ({cmd.value('--dynamic')})" if "--dynamic" in cmd else "")
    return cmd.program


@dataclasses.dataclass
class SeedResult:
    """One training seed's rows, the main table's GenComm onboarding.json and the GenComm stage-1
    training seconds per type."""

    rows: List[ResultRow]
    onboarding: dict
    stage1_wall_s: Dict[str, float]


def trainings_longest_first(configs: Path, runs: Path, stage1_types: Sequence[str],
                            competitor_types: Sequence[str]) -> List[Tuple[Path, Path]]:
    """(config, run folder) of every training of one seed, the longest kinds first (GenComm's stage 1, the
    full-feature runs, then the single-model baselines), so that side-by-side lanes end close together."""
    stage1 = [STAGE1[t] for t in stage1_types]
    competitors = [COMPETITOR_STAGE1[t] for t in competitor_types]
    full_feature = [c for _, _, c, fusion in BASELINES if fusion == "intermediate"]
    rest = [c for _, _, c, fusion in BASELINES if fusion != "intermediate"]
    return [(configs / c, runs / Path(c).stem) for c in [*stage1, *full_feature, *competitors, *rest]]


def main_onboarding(config: str, onboard_run: Path, stage1: Dict[str, Path], data: Path, profile: Profile,
                    configs: Path) -> Command:
    """The ``gencomm-onboard`` command onboarding m3 into m1's alliance from the stage-1 runs ``stage1`` by
    the stage-2 ``config`` (under ``configs``) into ``onboard_run``, as :func:`onboard_m3_row` runs it."""
    return onboard_command(configs / config, stage1["m1"], [stage1["m3"]], onboard_run,
                           [f"data.root={data}", *profile.overrides], profile.feature_cache, profile.onboard_epochs)


def onboard_in_lane(command: Command, threads: int) -> Tuple[str, float]:
    """One onboarding as a lane of :func:`experiments.lanes.side_by_side` does it (:func:`train_in_lane`
    says how); -> (its run folder's name, seconds)."""
    _enter(threads)
    t0 = time.time()
    call(command)
    return Path(command.value("-o")).name, time.time() - t0


def onboard_m3_row(method_id: str, name: str, config: str, step: str, onboard_run: Path, stage1: Dict[str, Path],
                   data: Path, profile: Profile, evaluation: Profile, steps: Steps, configs: Path,
                   note: str) -> Tuple[ResultRow, dict]:
    """Onboard m3 into m1's alliance from the GenComm stage-1 runs ``stage1`` by the stage-2 ``config``
    (under ``configs``) into ``onboard_run``, evaluate it (and with the collaborators off) with the
    ``evaluation`` profile; -> (the main-table row ``method_id`` / ``name``, its onboarding.json).
    ``step``: the method's name in the cost table's step names."""
    command = main_onboarding(config, onboard_run, stage1, data, profile, configs)
    steps.run(f"onboard m3 ({step})", call, command)
    onboarding = json.loads(RunFolder(onboard_run).onboarding_report.read_text())
    res = steps.run(f"evaluate {onboard_run.name}", evaluate_run, onboard_run, "intermediate", evaluation)
    solo = ego_only(onboard_run, "intermediate", res, evaluation)
    return ResultRow(method_id, name, Evaluation.from_run_json(res, str(onboard_run)),
                     run=str(onboard_run), ego_only=Evaluation.from_run_json(solo, str(onboard_run)),
                     train_wall_s=onboarding["onboarding_wall_time_s"],
                     trainable_params=onboarding["trainable_params_total"], note=note,
                     **run_facts(onboard_run)), onboarding


def one_per_folder(commands: Sequence[Command]) -> List[Command]:
    """The first command for each ``-o`` run folder, in order: the main table and the LiDAR-pair benchmark
    onboard GenComm into the same folder by the same command, and two lanes must never share a folder."""
    seen, out = set(), []
    for c in commands:
        if c.value("-o") not in seen:
            seen.add(c.value("-o"))
            out.append(c)
    return out


def one_seed(out: Path, runs: Path, data: Path, profile: Profile, seed: int, steps: Steps, configs: Path,
             robustness: bool, test_root: Optional[Path] = None, plan: Optional[LanePlan] = None) -> SeedResult:
    """Train and evaluate every row for one training seed into ``runs``, configs from ``configs``;
    evaluations read the test split of ``test_root`` when given (the separate test set), else of ``data``.
    ``plan``: train every run first in side-by-side lanes, then onboard every onboarding likewise
    (:mod:`experiments.lanes`; None or one lane: each run when its row comes)."""
    if seed != 0:  # the configs' own seed is 0
        profile = dataclasses.replace(profile, overrides=[*profile.overrides, f"train.seed={seed}"])
    eval_sets = [] if test_root is None else [f"data.root={test_root}"]
    evaluation = dataclasses.replace(profile, overrides=[*profile.overrides, *eval_sets])  # what evaluations get
    rows: List[ResultRow] = []
    stage1_types, competitor_types = trained_types(profile)
    stage1 = {t: runs / Path(STAGE1[t]).stem for t in stage1_types}  # camera types: for the benchmark only
    competitor = {t: runs / Path(COMPETITOR_STAGE1[t]).stem for t in competitor_types} if competitor_types else None
    bench = dict(family=profile.family, overrides=[f"data.root={data}", *profile.overrides],
                 onboard_epochs=profile.onboard_epochs, types=profile.benchmark_types, competitor_stage1=competitor,
                 configs=configs, feature_cache=profile.feature_cache)
    main_onboardings = [(STAGE2, runs / MAIN_ONBOARDING)] + \
        ([(STAGE2_EGOTARGET, runs / EGOTARGET_ONBOARDING)] if profile.variant_rows else [])
    if plan is not None and plan.lanes > 1:  # every training first, side by side; the steps below find them done
        trainings = trainings_longest_first(configs, runs, stage1_types, competitor_types)
        steps.run(f"train {len(trainings)} runs, {plan.describe()}", train_side_by_side, trainings, data, profile,
                  plan, train_in_lane)
        from .benchmark import onboardings
        commands = [main_onboarding(c, run, stage1, data, profile, configs) for c, run in main_onboardings]
        commands += [o.command for o in onboardings(runs, stage1, **bench)] if profile.benchmark else []
        commands = one_per_folder(commands)
        if len(commands) > 1:  # one onboarding alone (the default job's) runs in this process, on every thread
            lanes = dataclasses.replace(plan, lanes=min(plan.lanes, len(commands)))
            steps.run(f"onboard {len(commands)} runs, {lanes.describe()}", side_by_side, [(c,) for c in commands],
                      lanes, onboard_in_lane, "onboardings")
    for method_id, method, config, fusion in BASELINES:
        run = runs / Path(config).stem
        wall = steps.run(f"train {run.name}", train, configs / config, run, data, profile)
        res = steps.run(f"evaluate {run.name}", evaluate_run, run, fusion, evaluation)
        solo = steps.run(f"evaluate {run.name}, collaborators off", ego_only, run, fusion, res, evaluation)
        rows.append(ResultRow(method_id, method, Evaluation.from_run_json(res, str(run)), run=str(run),
                              train_wall_s=wall, trainable_params=count_trainable(run), note="retrained end to end",
                              ego_only=Evaluation.from_run_json(solo, str(run)), **run_facts(run)))
    wall1 = {t: steps.run(f"train {run.name}", train, configs / STAGE1[t], run, data, profile)
             for t, run in stage1.items()}
    # the benchmark's GenComm run when it onboards m3 alone; then (profile.variant_rows) the variant beyond the
    # paper, onboarded from the same stage-1 runs into its own folder, its row right after the faithful one
    note = f"stage 2 only; stage 1: m1 {wall1['m1']:.0f} s, m3 {wall1['m3']:.0f} s"
    config, run = main_onboardings[0]
    row, onboarding = onboard_m3_row(GENCOMM, "GenComm (m3 onboarded)", config, "GenComm", run, stage1, data, profile,
                                     evaluation, steps, configs, note)
    rows.append(row)
    for config, run in main_onboardings[1:]:
        rows.append(onboard_m3_row(GENCOMM_EGOTARGET, "GenComm, ego-encoder target (beyond the paper)", config,
                                   "GenComm, ego-encoder target", run, stage1, data, profile, evaluation, steps, configs,
                                   note + "; its message extractor also trained to regenerate the sender's scan as m1's "
                                   "encoder reads it")[0])
    if robustness:
        steps.run("robustness sweep", robustness_sweep, rows, out / "robustness", evaluation, seed)
    if profile.benchmark:
        from .benchmark import run_benchmark
        for t, run in (competitor or {}).items():
            steps.run(f"train {run.name}", train, configs / COMPETITOR_STAGE1[t], run, data, profile)
        # each onboarding and evaluation of the benchmark is a step of its own in the cost table
        rows += run_benchmark(runs, stage1, run_cmd=steps.call, eval_overrides=eval_sets,
                              score_epochs=profile.score_epochs, **bench)
    return SeedResult(rows, onboarding, wall1)
