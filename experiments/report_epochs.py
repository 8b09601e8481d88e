"""REPORT.md's sections on scored onboarding epochs (``gencomm-reproduce --score_epochs``, issue 31
item 3): AP of the full alliance per onboarding epoch and method, the epoch ``best.pth`` holds marked,
and what the camera adds to each method at the selected epoch and at every scored one.

"What the camera adds" is a paired difference within one run: the alliance with a camera type minus
the alliance before it (the dynamic evaluation's step where the camera joins: ``+m2`` is {m1, m2} minus
{m1}), the same weights on the same test frames, with the scene-bootstrap interval of
:func:`~opencood_ext.eval.bootstrap.paired_difference`. When every type after the first camera is a
camera and there are several, the full alliance minus the one before the first camera is given too
("all cameras"). Each training seed is reported on its own (its run folders: :func:`seed_runs`).

Everything is read from the run folders: ``eval_dynamic_epoch_<n>.json`` and the alliances' per-frame
records (:class:`~opencood_ext.run_folder.RunFolder`), ``onboarding.json`` for the selected epoch."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from opencood_ext.eval.bootstrap import PairedDifference, paired_difference
from opencood_ext.eval.records import FrameRecords
from opencood_ext.run_folder import (CheckpointPaths, RunFolder, dynamic_label, epoch_checkpoint, epoch_of_checkpoint,
                                     evaluation_label)

from .evaluation import Alliance
from .profiles import CAMERA_TYPES
from .results import ResultRow, Results
from .tables import diff_cell, table, threshold_index

THRESHOLD = 0.5  # the IoU both sections report
SELECTED = CheckpointPaths(".").best.name  # the column of the selected weights: their file, as a run folder names it


def seed_runs(runs: Path, seed: int) -> Path:
    """Where training seed ``seed``'s run folders are in the main job (:mod:`experiments.reproduce`): ``runs``
    for seed 0, ``runs/seed<s>`` for another (so adding a seed later never resumes seed 0's runs)."""
    return runs if seed == 0 else runs / f"seed{seed}"


@dataclass
class ScoredRun:
    """One onboarding run with scored epochs. epochs: {n: eval_dynamic_epoch_<n>.json's alliances};
    selected: eval_dynamic.json's (the validation-selected weights, None when absent); best_epoch: the
    epoch best.pth holds (onboarding.json; None when it does not say); boot: the row's bootstrap settings."""

    method: str
    run: Path
    epochs: Dict[int, List[Alliance]]
    selected: Optional[List[Alliance]] = None
    best_epoch: Optional[int] = None
    boot: dict = field(default_factory=dict)


def scored_run(method: str, run: Path, boot: Optional[dict] = None) -> Optional[ScoredRun]:
    """The run's scored epochs, or None when it has none."""
    folder = RunFolder(run)
    epochs = {epoch_of_checkpoint(c): [Alliance.from_run_json(e, c) for e in folder.read_evaluation(dynamic_label(c))]
              for c in folder.dynamic_checkpoints() if epoch_of_checkpoint(c) is not None}
    if not epochs:
        return None
    selected = ([Alliance.from_run_json(e) for e in folder.read_evaluation(dynamic_label())]
                if folder.evaluation(dynamic_label()).is_file() else None)
    best = None
    if folder.onboarding_report.is_file():
        try:
            best = json.loads(folder.onboarding_report.read_text()).get("best_epoch")
        except (json.JSONDecodeError, AttributeError):
            raise ValueError(f"{folder.onboarding_report}: not a JSON object with best_epoch") from None
    return ScoredRun(method, Path(run), epochs, selected, best, dict(boot or {}))


def scored_runs_per_seed(rows: Sequence[ResultRow], runs: Path, seeds: Sequence[int]) -> Dict[int, List[ScoredRun]]:
    """{seed: its onboarding runs with scored epochs}: ``rows`` are the first seed's benchmark rows (their run
    folders under the first seed's folder, :func:`seed_runs`), another seed's run is the same folder name
    under its own seed folder. Seeds without any scored run are left out."""
    seeds = list(seeds) or [0]
    base = seed_runs(runs, seeds[0])
    out = {}
    for seed in seeds:
        found = []
        for r in rows:
            if r.table != "heterogeneous" or not r.onboard_method or not r.run:
                continue
            run = Path(r.run)
            if seed != seeds[0]:
                try:
                    run = seed_runs(runs, seed) / run.relative_to(base)
                except ValueError:  # not in the main job's layout: only the first seed's folder is known
                    continue
            scored = scored_run(r.method, run, r.eval.bootstrap) if run.is_dir() else None
            if scored is not None:
                found.append(scored)
        if found:
            out[seed] = found
    return out


def camera_steps(types: Sequence[str]) -> List[Tuple[str, List[str], List[str]]]:
    """(name, alliance, alliance before) of each step where a camera type joins ``types`` (joining order,
    ego first), plus "all cameras" when the types from the first camera on are all cameras and several."""
    types = list(types)
    steps = [(f"+{t}", types[:k + 1], types[:k]) for k, t in enumerate(types) if k > 0 and t in CAMERA_TYPES]
    first = next((k for k, t in enumerate(types) if t in CAMERA_TYPES), None)
    if first and len(types) - first > 1 and all(t in CAMERA_TYPES for t in types[first:]):
        steps.append(("all cameras (" + ", ".join(types[first:]) + ")", types, types[:first]))
    return steps


def camera_difference(s: ScoredRun, alliance: List[str], before: List[str],
                      checkpoint: Optional[str]) -> Optional[PairedDifference]:
    """AP(alliance) - AP(before) of ``s``'s weights ``checkpoint`` (None: the selected ones), paired on the
    same frames; None when either evaluation has no per-frame records. ValueError when not the same frames."""
    folder = RunFolder(s.run)
    paths = [folder.frames(evaluation_label(alliance=t, checkpoint=checkpoint)) for t in (alliance, before)]
    if not all(p.is_file() for p in paths):
        return None
    return paired_difference(*(FrameRecords.load(p) for p in paths), s.boot.get("resamples", 1000),
                             s.boot.get("seed", 0))


def _full_ap(entries: Optional[List[Alliance]]) -> str:
    return entries[-1].eval.cell(f"{THRESHOLD}") if entries else "-"


def _ap(entries: List[Alliance]) -> float:
    return float(entries[-1].eval.ap_at(f"{THRESHOLD}"))


def _seed_title(seed: int, per_seed: dict) -> List[str]:
    return [f"Training seed {seed}:", ""] if len(per_seed) > 1 else []


def ap_per_epoch_lines(per_seed: Dict[int, List[ScoredRun]]) -> List[str]:
    """The "AP per onboarding epoch" section."""
    any_run = next(iter(per_seed.values()))[0]
    types = any_run.epochs[max(any_run.epochs)][-1].types
    lines = ["", "## AP per onboarding epoch", "",
             f"AP@{THRESHOLD} (global order, 95% scene-bootstrap interval) of the full alliance "
             f"{{{', '.join(types)}}} with the weights of every kept onboarding epoch, on the test set "
             "(`gencomm-reproduce --score_epochs`). `*`: the epoch best.pth holds (selected on validation); "
             "the last column is the evaluation of best.pth the tables above use.", ""]
    for seed, scored in per_seed.items():
        epochs = sorted({n for s in scored for n in s.epochs})
        lines += _seed_title(seed, per_seed)
        notes, rows = [], []
        for s in scored:
            cells = [(_full_ap(s.epochs[n]) + (" *" if n == s.best_epoch else "")) if n in s.epochs else "-"
                     for n in epochs]
            rows.append([s.method, *cells, _full_ap(s.selected)])
            top = max(s.epochs, key=lambda n: _ap(s.epochs[n]))
            note = f"{s.method}: highest at epoch {top} ({_ap(s.epochs[top]):.3f})"
            if s.best_epoch == top:
                note += "; best.pth holds that epoch"
            elif s.best_epoch in s.epochs:
                b = _ap(s.epochs[s.best_epoch])
                note += f"; best.pth holds epoch {s.best_epoch} ({b:.3f}, {_ap(s.epochs[top]) - b:.3f} lower)"
            else:
                note += "; onboarding.json does not say which epoch best.pth holds"
            notes.append(note + ".")
        lines += table(["method", *(f"epoch {n}" for n in epochs), SELECTED], rows)
        lines += [""] + [f"- {n}" for n in notes] + [""]
    return lines


def _diff_cell(s: ScoredRun, alliance, before, checkpoint) -> Tuple[str, Optional[Tuple[float, bool]]]:
    """(cell text, (difference, interval excludes 0) or None)."""
    try:
        d = camera_difference(s, alliance, before, checkpoint)
    except ValueError as exc:
        return f"not paired: {exc}", None
    if d is None:
        return "-", None
    k = threshold_index(d.thresholds, f"{THRESHOLD}")
    sig = bool(d.significant("global")[k])
    diff = float(d.diff["global"][k])
    return diff_cell(diff, float(d.lo["global"][k]), float(d.hi["global"][k]), sig), (diff, sig)


def camera_lines(per_seed: Dict[int, List[ScoredRun]]) -> List[str]:
    """The "What the camera adds" section ([] when the alliance has no camera type joining)."""
    any_run = next(iter(per_seed.values()))[0]
    steps = camera_steps(any_run.epochs[max(any_run.epochs)][-1].types)
    if not steps:
        return []
    lines = ["", "## What the camera adds", "",
             f"AP@{THRESHOLD} (global order) of the alliance a camera type joins minus the alliance before it: "
             "the same run and weights on the same test frames, so the 95% interval is paired (whole test scenes "
             "resampled with the same draws for both). At the selected weights (best.pth) and at every scored "
             "onboarding epoch; **bold**: the interval excludes 0.", ""]
    for seed, scored in per_seed.items():
        epochs = sorted({n for s in scored for n in s.epochs})
        lines += _seed_title(seed, per_seed)
        notes, rows = [], []
        for s in scored:
            for name, alliance, before in steps:
                sel_text, sel = _diff_cell(s, alliance, before, None)
                cells = {n: _diff_cell(s, alliance, before, epoch_checkpoint(n)) if n in s.epochs else ("-", None)
                         for n in epochs}
                rows.append([s.method, name, sel_text, *(c[0] for c in cells.values())])
                notes.append(_camera_note(s.method, name, sel, {n: c[1] for n, c in cells.items() if c[1]}))
        lines += table(["method", "camera", SELECTED, *(f"epoch {n}" for n in epochs)], rows)
        lines += [""] + [f"- {n}" for n in notes] + [""]
    return lines


def _camera_note(method: str, step: str, selected: Optional[Tuple[float, bool]],
                 per_epoch: Dict[int, Tuple[float, bool]]) -> str:
    """One sentence from the figures: the selected epoch's difference and how many scored epochs show a
    gain or a loss whose interval excludes 0."""
    head = f"{method}, {step}: "
    head += (f"{selected[0]:+.3f} at best.pth ({'interval excludes 0' if selected[1] else 'interval includes 0'})"
             if selected else "no paired figure at best.pth")
    if not per_epoch:
        return head + "; no scored epoch has paired records."
    gains = [n for n, (d, sig) in per_epoch.items() if sig and d > 0]
    losses = [n for n, (d, sig) in per_epoch.items() if sig and d < 0]
    lo, hi = min(d for d, _ in per_epoch.values()), max(d for d, _ in per_epoch.values())
    text = f"; over {len(per_epoch)} scored epochs {lo:+.3f} to {hi:+.3f}, "
    text += (f"a significant gain at epoch{'s' if len(gains) > 1 else ''} {', '.join(map(str, gains))}"
             if gains else "no significant gain")
    text += (f", a significant loss at epoch{'s' if len(losses) > 1 else ''} {', '.join(map(str, losses))}"
             if losses else "")
    return head + text + "."


def epoch_sections(results: Results, out: Path) -> List[str]:
    """Both sections for the main job's results in ``out`` ([] when no onboarding epoch was scored)."""
    per_seed = scored_runs_per_seed(results.hetero_rows(), Path(out) / "runs", list(results.training_seeds or [0]))
    if not per_seed:
        return []
    return ap_per_epoch_lines(per_seed) + camera_lines(per_seed)
