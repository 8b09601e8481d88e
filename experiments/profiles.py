"""The main job's profiles (dataset size, training budget) and the configs each row trains.

Config names are relative to the configs root the job is given (``--configs``, default the
shipped configs, :func:`opencood_ext.config_files.configs_root`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .method_ids import EARLY, INTERMEDIATE, LATE, NO_FUSION


@dataclass
class Profile:
    """Dataset size and training budget of one reproduction run.

    split: train / validate / test shares of the scenarios; camera_size: (W, H) the simulator
    renders (the camera types resize it anyway); family: the config folder of the benchmark's
    stage-2 configs; benchmark: run the heterogeneous benchmark (step 6; ``--benchmark`` turns it on);
    competitor_stage1: which stage-1 runs the benchmark's competitors start from (:mod:`experiments.benchmark`).

    feature_cache: where onboardings and evaluations keep what frozen encoder stacks compute
    (``--feature_cache`` of gencomm-onboard / -infer / -robustness; None: off). The main job sets
    ``<out>/cache/features`` unless ``--no_feature_cache``.

    frame_interval: seconds between the saved frames of a dataset scenario (the separate test set has
    one frame per scene): 0.1 s frames are nearly identical, 1 s apart the traffic has moved on.

    test_scenes: > 0 evaluates every row on a separate test set of that many scenes of
    ``test_frames`` frames each (:func:`experiments.pipeline.test_set_root`), not on the dataset's own
    test split. Frames of one scene are nearly redundant, so many one-frame scenes narrow a
    scene-bootstrap interval far more than the same number of frames in few scenes (docs/statistics.md).

    score_epochs: the benchmark methods (keys, "all" for every one) whose every kept onboarding epoch is
    also evaluated on the test set (:func:`experiments.benchmark.run_benchmark`; epochs x alliances more
    evaluations per method)."""

    scenarios: int
    frames: int
    split: Tuple[float, float, float] = (0.6, 0.2, 0.2)
    camera_size: Tuple[int, int] = (400, 300)
    overrides: List[str] = field(default_factory=list)
    onboard_epochs: Optional[int] = None
    robustness: Dict[str, str] = field(default_factory=dict)  # sweep levels per effect; {}: the defaults
    family: str = "sim"
    benchmark: bool = True
    seeds: Tuple[int, ...] = (0,)
    benchmark_types: Tuple[str, ...] = ("m1", "m2", "m3", "m4")  # the benchmark's alliance, joining order
    competitor_stage1: str = "own"  # "own": full-feature stage-1 runs (the reference's); "gencomm": GenComm's
    test_scenes: int = 0
    test_frames: int = 1
    feature_cache: Optional[str] = None
    score_epochs: Tuple[str, ...] = ()
    variant_rows: bool = True  # the main table's rows beyond the paper (GenComm's ego-encoder target, issue 49 item 5)
    scene_family: str = "junction"  # gencomm-sim --family of the dataset and the test set (opencood_ext.sim.families)
    frame_interval: float = 0.1     # gencomm-sim --frame_interval of the dataset: seconds between a scenario's frames


PROFILES = {
    # many varied scenes (issue 49 item 2): 400 scenarios of 3 frames 1 s apart (the traffic has moved on
    # between them; 0.1 s apart they were nearly identical), 340 train / 20 validate / 40 test (validating every
    # epoch on 60 frames of 20 scenes costs what the 48 frames of 8 scenes did); the tables use
    # the separate test set (230 one-frame scenes: AP@0.5 half-widths of about 0.03, README); both scene
    # families in turn (junction and same-road), in the dataset and the test set. An epoch is capped at 72
    # optimizer steps (144 samples drawn afresh each epoch), so the configs' 8 epochs stay the 576 steps of the
    # earlier 24-scene default.
    # The LiDAR pair's main table only (issue 51: the first command answers within the hour and a half);
    # --benchmark adds the four-type onboarding study (cameras simulated then). To fit 90 minutes on a
    # 2-core CPU every training and onboarding runs 3 epochs (216 steps; the configs have 8 for stage 1 and
    # baselines, 4 for onboarding), the robustness sweep takes one level per effect besides none, and the row
    # beyond the paper is left out (4 epochs with it would take about 110 min here, by the measured step rates); REPORT.md says how far each
    # model is from its plateau. A budget of K (gencomm-reproduce --budget) is K times these steps.
    "default": Profile(scenarios=400, frames=3, frame_interval=1.0, split=(0.85, 0.05, 0.1), test_scenes=230,
                       scene_family="mixed", overrides=["train.max_steps_per_epoch=72", "train.epochs=3"],
                       robustness={"noise": "0,0.4", "drop": "0,0.5"}, benchmark=False, variant_rows=False),
    "quick": Profile(scenarios=4, frames=3, camera_size=(160, 120), onboard_epochs=1, test_scenes=2,
                     scene_family="mixed", overrides=[  # 2 test scenes: one junction, one road
        "train.epochs=1", "train.max_steps_per_epoch=2", "train.max_val_batches=1", "train.num_workers=0",
        "eval.max_frames=3", "eval.plot_every=1"],
        robustness={"noise": "0,0.6", "latency": "0,3", "drop": "0,1"}),  # no level and the largest
    # one GPU: more and longer scenes, every method, three training seeds (each run's own configs' epochs)
    # (sized from the H200 step times of an earlier session; not yet timed end to end on a GPU)
    "paper": Profile(scenarios=80, frames=6, split=(0.5, 0.1667, 0.3333), test_scenes=400,
                     overrides=["train.num_workers=4"], seeds=(0, 1, 2), scene_family="mixed"),
}

# the default's data at the configs' own budget (8 epochs = 576 steps per training, 4 per onboarding), every
# robustness level and every row: what scripts/fair_benchmark.sh runs (--profile full)
PROFILES["full"] = dataclasses.replace(PROFILES["default"], overrides=["train.max_steps_per_epoch=72"], robustness={},
                                       variant_rows=True)

# the Profile fields that decide what gencomm-sim writes (the dataset and the separate test set)
_DATASET_FIELDS = ("scenarios", "frames", "split", "camera_size", "test_scenes", "test_frames", "scene_family",
                   "frame_interval")


def default_data_dir(name: str) -> Path:
    """Where a profile's data go unless ``--data`` says: ``data/sim`` for every profile that simulates the
    default's dataset (``full`` shares it), else ``data/sim_<name>``."""
    same = all(getattr(PROFILES[name], f) == getattr(PROFILES["default"], f) for f in _DATASET_FIELDS)
    return Path("data/sim" if same else f"data/sim_{name}")


