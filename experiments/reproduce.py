"""The whole story on the embedded default, end to end:

1. simulate the default dataset when it is missing (built-in world, OPV2V-H format);
2. train the baselines (no / late / early / full-feature intermediate fusion,
   the latter three retrained with both types) and GenComm stage 1 for m1
   (PointPillars, 64-beam) and m3 (SECOND, 32-beam);
3. onboard m3 into m1's alliance (stage 2: only m3's message extractor trains);
4. evaluate everything on the test split with an m1 ego and m3 collaborators,
   and again with the same weights and the collaborators off (what cooperation
   adds, paired);
5. sweep every row under pose noise, latency and message loss on one seeded
   channel (``robustness/``);
6. the heterogeneous benchmark (:mod:`gencomm.benchmark`): GenComm stage 1 also
   for the camera types m2 and m4, then m2, m3, m4 join m1's alliance by every
   method (GenComm, BackAlign, STAMP, MPDA, CodeFilling), evaluated as the
   alliance grows, with No fusion and Late fusion built from GenComm's stage-1
   runs. The competitors start from their own full-feature stage-1 runs
   (``configs/sim/baseline_stage1_<t>.yaml``) unless ``competitor_stage1`` is
   "gencomm";
7. write ``REPORT.md`` (tables with 95% intervals, paired differences, plots)
   and ``results.json``.

Every step is resumable: a finished run is skipped, an interrupted one
continues from its last checkpoint, and an evaluation is skipped when its
command, the code (its Python sources) and every file it reads (the
run's config and checkpoints, the test split) are as its
``eval_<label>.inputs.json`` stamp records them. ``quick=True`` shrinks data and training
to a smoke run that exercises every step in minutes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from opencood_ext.runs import run_files
from opencood_ext.training.runlog import training_wall_time

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger(__name__)


@dataclass
class Profile:
    """Dataset size and training budget of one reproduction run.

    split: train / validate / test shares of the scenarios; camera_size: (W, H) the simulator
    renders (the camera types resize it anyway); family: the config folder of the benchmark's
    stage-2 configs; benchmark: run the heterogeneous benchmark (step 6); competitor_stage1:
    which stage-1 runs the benchmark's competitors start from (:mod:`gencomm.benchmark`).

    test_scenes: > 0 evaluates every row on a separate test set of that many scenes of
    ``test_frames`` frames each (:func:`test_set_root`), not on the dataset's own test split. Frames
    of one scene are nearly redundant, so many one-frame scenes narrow a scene-bootstrap interval
    far more than the same number of frames in few scenes (docs/statistics.md)."""

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


PROFILES = {
    # many short scenarios: 24 train / 8 validate scenes (16 test scenes the tables no longer use); frames of
    # one scene are 0.1 s apart and nearly identical, so scene count, not frame count, is what narrows the
    # test AP's interval: 230 one-frame test scenes give AP@0.5 half-widths of about 0.03 (README)
    "default": Profile(scenarios=48, frames=6, split=(0.5, 0.1667, 0.3333), test_scenes=230),
    "quick": Profile(scenarios=4, frames=3, camera_size=(160, 120), onboard_epochs=1, test_scenes=2, overrides=[
        "train.epochs=1", "train.max_steps_per_epoch=2", "train.max_val_batches=1", "train.num_workers=0",
        "eval.max_frames=3", "eval.plot_every=1"],
        robustness={"noise": "0,0.6", "latency": "0,3", "drop": "0,1"}),  # no level and the largest
    # one GPU: more and longer scenes, every method, three training seeds (each run's own configs' epochs)
    # (sized from the H200 step times of an earlier session; not yet timed end to end on a GPU)
    "paper": Profile(scenarios=80, frames=6, split=(0.5, 0.1667, 0.3333), test_scenes=400,
                     overrides=["train.num_workers=4"], seeds=(0, 1, 2)),
}

# (method, config, fusion method used at evaluation)
BASELINES = [
    ("No fusion", "configs/sim/m1_none.yaml", "none"),
    ("Late fusion", "configs/sim/m1m3_late.yaml", "late"),
    ("Early fusion", "configs/sim/m1m3_early.yaml", "early"),
    ("Intermediate (full feature)", "configs/sim/m1m3_intermediate.yaml", "intermediate"),
]
STAGE1 = {t: f"configs/sim/gencomm_stage1_{t}.yaml" for t in ("m1", "m3", "m2", "m4")}
# the competitors' own stage 1 (full-feature intermediate fusion, homogeneous), as the reference runs them
COMPETITOR_STAGE1 = {t: f"configs/sim/baseline_stage1_{t}.yaml" for t in ("m1", "m3", "m2", "m4")}
STAGE2 = "configs/sim/stage2/gencomm_m1_m3.yaml"
CAMERA_TYPES = ("m2", "m4")  # the LSS types of configs/sim/types: only they need camera images
# The separate test set's simulator seed is the data seed plus this, so none of its scenes repeats a
# scene of the dataset (scenario k's seed is SeedSequence([seed, k]), recorder.scenario_seed).
TEST_SEED_OFFSET = 1_000_000


def _data_root(cmd: Sequence[str]) -> Optional[Path]:
    """The data a command reads: its last ``--set data.root=...`` (later overrides win); with a
    ``test`` split folder, only that split (evaluations read nothing else)."""
    roots = [a.split("=", 1)[1] for a in cmd if a.startswith("data.root=")]
    if not roots:
        return None
    root = Path(roots[-1])
    return root / "test" if (root / "test").is_dir() else root


def _listing(paths: Sequence[Path]) -> Tuple[str, int]:
    """(sha256 over path, size and mtime of every file under ``paths``, number of files); a missing
    path counts as an entry of its own, so its later appearance changes the digest."""
    h, n = hashlib.sha256(), 0
    for top in paths:
        top = Path(top)
        if top.is_dir():
            files = sorted(f for f in top.rglob("*") if f.is_file())
        else:
            files = [top] if top.is_file() else []
        if not files:
            h.update(f"missing {top}\n".encode())
        for f in files:
            st = f.stat()
            h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            n += 1
    return h.hexdigest(), n


def _code_digest() -> str:
    """sha256 over the Python sources a step runs (``opencood_ext/``, ``gencomm/``, ``tools/``): any
    edit there redoes the stamped steps, a change elsewhere (docs, tests) does not."""
    h = hashlib.sha256()
    for f in sorted(p for d in ("opencood_ext", "gencomm", "tools") for p in (ROOT / d).rglob("*.py")):
        h.update(f"{f.relative_to(ROOT)}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _inputs(cmd: Sequence[str], reads: Sequence[Path]) -> Optional[dict]:
    """What a step's result depends on: the command, the code, and every file it reads (the runs in
    ``reads`` and the data of its ``data.root``); None when the command names no data root."""
    data = _data_root(cmd)
    if data is None:
        return None
    digest, n = _listing([*reads, data])
    return {"command": list(cmd), "code": _code_digest(), "files": digest, "num_files": n}


def _run(cmd: List[str], stamp: Optional[Path] = None, reads: Sequence[Path] = (),
         makes: Sequence[Path] = ()) -> None:
    """Run one step. With ``stamp``: skipped when ``stamp`` records the same command, code and
    inputs (size and mtime of every file under ``reads`` and the command's data root) and every
    output in ``makes`` exists; after a run the stamp is (re)written. Evaluations pass one, so a
    resumed main job does not redo them; training steps need none (a finished run is skipped by
    ``tools/train.py`` itself)."""
    want = _inputs(cmd, reads) if stamp is not None else None
    if want is not None and stamp.is_file() and all(Path(m).is_file() for m in makes):
        try:
            done = json.loads(stamp.read_text())
        except (OSError, ValueError):
            done = None
        if done == want:
            log.info("skip (done; command, code and inputs unchanged since %s): %s", stamp, " ".join(cmd))
            return
    log.info("$ %s", " ".join(cmd))
    if want is not None:
        stamp.unlink(missing_ok=True)  # an interrupted rerun must not leave the old stamp on new outputs
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"step failed (exit {proc.returncode}): {' '.join(cmd)}")
    if want is not None:
        tmp = stamp.with_name(stamp.name + ".tmp")
        tmp.write_text(json.dumps(want, indent=1))
        os.replace(tmp, stamp)


def _sets(items: List[str]) -> List[str]:
    return [a for item in items for a in ("--set", item)]


def found_finished(out: Path, data: Path) -> List[str]:
    """What an invocation could reuse instead of computing it: the dataset, the separate test set and
    the run folders, where they already exist. Empty: the invocation runs from scratch, so its
    ``total_wall_s`` is the main job's whole cost."""
    places = [data, test_set_root(data), out / "runs"]
    return [str(p) for p in places if p.exists() and (not p.is_dir() or any(p.iterdir()))]


def simulate(data: Path, profile: Profile, seed: int) -> None:
    """Write the dataset; the simulator skips finished scenarios, so a present dataset costs nothing."""
    w, h = profile.camera_size
    _run([sys.executable, "tools/simulate.py", "-o", str(data), "--scenarios", str(profile.scenarios),
          "--frames", str(profile.frames), "--seed", str(seed), "--split-ratio", *map(str, profile.split),
          "--camera-size", f"{w}x{h}"])


def test_set_root(data: Path) -> Path:
    """Where the separate test set of dataset ``data`` goes: ``<data>_test`` beside it (its only split is test)."""
    return data.with_name(data.name + "_test")


def simulate_test_set(data: Path, profile: Profile, seed: int) -> Optional[Path]:
    """Write the separate test set (``profile.test_scenes`` scenes, all in the test split; camera images
    only when the benchmark has a camera type); None when the profile tests on the dataset's own split."""
    if profile.test_scenes <= 0:
        return None
    root = test_set_root(data)
    cameras = profile.benchmark and any(t in CAMERA_TYPES for t in profile.benchmark_types)
    w, h = profile.camera_size
    _run([sys.executable, "tools/simulate.py", "-o", str(root), "--scenarios", str(profile.test_scenes),
          "--frames", str(profile.test_frames), "--seed", str(seed + TEST_SEED_OFFSET), "--split-ratio", "0", "0",
          "1", *(["--camera-size", f"{w}x{h}"] if cameras else ["--no-cameras"])])
    return root


def train(config: str, run: Path, data: Path, profile: Profile) -> float:
    """Train (or resume, or skip when done); returns the run's training wall time (s)."""
    _run([sys.executable, "tools/train.py", "-y", config, "--model_dir", str(run),
          *_sets([f"data.root={data}", *profile.overrides])])
    return training_wall_time(run)


def evaluate_run(run: Path, fusion: str, profile: Profile) -> dict:
    """Evaluate ``run`` with ``fusion`` (skipped when a resumed job finds it done, see :func:`_run`)."""
    name = f"eval_{'none' if fusion == 'no' else fusion}"
    _run([sys.executable, "tools/inference.py", "--model_dir", str(run), "--fusion_method", fusion,
          *_sets(profile.overrides)], stamp=run / f"{name}.inputs.json", reads=run_files(run),
         makes=[run / f"{name}.json"])
    return json.loads((run / f"{name}.json").read_text())


def ego_only(run: Path, fusion: str, res: dict, profile: Profile) -> dict:
    """The same weights with the collaborators switched off (fusion 'none'): a paired measure of
    what cooperation adds that training noise between runs cannot blur."""
    return res if fusion == "none" else evaluate_run(run, "none", profile)


def robustness_sweep(rows: List[Dict], out: Path, profile: Profile, seed: int) -> Path:
    """Every method row's run, as evaluated in the table, under pose noise, latency and message loss on
    the same seeded channel (``tools/robustness.py``; reuses the evaluations already in the run
    folders); -> ``out/robustness.json``."""
    cmd = [sys.executable, "tools/robustness.py", "--sweep", "all", "-o", str(out), "--channel_seed", str(seed)]
    for r in rows:
        cmd += ["--runs", f"{r['method']}={r['run']}:{r['eval']['fusion']}"]
    for effect, levels in profile.robustness.items():
        cmd += [f"--{effect}", levels]
    _run(cmd + _sets(profile.overrides))
    return out / "robustness.json"


def count_trainable(run: Path) -> int:
    """Parameters a run trained: an onboarding run's from its onboarding.json; a run of
    tools/train.py trains every parameter of its model."""
    report = run / "onboarding.json"
    if report.is_file():
        return int(json.loads(report.read_text())["trainable_params_total"])
    from opencood_ext.experiment import build_model, load_experiment
    model = build_model(load_experiment(run / "config.yaml"))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class Steps:
    """Wall time of each step of this invocation (a step a rerun finds done takes seconds)."""

    def __init__(self):
        self.rows: List[Dict] = []

    def run(self, name: str, fn, *args, **kw):
        t0 = time.time()
        result = fn(*args, **kw)
        self.rows.append({"step": name, "seconds": time.time() - t0})
        return result


def _one_seed(out: Path, runs: Path, data: Path, profile: Profile, seed: int, steps: Steps,
              robustness: bool, test_root: Optional[Path] = None) -> Dict:
    """Train and evaluate every row for one training seed into ``runs``; evaluations read the test
    split of ``test_root`` when given (the separate test set), else of ``data``."""
    if seed != 0:  # the configs' own seed is 0
        profile = dataclasses.replace(profile, overrides=[*profile.overrides, f"train.seed={seed}"])
    eval_sets = [] if test_root is None else [f"data.root={test_root}"]
    evaluation = dataclasses.replace(profile, overrides=[*profile.overrides, *eval_sets])  # what evaluations get
    rows: List[Dict] = []
    for method, config, fusion in BASELINES:
        run = runs / Path(config).stem
        wall = steps.run(f"train {run.name}", train, config, run, data, profile)
        res = steps.run(f"evaluate {run.name}", evaluate_run, run, fusion, evaluation)
        rows.append({"method": method, "run": str(run), "eval": res, "train_wall_s": wall,
                     "trainable_params": count_trainable(run), "note": "retrained end to end",
                     "ego_only": steps.run(f"evaluate {run.name}, collaborators off", ego_only, run, fusion, res,
                                           evaluation)})
    stage1 = {}
    for t, config in STAGE1.items():
        if t not in ("m1", "m3") and not (profile.benchmark and t in profile.benchmark_types):
            continue  # the camera types serve the heterogeneous benchmark only
        run = runs / Path(config).stem
        stage1[t] = {"run": run, "wall": steps.run(f"train {run.name}", train, config, run, data, profile)}
    onboard_run = runs / "onboard_gencomm_m3"  # the benchmark's GenComm run when it onboards m3 alone
    cmd = [sys.executable, "tools/onboard.py", "-y", STAGE2, "--ego", str(stage1["m1"]["run"]),
           "--new", str(stage1["m3"]["run"]), "-o", str(onboard_run), *_sets([f"data.root={data}", *profile.overrides])]
    if profile.onboard_epochs is not None:
        cmd += ["--epochs", str(profile.onboard_epochs)]
    steps.run("onboard m3 (GenComm)", _run, cmd)
    onboarding = json.loads((onboard_run / "onboarding.json").read_text())
    res = steps.run("evaluate onboard_gencomm_m3", evaluate_run, onboard_run, "intermediate", evaluation)
    rows.append({"method": "GenComm (m3 onboarded)", "run": str(onboard_run), "eval": res,
                 "ego_only": ego_only(onboard_run, "intermediate", res, evaluation),
                 "train_wall_s": onboarding["onboarding_wall_time_s"],
                 "trainable_params": onboarding["trainable_params_total"],
                 "note": f"stage 2 only; stage 1: m1 {stage1['m1']['wall']:.0f} s, m3 {stage1['m3']['wall']:.0f} s"})
    if robustness:
        steps.run("robustness sweep", robustness_sweep, rows, out / "robustness", evaluation, seed)
    for r in rows:
        r["table"] = "main"
    if profile.benchmark:
        from .benchmark import run_benchmark
        competitor = None
        if profile.competitor_stage1 == "own":
            competitor = {}
            for t in profile.benchmark_types:
                run = runs / Path(COMPETITOR_STAGE1[t]).stem
                steps.run(f"train {run.name}", train, COMPETITOR_STAGE1[t], run, data, profile)
                competitor[t] = run
        rows += steps.run("heterogeneous benchmark", run_benchmark, runs, {t: v["run"] for t, v in stage1.items()},
                          profile.family, _run, sys.executable, [f"data.root={data}", *profile.overrides],
                          onboard_epochs=profile.onboard_epochs, types=profile.benchmark_types,
                          competitor_stage1=competitor, eval_overrides=eval_sets)
    return {"rows": rows, "onboarding": onboarding, "stage1_wall_s": {t: v["wall"] for t, v in stage1.items()}}


def seed_archives(out: Path, profile_name: str, data_seed: int, like: Optional[Path] = None) -> List[Path]:
    """The seed archives in ``out/seeds`` of this experiment (same profile and data seed and, when
    ``like`` names an archive, the same test frames as it), by seed; archives of another experiment
    (e.g. evaluated on an earlier test split) are left out with a warning."""
    from .seeds import load_archive
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
              seeds: Optional[Sequence[int]] = None, benchmark: bool = True, robustness: bool = True,
              benchmark_types: Optional[Sequence[str]] = None, competitor_stage1: Optional[str] = None,
              test_scenes: Optional[int] = None) -> Path:
    """The main job (module docstring). ``seed``: the data and channel seed; ``seeds``: training seeds
    (default: the profile's); every row is trained once per training seed (seed 0's runs in ``runs``,
    another seed's in ``runs/seed<s>``), the report shows the first seed's rows and the spread across seeds.
    Every seed leaves an archive in ``out/seeds/seed<s>`` (:mod:`gencomm.seeds`); the spread covers every
    archive there of this profile and data seed, so a seed added by a later invocation joins it.
    ``robustness``: sweep the first seed's rows (step 5). ``test_scenes``: size of the separate test set
    (None: the profile's; 0: the dataset's own test split)."""
    profile = PROFILES[profile_name]
    if not benchmark:
        profile = dataclasses.replace(profile, benchmark=False)
    if benchmark_types is not None:
        profile = dataclasses.replace(profile, benchmark_types=tuple(benchmark_types))
    if competitor_stage1 is not None:
        if competitor_stage1 not in ("own", "gencomm"):
            raise ValueError(f"competitor_stage1 must be 'own' or 'gencomm', got {competitor_stage1!r}")
        profile = dataclasses.replace(profile, competitor_stage1=competitor_stage1)
    if test_scenes is not None:
        if test_scenes < 0:
            raise ValueError(f"test_scenes must be >= 0, got {test_scenes}")
        profile = dataclasses.replace(profile, test_scenes=test_scenes)
    seeds = list(seeds if seeds is not None else profile.seeds)
    out.mkdir(parents=True, exist_ok=True)
    runs = out / "runs"
    reused = found_finished(out, data)
    started = time.time()
    steps = Steps()
    steps.run("simulate", simulate, data, profile, seed)
    test_root = steps.run("simulate the test set", simulate_test_set, data, profile, seed)
    per_seed = {}
    from .seeds import archive_seed, git_commit, load_archives, spread_json
    commit = git_commit(ROOT)
    for k, s in enumerate(seeds):
        # seed 0's runs in runs/, another seed's in runs/seed<s> (so adding a seed later never resumes seed 0's)
        per_seed[s] = _one_seed(out, runs if s == 0 else runs / f"seed{s}", data, profile, s, steps,
                                robustness=robustness and k == 0, test_root=test_root)
        archive_seed(per_seed[s]["rows"], s, out / "seeds",  # it keeps the main table's rows
                     {"profile": profile_name, "data_seed": seed, "commit": commit,
                      "command": " ".join(["tools/reproduce.py", *sys.argv[1:]])})
    first = per_seed[seeds[0]]
    results = {"profile": profile_name, "seed": seed, "training_seeds": seeds, "data": str(data),
               "test_data": str(test_root or data),
               "commit": commit,
               "rows": first["rows"], "onboarding": first["onboarding"], "stage1_wall_s": first["stage1_wall_s"],
               "steps": steps.rows, "total_wall_s": time.time() - started,
               "from_scratch": not reused, "found_finished": reused}
    # this invocation's seeds and earlier ones evaluated on the same test frames
    archives = seed_archives(out, profile_name, seed, like=out / "seeds" / f"seed{seeds[0]}")
    results["seed_archives"] = [str(a) for a in archives]
    if len(archives) > 1:
        results["seed_spread"] = spread_json(load_archives(archives))
    (out / "results.json").write_text(json.dumps(results, indent=2))
    from .report import write_report
    return write_report(results, out)
