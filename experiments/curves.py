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

``report`` writes ``curves.json`` (every point, the convergence verdicts, the rankings, each budget's
command, commit, wall time and training core-hours), ``CURVES.md`` and ``curves.png`` (AP@0.5, validation loss and collaborator-only
recall against optimizer steps, one line per run).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .method_ids import GENCOMM
from .results import Results
from .tables import table as markdown_table

CONVERGED_GAIN = 0.02   # under 2 % lower validation detection loss over the last doubling: converged
THRESHOLDS = ("0.3", "0.5", "0.7")
STAGE1_RUNS = {  # curve key -> run folder name under runs/: every stage-1 model, scored among its own type
    "gencomm_stage1_m1": "gencomm_stage1_m1", "gencomm_stage1_m3": "gencomm_stage1_m3",
    "full_feature_stage1_m1": "baseline_stage1_m1", "full_feature_stage1_m3": "baseline_stage1_m3"}


@dataclass
class CurvePoint:
    """One run at one budget. key: ``<table>/<method_id>`` (main table and benchmark rows) or a
    stage-1 key of :data:`STAGE1_RUNS`; ap / ap_ci: threshold text -> AP / [lo, hi] (global order);
    collaborator_only: [found, total] test objects only a collaborator sees (None: not defined);
    val_detection_loss: the selected epoch's (None: the row trained nothing, e.g. late fusion of the
    stage-1 runs); run: its run folder."""

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
    points = []
    for row in res.rows:
        evaluation = row.alliances[-1].eval if row.alliances else row.eval  # a benchmark row: its whole alliance
        ap, ci = _ap(evaluation)
        run = Path(row.run) if row.run else None
        points.append(CurvePoint(f"{row.table}/{row.method_id}", row.method, budget, row.optimizer_steps,
                                 row.train_wall_s, ap, ci, _collab(evaluation.recall_by_visibility),
                                 best_val_loss(run) if run is not None else None, row.run))
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
        budgets.append({"budget": b, "command": res.command, "commit": res.commit, "total_wall_s": res.total_wall_s,
                        "train_core_hours": round(train_core_hours(folder / "runs"), 3)})
        points += points_of_budget(folder, b)
    if not points:
        raise FileNotFoundError(f"{out}: no budget<K>/results.json (run `learning_curves.py run` first)")
    return analyse(points, budgets)


def train_core_hours(runs: Path) -> float:
    """Core-hours of every training and onboarding under ``runs`` (any depth): each epoch record's
    ``time_s`` (its training and validation) times its ``threads`` (1 where a record predates them).
    Evaluations are not in it; a budget's ``total_wall_s`` covers the whole job."""
    from opencood_ext.run_folder import RunFolder
    total = 0.0
    for log in sorted(Path(runs).rglob(RunFolder(runs).train_log.name)):  # every run folder's train log
        total += sum(float(r.get("time_s", 0.0)) * int(r.get("threads") or 1) for r in epoch_records(log.parent))
    return total / 3600.0


def _budget_of(folder: Path) -> int:
    try:
        return int(folder.name[len("budget"):])
    except ValueError:
        raise ValueError(f"{folder}: a budget folder is named budget<K>, K a whole number") from None


def markdown(curves: Curves) -> str:
    """CURVES.md: per run, AP@0.5 / AP@0.7 / collaborator-only recall / validation loss at each budget,
    the convergence verdicts and the rankings."""
    budgets = sorted({p.budget for p in curves.points})
    lines = ["# Learning curves", "", f"Budgets (multiples of the configs' epochs): {', '.join(map(str, budgets))}. "
             f"A run has converged at the first budget whose validation detection loss is less than "
             f"{CONVERGED_GAIN:.0%} below the previous budget's.", ""]
    rows = []
    for key, series in curves.series().items():
        by = {p.budget: p for p in series}
        cells = []
        for b in budgets:
            p = by.get(b)
            cells.append("-" if p is None else _point_cell(p))
        verdict = curves.converged_at.get(key)
        rows.append([series[0].label, *cells, "not yet" if verdict is None else f"{verdict}x"])
    lines += markdown_table(["run", *[f"{b}x: AP@0.5 / AP@0.7 / collab.-only / val loss" for b in budgets],
                             "converged at"], rows)
    lines += ["", "Main-table ranking by AP@0.5 (best first):", ""]
    lines += markdown_table(["budget", "ranking"], [[f"{b}x", " > ".join(r)] for b, r in sorted(curves.rankings.items())])
    settled = curves.ranking_settled_at
    lines += ["", "The ranking " + (f"no longer changes from {settled}x on." if settled is not None else
                                    "has not been measured at two budgets yet.")]
    if curves.budgets:
        lines += ["", "What each budget's job took (core-hours: every training's and onboarding's epochs, time x "
                      "threads; the job's wall time adds simulation and evaluations):", ""]
        walls = [None if b.get("total_wall_s") is None else b["total_wall_s"] / 3600.0 for b in curves.budgets]
        spent = [b.get("train_core_hours") for b in curves.budgets]
        cost = [[f"{b['budget']}x", str(b.get("commit") or "-"), _hours(w), _hours(c)]
                for b, w, c in zip(curves.budgets, walls, spent)]
        if len(cost) > 1:
            cost.append(["all", "", *(_hours(sum(v) if None not in v else None) for v in (walls, spent))])
        lines += markdown_table(["budget", "commit", "job wall (h)", "training core-hours"], cost)
    return "\n".join(lines).rstrip() + "\n"


def _hours(hours: Optional[float]) -> str:
    return "-" if hours is None else f"{hours:.2f}"


def _point_cell(p: CurvePoint) -> str:
    ap5, ap7 = p.ap.get("0.5"), p.ap.get("0.7")
    collab = "-" if p.collaborator_only is None else f"{p.collaborator_only[0]}/{p.collaborator_only[1]}"
    loss = "-" if p.val_detection_loss is None else f"{p.val_detection_loss:.3f}"
    fmt = (lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}")
    return f"{fmt(ap5)} / {fmt(ap7)} / {collab} / {loss}"


def plot(curves: Curves, path: Path) -> Path:
    """curves.png: AP@0.5, validation detection loss and collaborator-only recall against optimizer
    steps (log2 axis), one line per run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    for key, series in curves.series().items():
        pts = [p for p in series if p.optimizer_steps]
        if not pts:
            continue
        x = [p.optimizer_steps for p in pts]
        style = dict(marker="o", lw=2.2 if GENCOMM in key else 1.2, label=series[0].label)
        axes[0].plot(x, [p.ap.get("0.5") for p in pts], **style)
        losses = [(s, p.val_detection_loss) for s, p in zip(x, pts) if p.val_detection_loss is not None]
        if losses:
            axes[1].plot(*zip(*losses), **style)
        recall = [(s, p.collaborator_only[0] / p.collaborator_only[1]) for s, p in zip(x, pts) if p.collaborator_only]
        if recall:
            axes[2].plot(*zip(*recall), **style)
    for ax, title in zip(axes, ("AP@0.5 (test)", "validation detection loss (selected epoch)",
                                "recall@0.5 of collaborator-only objects")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("optimizer steps")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(curves: Curves, folder: Path) -> List[Path]:
    """curves.json, CURVES.md and curves.png into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "curves.json"
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(curves.to_dict(), indent=2))
    tmp.replace(out)
    md = folder / "CURVES.md"
    md.write_text(markdown(curves))
    return [out, md, plot(curves, folder / "curves.png")]
