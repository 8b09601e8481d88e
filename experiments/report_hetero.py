"""REPORT.md's heterogeneous-benchmark section (:mod:`experiments.benchmark`): the
dynamic table (AP as new types join m1's alliance: m2, m3, m4, or the subset the benchmark ran), the cost of onboarding per
method (trainable parameters, GFLOPs, wall time, bytes), paired differences
against GenComm on the full alliance, and AP against trainable parameters and
against bytes."""
from __future__ import annotations

import math
from pathlib import Path
from typing import List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from opencood_ext.eval.bootstrap import paired_difference  # noqa: E402
from opencood_ext.eval.records import FrameRecords  # noqa: E402
from opencood_ext.run_folder import RunFolder, evaluation_label  # noqa: E402

from .evaluation import Evaluation  # noqa: E402
from .report_cells import difference_cell, differences  # noqa: E402
from .results import ResultRow  # noqa: E402
from .tables import bytes_cell, short_name, table  # noqa: E402


TYPE_NAMES = {"m1": "PointPillars 64-beam", "m2": "LSS camera", "m3": "SECOND 32-beam",
              "m4": "LSS camera with a wider image backbone"}


def _cells(ev: Evaluation) -> str:
    return f"{ev.cell('0.5')} / {ev.cell('0.7')}"


def _costs(r: ResultRow) -> tuple:
    """(params per new type, GFLOPs per new type) text from the row's growing-alliance entries."""
    new = [a for a in (r.alliances or [])[1:] if a.onboard_params is not None]
    if not new:
        return "-", "-"
    params = ", ".join(f"{a.types[-1]} {a.onboard_params:,}" for a in new)
    gflops = ", ".join(f"{a.types[-1]} {a.onboard_gflops:.2f}" for a in new if a.onboard_gflops is not None)
    return params, gflops or "-"


def plot_costs(rows: List[ResultRow], path: Path) -> Path:
    """AP@0.5 / AP@0.7 of the full alliance against trainable parameters and against bytes per message."""
    types = rows[0].alliances[-1].types
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for k, r in enumerate(rows):
        ev = r.eval
        xs = (max(r.trainable_params, 1), max(ev.bytes_per_message, 1.0))
        for ax, x in zip(axes, xs):
            for thr, marker in (("0.5", "o"), ("0.7", "s")):
                ax.scatter(math.log10(x), ev.ap_at(thr), marker=marker, s=55, color=f"C{k % 10}")
            ax.annotate(short_name(r.method), (math.log10(x), ev.ap_at("0.5")),
                        textcoords="offset points", xytext=(4, 4), fontsize=7)
    axes[0].set_xlabel(f"log10(trainable parameters to onboard {', '.join(types[1:])})  (0 = none trained)")
    axes[1].set_xlabel("log10(bytes one collaborator sends per frame)")
    for ax in axes:
        ax.set_ylabel(f"AP, alliance {'+'.join(types)} (global order)")
        ax.grid(alpha=0.3)
    fig.suptitle("Heterogeneous benchmark: circles AP@0.5, squares AP@0.7")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _origin(rows: List[ResultRow]) -> str:
    """Which stage-1 runs the onboarding rows started from (their ``stage1``, set by the benchmark)."""
    if any(r.stage1 == "full_feature" for r in rows):
        return ("GenComm starts from its homogeneous stage-1 runs (one per type); the other methods start "
                "from homogeneous full-feature intermediate-fusion stage-1 runs, as the reference code trains "
                "their stage 1.")
    return ("Every method starts from the same GenComm stage-1 runs (one homogeneous run per type); the "
            "competitors' frozen ego fusion and head were trained on GenComm's generated features, not on the "
            "full features they send.")


def _increment(r: ResultRow, types: List[str]) -> str:
    """AP@0.5 / AP@0.7 of the alliance ``types`` minus that of ``types[:-1]``, same run and test frames,
    with the paired scene-bootstrap interval; '-' when the run has no evaluation of both alliances
    (the no-fusion row is one evaluation for every alliance)."""
    run = r.run
    paths = [RunFolder(run).frames(evaluation_label(alliance=t)) for t in (types, types[:-1])] if run else []
    if not paths or not all(p.is_file() for p in paths):
        return "-"
    try:
        d = paired_difference(*(FrameRecords.load(p) for p in paths), r.eval.resamples, r.eval.seed)
    except ValueError as exc:  # the two alliances were evaluated on different frames
        return f"not paired: {exc}"
    return " / ".join(difference_cell(d, k) for k, t in enumerate(d.thresholds) if round(float(t), 2) in (0.5, 0.7))


def increments_section(rows: List[ResultRow], types: List[str]) -> List[str]:
    """What each joining type adds to its method's alliance: paired differences between consecutive
    alliances of the same run on the same test frames (does the new agent help at all?)."""
    lines = ["", "## What each new type adds", "",
             "AP@0.5 / AP@0.7 of the grown alliance minus the alliance before it: the same run on the same "
             "test frames, so the 95% interval is paired (whole test scenes resampled with the same draws). "
             "**Bold**: the interval excludes 0.", ""]
    return lines + table(["method", *(f"+{t}" for t in types[1:])],
                         [[r.method, *(_increment(r, types[:k + 1]) for k in range(1, len(types)))] for r in rows])


def hetero_section(rows: List[ResultRow], out: Path) -> List[str]:
    """The section's markdown lines ([] without benchmark rows)."""
    rows = [r for r in rows if r.table == "heterogeneous"]
    if not rows:
        return []
    types = [a.types[-1] for a in rows[0].alliances]
    lines = [f"## Heterogeneous benchmark: {', '.join(types[1:])} join{'s' if len(types) == 2 else ''} "
             f"{types[0]}'s alliance", "",
             _origin(rows) + f" The ego alliance ({types[0]}'s stack, fusion and head) stays frozen. "
             + ", ".join(f"{t} {TYPE_NAMES.get(t, '')}".rstrip() for t in types) + " (the first is the ego). "
             "AP@0.5 / AP@0.7 (global order) with 95% scene-bootstrap intervals as the alliance grows:", ""]
    lines += table(["method", *(("{" + types[0] + "}") if i == 0 else "+" + t for i, t in enumerate(types))],
                   [[r.method, *(_cells(a.eval) for a in r.alliances)] for r in rows])
    lines += ["", f"The full alliance, and what onboarding {', '.join(types[1:])} cost:", ""]
    full = []
    for r in rows:
        ev = r.eval
        params, gflops = _costs(r)
        full.append([r.method, ev.cell("0.3"), ev.cell("0.5"), ev.cell("0.7"),
                     f"{ev.cell('0.5', 'per_frame')} / {ev.cell('0.7', 'per_frame')}", f"{r.trainable_params:,}",
                     params, gflops, f"{r.train_wall_s:.0f} s", bytes_cell(ev.bytes_per_message)])
    lines += table(["method", "AP@0.3", "AP@0.5", "AP@0.7", "AP@0.5 / 0.7 (per-frame order)",
                    "trainable params (total)", "per new type", "GFLOPs per new type and frame", "onboarding wall time",
                    "bytes per message"], full)
    lines += ["", "GFLOPs count what trains for a new type on one frame (the deformable convolution included); "
              "parameters per new type are those its onboarding trains (CodeFilling's quantiser is shared by all "
              "senders, so its total counts it once)."]
    lines += differences(rows)
    lines += increments_section(rows, types)
    plot = plot_costs(rows, out / "hetero_costs.png")
    lines += ["", f"![AP against trainable parameters and bytes]({plot.name})", ""]
    return lines
