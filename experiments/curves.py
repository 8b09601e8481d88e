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
        evaluation = row.eval  # a benchmark row's is its whole alliance's, with the recall its alliances lack
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
    Evaluations are not in it; a budget's ``total_wall_s`` is its job's last invocation's wall time."""
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


GROUPS = (  # (key prefix or stage-1 keys, CURVES.md section title, plot marker, plot line style)
    ("main/", "Main table: the m1 + m3 alliance, each method trained its own way", "o", "-"),
    ("heterogeneous/", "Onboarding benchmark: m3 onboarded into m1's alliance (AP and recall of the whole "
                       "alliance)", "s", "--"),
    ("stage1", "Stage-1 models, each scored among its own type (what its collaborators' messages carry)", "^", ":"),
)


def group_of(key: str) -> int:
    """The index in :data:`GROUPS` of a curve key (stage-1 keys are :data:`STAGE1_RUNS`'s)."""
    if key in STAGE1_RUNS:
        return 2
    for k, (prefix, *_rest) in enumerate(GROUPS[:2]):
        if key.startswith(prefix):
            return k
    raise ValueError(f"curve key {key!r} is neither a table row (main/..., heterogeneous/...) nor a stage-1 run")


def ordered_series(curves: Curves) -> List[Tuple[str, List[CurvePoint], Optional[str]]]:
    """(key, points, twin) per run in group order; twin: the key of an earlier series trained in the very
    same run folders at every budget (the benchmark's GenComm row is the main table's GenComm run), None
    when it has its own runs."""
    out, seen = [], {}
    for key, series in sorted(curves.series().items(), key=lambda kv: (group_of(kv[0]), kv[0])):
        runs = tuple((p.budget, p.run) for p in series)
        twin = seen.get(runs) if all(r for _, r in runs) else None
        out.append((key, series, twin))
        seen.setdefault(runs, key)
    return out


def markdown(curves: Curves) -> str:
    """CURVES.md: per run, AP@0.5 / AP@0.7 / collaborator-only recall / validation loss at each budget,
    the convergence verdicts, in three sections (:data:`GROUPS`); then the rankings and the cost."""
    budgets = sorted({p.budget for p in curves.points})
    lines = ["# Learning curves", "", f"Budgets (multiples of the configs' epochs): {', '.join(map(str, budgets))}. "
             f"A run has converged at the first budget whose validation detection loss is less than "
             f"{CONVERGED_GAIN:.0%} below the previous budget's. Collab.-only: test vehicles only a collaborator "
             f"sees that the run detects (IoU 0.5), of all such vehicles.", ""]
    header = ["run", *[f"{b}x: AP@0.5 / AP@0.7 / collab.-only / val loss" for b in budgets], "converged at"]
    by_group: Dict[int, List[List[str]]] = {}
    for key, series, twin in ordered_series(curves):
        by = {p.budget: p for p in series}
        cells = ["-" if by.get(b) is None else _point_cell(by[b]) for b in budgets]
        label = series[0].label if twin is None else f"{series[0].label} (the main table's run)"
        by_group.setdefault(group_of(key), []).append([label, *cells, _verdict(curves, key, series)])
    for g, rows in sorted(by_group.items()):
        lines += [f"## {GROUPS[g][1]}", "", *markdown_table(header, rows), ""]
    lines += ["## Ranking", "", "Main-table ranking by AP@0.5 (best first):", ""]
    lines += markdown_table(["budget", "ranking"], [[f"{b}x", " > ".join(r)] for b, r in sorted(curves.rankings.items())])
    settled = curves.ranking_settled_at
    lines += ["", "The ranking " + (f"no longer changes from {settled}x on." if settled is not None else
                                    "has not been measured at two budgets yet.")]
    if curves.budgets:
        lines += ["", "## Cost", "", "What each budget's job took. Training core-hours: every training's and "
                  "onboarding's epochs, time x threads, over all the job's invocations. Wall: the job's last "
                  "invocation only (simulation and evaluations included; a resumed job's earlier invocations "
                  "are not in it).", ""]
        walls = [None if b.get("total_wall_s") is None else b["total_wall_s"] / 3600.0 for b in curves.budgets]
        spent = [b.get("train_core_hours") for b in curves.budgets]
        cost = [[f"{b['budget']}x", str(b.get("commit") or "-"), _hours(w), _hours(c)]
                for b, w, c in zip(curves.budgets, walls, spent)]
        if len(cost) > 1:
            cost.append(["all", "", "", _hours(sum(spent) if None not in spent else None)])
        lines += markdown_table(["budget", "commit", "last invocation's wall (h)", "training core-hours"], cost)
    return "\n".join(lines).rstrip() + "\n"


def _verdict(curves: Curves, key: str, series: Sequence[CurvePoint]) -> str:
    if all(p.val_detection_loss is None for p in series):
        return "- (trains nothing)"
    verdict = curves.converged_at.get(key)
    return "not yet" if verdict is None else f"{verdict}x"


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
    steps (log2 axis), one line per run folder (a twin series is drawn once; rows that train nothing, as
    late fusion of the stage-1 models, have no steps and are left to CURVES.md): a colour of its own per
    line (GenComm's main-table run black and thick), the marker and line style of its group (:data:`GROUPS`:
    main table o -, benchmark s --, stage 1 ^ :)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.5))
    series_of = curves.series()
    for key, style in line_styles(curves).items():
        pts = [p for p in series_of[key] if p.optimizer_steps]
        x = [p.optimizer_steps for p in pts]
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
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0.05 + 0.03 * ((len(labels) + 3) // 4), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def line_styles(curves: Curves) -> Dict[str, dict]:
    """curves.png's lines: key -> matplotlib style (marker, ls, color, lw, label), in drawing order; the
    keys drawn are those with optimizer steps and no twin (:func:`ordered_series`)."""
    from matplotlib import colormaps
    drawn = [(k, s) for k, s, twin in ordered_series(curves) if twin is None and any(p.optimizer_steps for p in s)]
    palette = colormaps["tab20" if len(drawn) > 10 else "tab10"]
    out = {}
    for n, (key, series) in enumerate(drawn):
        _, _, marker, line = GROUPS[group_of(key)]
        colour = "black" if key == f"main/{GENCOMM}" else palette(n % palette.N)
        out[key] = dict(marker=marker, ls=line, color=colour, lw=2.4 if GENCOMM in key else 1.3, label=series[0].label)
    return out


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
