"""The learning curves' report (:mod:`experiments.curves` collects and analyses the points):
``CURVES.md`` in sections (main table, onboarding benchmark, stage-1 scorings, differences from GenComm,
ranking, cost), ``curves.png`` and ``curves.json``.

    python tools/learning_curves.py report OUT [-o ARCHIVE]
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from opencood_ext.atomic_files import atomic_write_json

from .curves import CONVERGED_GAIN, PAIRED_RESAMPLES, STAGE1_RUNS, CurvePoint, Curves
from .method_ids import GENCOMM
from .tables import table as markdown_table

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
    diff_rows = [[series[0].label, *[_diff_cell({p.budget: p for p in series}.get(b)) for b in budgets]]
                 for key, series, twin in ordered_series(curves) if twin is None and any(p.minus_gencomm for p in series)]
    if diff_rows:
        lines += ["## Differences from GenComm", "",
                  f"AP minus GenComm's (m3 onboarded, the main table's run) at the same budget, AP@0.5 / AP@0.7, "
                  f"with 95 % intervals paired over the same {PAIRED_RESAMPLES} draws of test scenes; * marks an "
                  f"interval that excludes 0.", ""]
        lines += [*markdown_table(["run", *[f"{b}x: dAP@0.5 / dAP@0.7" for b in budgets]], diff_rows), ""]
    lines += ["## Ranking", "", "Main-table ranking by AP@0.5 (best first; the section above says which gaps "
              "to GenComm are told apart from noise):", ""]
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


def _diff_cell(p: Optional[CurvePoint]) -> str:
    if p is None or not p.minus_gencomm:
        return "-"
    cells = []
    for t in ("0.5", "0.7"):
        d, lo, hi = p.minus_gencomm[t]
        cells.append(f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" + ("*" if lo > 0 or hi < 0 else ""))
    return " / ".join(cells)


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
    atomic_write_json(out, curves.to_dict(), indent=2)
    md = folder / "CURVES.md"
    md.write_text(markdown(curves))
    return [out, md, plot(curves, folder / "curves.png")]
