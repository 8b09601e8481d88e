"""The fair benchmark's figure (``<dest>/fair_benchmark.png``, shown at the top of REPORT.md): AP@0.5 of
every row, one marker per training seed and a bar at their mean, next to no fusion's mean, so that the
run-to-run spread and the gap to no fusion read at a glance. One row of panels per protocol: the main
table (m1 ego, m3 collaborators) on the left, the heterogeneous benchmark's full alliance on the right.
The figures are the ones the report's tables give (:func:`seed_points` reads the same archive rows)."""
from __future__ import annotations

from pathlib import Path
from typing import List, NamedTuple, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from .comparisons import Group  # noqa: E402
from .method_ids import NO_FUSION_ROWS, REFERENCE  # noqa: E402

SEED_MARKERS = "os^Dv<>p"  # training seed s draws SEED_MARKERS[s % 8] in every panel


class PlotRow(NamedTuple):
    """One row of a panel: its method id, display name and AP per seed (in the group's seed order)."""

    method_id: str
    method: str
    aps: List[float]


Panel = Tuple[str, List[PlotRow]]  # (title, rows)


def seed_points(group: Group, thr: str = "0.5") -> List[Panel]:
    """The values the figure draws for ``group``: per panel, per row, the global AP at ``thr`` of each seed
    (the main table's rows, then the benchmark's full alliance; a panel without rows is left out)."""
    arcs = group.archives
    main = [PlotRow(m, group.name(m), [a.row(m).eval.ap["global"][thr] for a in arcs]) for m in group.main_methods()]
    bench = [PlotRow(m, group.name(m, "heterogeneous"), [a.bench_row(m).alliances[-1].eval.ap["global"][thr]
                                                         for a in arcs]) for m in group.bench_methods()]
    panels = [("main table: m1 ego, m3 collaborators", main)]
    if bench:
        types = arcs[0].bench_row(bench[0].method_id).alliances[-1].types
        panels.append((f"benchmark: full alliance {'+'.join(types)}", bench))
    return [p for p in panels if p[1]]


def _draw(ax, title: str, rows: List[PlotRow], seeds: Sequence[int], thr: str) -> None:
    ys = range(len(rows))
    for y, (method_id, _, aps) in zip(ys, rows):
        color = "C3" if method_id == REFERENCE else "C0"
        ax.barh(y, sum(aps) / len(aps), color=color, alpha=0.25, height=0.6)
        for seed, ap in zip(seeds, aps):
            ax.scatter(ap, y, marker=SEED_MARKERS[seed % len(SEED_MARKERS)], color=color, s=28, zorder=3)
    nf = next((r.aps for r in rows if r.method_id in NO_FUSION_ROWS), None)
    if nf is not None:
        ax.axvline(sum(nf) / len(nf), color="0.3", linestyle="--", linewidth=1)
    ax.set_yticks(list(ys), [r.method for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"AP@{thr} (global order)")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def plot_fair(groups: Sequence[Group], path: Path, thr: str = "0.5") -> Path:
    """Write the figure for ``groups`` (one row of panels each) to ``path``; returns ``path``."""
    layout = [(g, seed_points(g, thr)) for g in groups]
    cols = max(len(p) for _, p in layout)
    height = sum(0.3 * max(len(r) for _, r in p) + 1.2 for _, p in layout)
    fig, axes = plt.subplots(len(layout), cols, figsize=(6.0 * cols, height), dpi=110, squeeze=False)
    aps = [ap for _, p in layout for _, rows in p for r in rows for ap in r.aps]
    xlim = (max(0.0, min(aps) - 0.1), min(1.0, max(aps) + 0.05))  # one scale: panels compare by eye
    for row, (g, panels) in zip(axes, layout):
        for ax, (title, rows) in zip(row, panels):
            _draw(ax, f"{g.protocol}, seed{'s' if len(g.seeds) > 1 else ''} "
                      f"{', '.join(map(str, g.seeds))}: {title}", rows, g.seeds, thr)
            ax.set_xlim(*xlim)
        for ax in row[len(panels):]:
            ax.axis("off")
    seeds = sorted({s for g in groups for s in g.seeds})
    handles = [Line2D([], [], marker=SEED_MARKERS[s % len(SEED_MARKERS)], color="0.4", linestyle="none",
                      label=f"training seed {s}") for s in seeds]
    handles.append(Line2D([], [], color="0.3", linestyle="--", linewidth=1, label="no fusion, mean over seeds"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(f"Fair benchmark: AP@{thr} per training seed (markers), their mean (bars); "
                 "GenComm in red", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
