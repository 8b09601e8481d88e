"""Learning curves: the LiDAR pair's main job at doubling training budgets, until each run's
validation detection loss stops improving (issue 49 item 3).

    python tools/learning_curves.py run    --out OUT [--data DATA] [--seed S] [--max_budget 32]
    python tools/learning_curves.py report OUT [-o ARCHIVE]

``run`` calls the main job (:func:`experiments.reproduce.reproduce`: the main table and the m1 + m3
onboarding benchmark under the configs' protocol, ``equalized`` for the shipped sim configs, no robustness
sweep) with ``--budget K`` for K = 1, 2, 4, ... into ``OUT/budget<K>``, all on one dataset and one
separate test set, and scores each GenComm and full-feature stage-1 run among its own type
(``gencomm-infer --fusion_method intermediate``: what its collaborators' messages carry). It stops after
the first doubling where every run has converged, or at ``--max_budget``. Every step is resumable: a rerun
of the same command goes on where the last one stopped (runs resume from their checkpoints; finished
evaluations are reused).

A point is one run at one budget: its AP@0.3/0.5/0.7 with 95 % scene-bootstrap intervals on the test set,
its recall of the test objects only a collaborator sees, its optimizer steps and training wall time, and its
validation detection loss (the selected epoch's: the lowest over its validated epochs,
``train_log.jsonl``). A run has **converged** at budget K when its validation detection loss at K is
less than 2 % below its loss at K/2 (:data:`CONVERGED_GAIN`). The **ranking** at a budget orders the
main table by AP@0.5; it has settled at the smallest budget from which it no longer changes.

Every row's AP is also given as its difference from the same budget's GenComm onboarding, with a 95 %
interval paired over the same draws of test scenes (:func:`paired_with_gencomm`), so that a ranking's gaps
can be told from noise.

``report`` writes ``curves.json`` (every point, the convergence verdicts, the rankings, each budget's
command, commit, wall time and training core-hours), ``CURVES.md`` (sections: main table, onboarding
benchmark, stage-1 scorings, differences from GenComm, ranking, cost) and ``curves.png`` (AP@0.5,
validation loss and collaborator-only recall against optimizer steps, one line per run).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .method_ids import GENCOMM
from .report_epochs import seed_runs
from .results import Results

CONVERGED_GAIN = 0.02   # under 2 % lower validation detection loss over the last doubling: converged
THRESHOLDS = ("0.3", "0.5", "0.7")
PAIRED_RESAMPLES = 1000  # scene draws of each paired difference from GenComm (compare.py's default)
STAGE1_RUNS = {  # curve key -> run folder name under runs/: every stage-1 model, scored among its own type
    "gencomm_stage1_m1": "gencomm_stage1_m1", "gencomm_stage1_m3": "gencomm_stage1_m3",
    "full_feature_stage1_m1": "baseline_stage1_m1", "full_feature_stage1_m3": "baseline_stage1_m3"}


@dataclass
class CurvePoint:
    """One run at one budget. key: ``<table>/<method_id>`` (main table and benchmark rows) or a
    stage-1 key of :data:`STAGE1_RUNS`; ap / ap_ci: threshold text -> AP / [lo, hi] (global order);
    collaborator_only: [found, total] test objects only a collaborator sees (None: not defined);
    val_detection_loss: the selected epoch's (None: the row trained nothing, e.g. late fusion of the
    stage-1 runs); run: its run folder; minus_gencomm: threshold text -> [AP(this) - AP(GenComm), lo, hi],
    the global-order difference from the same budget's GenComm onboarding (m1 + m3) with its 95 % interval,
    paired over the same scene draws (:data:`PAIRED_RESAMPLES`, seed 0); None for GenComm itself, the stage-1
    scorings, and rows whose per-frame records are not kept."""

    key: str
    label: str
    budget: int
    optimizer_steps: Optional[int]
    train_wall_s: Optional[float]
    ap: Dict[str, Optional[float]]
    ap_ci: Dict[str, Optional[List[float]]]
    collaborator_only: Optional[List[int]]
    val_detection_loss: Optional[float]
    run: Optional[str]
    minus_gencomm: Optional[Dict[str, List[float]]] = None


@dataclass
class Curves:
    """Every point, per key in budget order; verdicts and rankings (:func:`analyse`)."""

    points: List[CurvePoint]
    budgets: List[Dict[str, object]] = field(default_factory=list)  # per budget: budget, command, commit
    converged_at: Dict[str, Optional[int]] = field(default_factory=dict)
    rankings: Dict[int, List[str]] = field(default_factory=dict)
    ranking_settled_at: Optional[int] = None

    def series(self) -> Dict[str, List[CurvePoint]]:
        out: Dict[str, List[CurvePoint]] = {}
        for p in sorted(self.points, key=lambda p: (p.key, p.budget)):
            out.setdefault(p.key, []).append(p)
        return out

    def to_dict(self) -> dict:
        return {"points": [asdict(p) for p in self.points], "budgets": self.budgets,
                "converged_at": self.converged_at, "rankings": {str(k): v for k, v in self.rankings.items()},
                "ranking_settled_at": self.ranking_settled_at, "converged_gain": CONVERGED_GAIN}


def epoch_records(run: Path) -> List[dict]:
    """The epoch records of ``run``'s train_log.jsonl ([] without one); a line that is not JSON raises
    ValueError naming the file and the line."""
    from opencood_ext.run_folder import RunFolder
    log = RunFolder(run).train_log
    if not log.is_file():
        return []
    out = []
    for k, line in enumerate(log.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{log}: line {k + 1} is not JSON ({exc})") from None
        if isinstance(rec, dict) and rec.get("kind") == "epoch":
            out.append(rec)
    return out


def best_val_loss(run: Path) -> Optional[float]:
    """The lowest validation detection loss over the epochs of ``run``'s train_log.jsonl (the one
    best.pth is selected on), None when it has no validated epoch."""
    losses = [float(r["val_detection_loss"]) for r in epoch_records(run) if r.get("val_detection_loss") is not None]
    return min(losses) if losses else None


def _collab(recall: Optional[dict]) -> Optional[List[int]]:
    entry = (recall or {}).get("collaborators_only") or {}
    if entry.get("recall") is None or not entry.get("gt"):
        return None
    return [int(round(entry["recall"] * entry["gt"])), int(entry["gt"])]


def _ap(evaluation) -> Tuple[Dict[str, Optional[float]], Dict[str, Optional[List[float]]]]:
    return ({t: evaluation.ap_at(t) for t in THRESHOLDS}, {t: evaluation.ci_at(t) for t in THRESHOLDS})


def points_of_budget(folder: Path, budget: int) -> List[CurvePoint]:
    """The points of one budget's main job folder: every results row, then each stage-1 run's own
    evaluation (``runs/<stage1>/eval_intermediate.json``) where it was scored."""
    from opencood_ext.run_folder import RunFolder, evaluation_label
    from .evaluation import Evaluation
    res = Results.load(folder / "results.json")
    differences = paired_with_gencomm(res.rows)
    points = []
    for row in res.rows:
        evaluation = row.eval  # a benchmark row's is its whole alliance's, with the recall its alliances lack
        ap, ci = _ap(evaluation)
        run = Path(row.run) if row.run else None
        points.append(CurvePoint(f"{row.table}/{row.method_id}", row.method, budget, row.optimizer_steps,
                                 row.train_wall_s, ap, ci, _collab(evaluation.recall_by_visibility),
                                 best_val_loss(run) if run is not None else None, row.run,
                                 differences.get(f"{row.table}/{row.method_id}")))
    for key, name in STAGE1_RUNS.items():
        run = folder / "runs" / name
        label = evaluation_label("intermediate")
        if not RunFolder(run).evaluation(label).is_file():
            continue
        ev = Evaluation.from_run_json(RunFolder(run).read_evaluation(label), str(run))
        ap, ci = _ap(ev)
        log = best_val_loss(run)
        steps, wall = _train_facts(run)
        points.append(CurvePoint(key, f"{key.replace('_', ' ')} (among its own type)", budget, steps, wall,
                                 ap, ci, _collab(ev.recall_by_visibility), log, str(run)))
    return points


def paired_with_gencomm(rows) -> Dict[str, Dict[str, List[float]]]:
    """``<table>/<method_id>`` -> {threshold: [AP(row) - AP(GenComm), lo, hi]} for every row of one budget
    whose per-frame records are kept, against the main table's GenComm row (its whole m1 + m3 alliance),
    on the same :data:`PAIRED_RESAMPLES` scene draws (seed 0); {} without a GenComm row with records. Rows
    evaluated on other test frames raise ValueError naming both runs."""
    from opencood_ext.eval.bootstrap import paired_difference, scene_draws
    ref_row = next((r for r in rows if r.table == "main" and r.method_id == GENCOMM), None)
    if ref_row is None or not ref_row.eval.has_records(ref_row.run):
        return {}
    ref = ref_row.eval.load_records(ref_row.run)
    draws = scene_draws(ref.num_scenes, PAIRED_RESAMPLES, 0)
    out = {}
    for row in rows:
        if row.run == ref_row.run or not row.eval.has_records(row.run):
            continue
        rec = row.eval.load_records(row.run)
        try:
            diff = paired_difference(rec.aligned_to(ref), ref, PAIRED_RESAMPLES, 0, draws=draws)
        except ValueError as exc:
            raise ValueError(f"{row.run} against GenComm's {ref_row.run}: {exc}") from None
        thr = [str(t) for t in diff.thresholds]
        out[f"{row.table}/{row.method_id}"] = {
            t: [float(diff.diff["global"][k]), float(diff.lo["global"][k]), float(diff.hi["global"][k])]
            for k, t in enumerate(thr) if t in THRESHOLDS}
    return out


def _train_facts(run: Path) -> Tuple[Optional[int], Optional[float]]:
    """(optimizer steps, training seconds) summed over ``run``'s epoch records."""
    records = epoch_records(run)
    steps = sum(int(r.get("steps", 0)) for r in records)
    wall = sum(float(r.get("time_s", 0.0)) for r in records)
    return (steps or None, wall or None)