# (method id, display name, config, fusion method used at evaluation)
BASELINES = [
    (NO_FUSION, "No fusion", "sim/m1_none.yaml", "none"),
    (LATE, "Late fusion", "sim/m1m3_late.yaml", "late"),
    (EARLY, "Early fusion", "sim/m1m3_early.yaml", "early"),
    (INTERMEDIATE, "Intermediate (full feature)", "sim/m1m3_intermediate.yaml", "intermediate"),
]
STAGE1 = {t: f"sim/gencomm_stage1_{t}.yaml" for t in ("m1", "m3", "m2", "m4")}
# the competitors' own stage 1 (full-feature intermediate fusion, homogeneous), as the reference runs them
COMPETITOR_STAGE1 = {t: f"sim/baseline_stage1_{t}.yaml" for t in ("m1", "m3", "m2", "m4")}
STAGE2 = "sim/stage2/gencomm_m1_m3.yaml"
# GenComm's onboarding with the ego-encoder target (beyond the paper), the main table's row after GenComm's
STAGE2_EGOTARGET = "sim/stage2/gencomm_egotarget_m1_m3.yaml"
CAMERA_TYPES = ("m2", "m4")  # the LSS types of configs/sim/types: only they need camera images
# The separate test set's simulator seed is the data seed plus this, so none of its scenes repeats a
# scene of the dataset (scenario k's seed is SeedSequence([seed, k]), recorder.scenario_seed).
TEST_SEED_OFFSET = 1_000_000


def trained_types(profile: Profile, benchmark: Optional[bool] = None) -> Tuple[List[str], List[str]]:
    """(types whose GenComm stage 1 one seed of the main job trains, types whose competitors' own stage 1
    it trains), in STAGE1's order. m1 and m3 always (the main table onboards m3 into m1's alliance); the
    benchmark's other types and the competitors' own stage 1 only when the benchmark runs. ``benchmark``
    overrides ``profile.benchmark`` (``--benchmark``). The pipeline and the job's cost projection both ask
    this, so that the projection prices what the job runs."""
    bench = profile.benchmark if benchmark is None else benchmark
    stage1 = [t for t in STAGE1 if t in ("m1", "m3") or (bench and t in profile.benchmark_types)]
    competitors = list(profile.benchmark_types) if bench and profile.competitor_stage1 == "own" else []
    return stage1, competitors


def starts_from_own_stage1(method: str, own_runs: bool) -> bool:
    """Whether onboarding method ``method`` starts from the competitors' own full-feature stage-1 runs
    (``COMPETITOR_STAGE1``) rather than GenComm's: every competitor does when those runs are trained
    (``own_runs``: the profile's ``competitor_stage1 == "own"``), GenComm never. The benchmark and the job's
    cost projection both ask this, so that the projection prices the folders the benchmark trains."""
    return own_runs and method != "gencomm"


def onboarding_folder(method: str, types: Sequence[str], own_stage1: bool = False) -> str:
    """The run folder (under a seed's ``runs/``) of onboarding method ``method`` bringing ``types[1:]`` into
    ``types[0]``'s alliance: ``onboard_<method>_<new types>``, ``_own_stage1`` added for a competitor that starts
    from its own full-feature stage-1 runs. The main table's GenComm row is ``onboarding_folder("gencomm",
    ("m1", "m3"))``, so on the LiDAR pair the benchmark's GenComm onboarding (the same config) finds it
    finished: the job trains it once, and its cost projection counts it once."""
    return f"onboard_{method}_{''.join(types[1:])}{'_own_stage1' if own_stage1 else ''}"


# the main table's GenComm onboarding of m3 into m1's alliance (and, on the LiDAR pair, the benchmark's)
MAIN_ONBOARDING = onboarding_folder("gencomm", ("m1", "m3"))
EGOTARGET_ONBOARDING = onboarding_folder("gencomm_egotarget", ("m1", "m3"))  # the variant row's (profile.variant_rows)
