"""Where the learning curves stand while they run: ``gencomm-curves status OUT``.

A budget's job takes many hours on a CPU and is resumed across sessions, so before each resumption one
wants to know, per budget, which of its trainings and onboardings are finished, how many epochs each has
left, and about how many core-hours that is. The runs a budget's job trains are the main job's on the LiDAR
pair (:func:`run_folders`). A run's epochs to do are its run folder's ``config.yaml`` ``train.epochs``, or,
before it started, the same run's at another budget scaled to this one. Its seconds per epoch are the mean
``time_s x threads`` of its own epoch records, else of the same run at another budget (an epoch costs the same
at every budget: the budget scales the epochs, not the epoch). Evaluations are not counted; they take about an
hour per budget here, whatever the budget.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import yaml

from .curves import budget_folders, core_seconds, epoch_records, folder_bytes
from .tables import table as markdown_table


@dataclass
class RunStatus:
    """One run of one budget. epochs_total: None when neither this run nor the same run at another budget
    has a config yet; core_seconds_per_epoch: None without any epoch record of it at any budget."""

    name: str
    kind: str  # "training" or "onboarding"
    epochs_done: int
    epochs_total: Optional[int]
    core_seconds_per_epoch: Optional[float]

    @property
    def finished(self) -> bool:
        return self.epochs_total is not None and self.epochs_done >= self.epochs_total

    @property
    def core_hours_left(self) -> Optional[float]:
        if self.finished:
            return 0.0
        if self.epochs_total is None or self.core_seconds_per_epoch is None:
            return None
        return (self.epochs_total - self.epochs_done) * self.core_seconds_per_epoch / 3600.0


def run_folders(profile_name: str, pair: Sequence[str] = ("m1", "m3")) -> Dict[str, str]:
    """Run folder name -> "training" / "onboarding" for every run a curves budget's job trains: the main
    table's baselines and GenComm stage 1, the competitors' full-feature stage 1, GenComm's m3 onboarding
    (the benchmark's too), the variant row's where the profile has it, and each benchmark method's."""
    from .bench.job_cost import job_plan
    from .benchmark import METHODS
    from .profiles import EGOTARGET_ONBOARDING, MAIN_ONBOARDING, PROFILES, onboarding_folder, starts_from_own_stage1
    profile = dataclasses.replace(PROFILES[profile_name], benchmark=True, benchmark_types=tuple(pair))
    plan = job_plan(profile, robustness=False)
    out = {name: "training" for name, _ in plan.trainings}
    out[MAIN_ONBOARDING] = "onboarding"
    if profile.variant_rows:
        out[EGOTARGET_ONBOARDING] = "onboarding"
    own = profile.competitor_stage1 == "own"
    for _, m in METHODS:
        out[onboarding_folder(m, pair, starts_from_own_stage1(m, own))] = "onboarding"
    return out


def _config_epochs(run: Path) -> Optional[int]:
    from opencood_ext.run_folder import RunFolder
    path = RunFolder(run).config
    if not path.is_file():
        return None
    try:
        return int(((yaml.safe_load(path.read_text()) or {}).get("train") or {})["epochs"])
    except (yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: field 'train.epochs' unreadable ({exc})") from None


def _core_seconds_per_epoch(records: List[dict]) -> Optional[float]:
    timed = [r for r in records if r.get("time_s") is not None]
    return sum(core_seconds(r) for r in timed) / len(timed) if timed else None


def budget_status(out: Path, budget: int, profile_name: str) -> List[RunStatus]:
    """Every run of ``OUT/budget<budget>`` (:func:`run_folders`), with what other budgets' folders under
    ``OUT`` tell about the runs not started yet."""
    others = [(b, folder) for b, folder in budget_folders(out) if b != budget]
    rows = []
    for name, kind in run_folders(profile_name).items():
        run = Path(out) / f"budget{budget}" / "runs" / name
        records = epoch_records(run)
        total, per_epoch = _config_epochs(run), _core_seconds_per_epoch(records)
        for b, folder in others:
            if total is None:
                there = _config_epochs(folder / "runs" / name)
                total = None if there is None else there * budget // b
            if per_epoch is None:
                per_epoch = _core_seconds_per_epoch(epoch_records(folder / "runs" / name))
        rows.append(RunStatus(name, kind, len(records), total, per_epoch))
    return rows


def lanes_wall_hours(rows: Sequence[RunStatus], lanes: int) -> float:
    """Wall-clock hours the measured runs left take in ``lanes`` one-thread lanes (``--jobs``): the trainings,
    then the onboardings (they need the stage-1 runs), each run handed in order to the first free lane, as
    the job's lanes take them (:mod:`experiments.lanes`). One lane: the core-hours left."""
    if lanes < 1:
        raise ValueError(f"--jobs must be a positive whole number, got {lanes}")
    total = 0.0
    for kind in ("training", "onboarding"):
        free = [0.0] * lanes
        for r in rows:
            if r.kind == kind and r.core_hours_left:
                i = free.index(min(free))
                free[i] += r.core_hours_left
        total += max(free)
    return total


def status_markdown(out: Path, budgets: Sequence[int], profile_name: str, jobs: Optional[int] = None) -> str:
    """One table per budget (run, epochs done of total, core-minutes per epoch, core-hours left), each
    budget's total left (with ``jobs``: and the wall-clock hours in that many lanes, :func:`lanes_wall_hours`)
    and what its folder holds on disk."""
    lines = [f"# Learning curves in {out}: trainings and onboardings", "",
             "Core-hours left: remaining epochs x measured core-seconds per epoch (this run's own epochs, else the "
             "same run's at another budget); evaluations not included.", ""]
    for b in budgets:
        rows = budget_status(out, b, profile_name)
        left = [r.core_hours_left for r in rows]
        known = sum(v for v in left if v is not None)
        unknown = sum(1 for v in left if v is None)
        done = sum(r.finished for r in rows)
        folder = Path(out) / f"budget{b}"
        wall = f", about {lanes_wall_hours(rows, jobs):.1f} h in {jobs} lanes" if jobs else ""
        lines += [f"## Budget {b}x: {done} of {len(rows)} runs finished, about {known:.1f} core-hours left{wall}"
                  + (f" (+ {unknown} runs not yet measured)" if unknown else ""), "",
                  f"On disk: run folders {folder_bytes(folder / 'runs') / 1e9:.1f} GB, feature cache "
                  f"{folder_bytes(folder / 'cache') / 1e9:.1f} GB (removed once the budget is scored).", ""]
        lines += markdown_table(["run", "kind", "epochs", "core-min / epoch", "core-hours left"], [
            [r.name, r.kind, f"{r.epochs_done}/{'?' if r.epochs_total is None else r.epochs_total}",
             "-" if r.core_seconds_per_epoch is None else f"{r.core_seconds_per_epoch / 60:.1f}",
             "done" if r.finished else ("?" if r.core_hours_left is None else f"{r.core_hours_left:.2f}")]
            for r in rows])
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