def analyse(points: Sequence[CurvePoint], budgets: Sequence[Dict[str, object]] = ()) -> Curves:
    """Convergence per key (the first budget whose loss is under 2 % below the previous budget's; None:
    not yet) and the main table's ranking by AP@0.5 per budget, with the budget it settled at."""
    curves = Curves(list(points), list(budgets))
    for key, series in curves.series().items():
        curves.converged_at[key] = converged_budget(
            [(p.budget, p.val_detection_loss) for p in series if p.val_detection_loss is not None])
    main = [p for p in points if p.key.startswith("main/") and p.ap.get("0.5") is not None]
    for b in sorted({p.budget for p in main}):
        at = sorted((p for p in main if p.budget == b), key=lambda p: (-p.ap["0.5"], p.key))
        curves.rankings[b] = [p.key.split("/", 1)[1] for p in at]
    curves.ranking_settled_at = settled_budget(curves.rankings)
    return curves


def converged_budget(losses: Sequence[Tuple[int, float]]) -> Optional[int]:
    """The first budget K whose loss is less than :data:`CONVERGED_GAIN` below the loss at the budget
    before it (the previous doubling), given (budget, loss) pairs; None when every doubling still gained."""
    ordered = sorted(losses)
    for (_, before), (b, now) in zip(ordered, ordered[1:]):
        if now > before * (1.0 - CONVERGED_GAIN):
            return b
    return None


def settled_budget(rankings: Dict[int, List[str]]) -> Optional[int]:
    """The smallest budget from which every later ranking equals it; None with fewer than two budgets."""
    budgets = sorted(rankings)
    if len(budgets) < 2:
        return None
    settled = budgets[-1]
    for b in reversed(budgets[:-1]):
        if rankings[b] != rankings[budgets[-1]]:
            break
        settled = b
    return settled


def collect(out: Path) -> Curves:
    """Every ``OUT/budget<K>`` folder with a results.json, analysed."""
    points, budgets = [], []
    done = [f for f in Path(out).glob("budget*") if (f / "results.json").is_file()]
    for folder in sorted(done, key=_budget_of):
        b = _budget_of(folder)
        res = Results.load(folder / "results.json")
        seed = (res.training_seeds or [0])[0]  # the curves' seed; more seeds may have joined (gencomm-curves seeds)
        budgets.append({"budget": b, "command": res.command, "commit": res.commit, "total_wall_s": res.total_wall_s,
                        "train_core_hours": round(train_core_hours(seed_runs(folder / "runs", seed)), 3)})
        points += points_of_budget(folder, b)
    if not points:
        raise FileNotFoundError(f"{out}: no budget<K>/results.json (run `learning_curves.py run` first)")
    return analyse(points, budgets)


def train_core_hours(runs: Path) -> float:
    """Core-hours of every training and onboarding under ``runs`` (any depth, but not another training seed's
    ``runs/seed<s>``): each epoch record's ``time_s`` (its training and validation) times its ``threads``
    (1 where a record predates them).
    Evaluations are not in it; a budget's ``total_wall_s`` is its job's last invocation's wall time."""
    from opencood_ext.run_folder import RunFolder
    total = 0.0
    for log in sorted(Path(runs).rglob(RunFolder(runs).train_log.name)):  # every run folder's train log
        if re.fullmatch(r"seed\d+", log.relative_to(runs).parts[0]):
            continue  # another training seed's runs
        total += sum(core_seconds(r) for r in epoch_records(log.parent))
    return total / 3600.0


def core_seconds(record: dict) -> float:
    """One epoch record's cost: its ``time_s`` (training and validation) times its ``threads`` (1 where a
    record predates them)."""
    return float(record.get("time_s", 0.0)) * int(record.get("threads") or 1)


def budget_folders(out: Path) -> List[Tuple[int, Path]]:
    """(K, ``OUT/budget<K>``) for every budget folder under ``out``, K ascending; other names are left out."""
    found = [(f.name[len("budget"):], f) for f in Path(out).glob("budget*") if f.is_dir()]
    return sorted((int(k), f) for k, f in found if k.isdigit())


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under ``folder`` (0 when it is missing)."""
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def _budget_of(folder: Path) -> int:
    try:
        return int(folder.name[len("budget"):])
    except ValueError:
        raise ValueError(f"{folder}: a budget folder is named budget<K>, K a whole number") from None
