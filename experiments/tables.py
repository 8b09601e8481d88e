"""Every cell and table the reports print, in one place: REPORT.md of the main job and of the fair
benchmark, the README's fair tables and docs/results.md render their figures through these, so one
figure reads the same wherever it appears.

Cells: an AP with its interval (``0.646 [0.60, 0.69]``), a mean over seeds with its sample standard
deviation (``0.700 ± 0.100``; one seed: its value), a paired difference with its 95 % interval, bold
when the interval excludes 0 (``**-0.200 [-0.31, -0.09]**``), the per-seed differences starred where a
seed's own interval excludes 0 (``+0.030*, +0.010``), a budget that is one value or one per seed, a byte
count. Tables: :func:`table` (a header, the ``|---|`` rule, the rows).
"""
from __future__ import annotations

import math
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

DASH = "-"  # a cell with nothing to show


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """(mean, sample standard deviation); one value has no spread (0)."""
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def mean_std_cell(values: Sequence[float]) -> str:
    """``0.700 ± 0.100``: the mean and sample std over seeds; one seed has no spread to show, so just its value."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return "{:.3f} ± {:.3f}".format(*mean_std(values))


def ap_cell(ap: Optional[float], ci: Optional[Sequence[float]] = None) -> str:
    """``0.646 [0.60, 0.69]``: an AP and its 95% interval (the AP alone without one; "-" without an AP)."""
    if ap is None:
        return DASH
    return f"{ap:.3f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def diff_cell(diff: float, lo: float, hi: float, significant: bool) -> str:
    """A paired difference as ``+0.012 [-0.01, +0.03]``, bold when ``significant`` (its interval excludes 0)."""
    cell = f"{diff:+.3f} [{lo:+.2f}, {hi:+.2f}]"
    return f"**{cell}**" if significant else cell


def seed_marks(per_seed: Iterable[Tuple[float, bool]]) -> str:
    """``+0.030*, +0.010``: each seed's difference, starred when that seed's own interval excludes 0."""
    return ", ".join(f"{d:+.3f}" + ("*" if sig else "") for d, sig in per_seed)


def paired_cell(diff: float, lo: float, hi: float, significant: bool, per_seed: Iterable[Tuple[float, bool]]) -> str:
    """``+0.021 [+0.00, +0.04]; +0.030*, +0.010, +0.022*``: the pooled difference (:func:`diff_cell`), then
    every seed's (:func:`seed_marks`)."""
    return diff_cell(diff, lo, hi, significant) + "; " + seed_marks(per_seed)


def budget_cell(values: Sequence[Optional[float]], fmt: str) -> str:
    """One value when every seed trained the same (``576``), else each seed's (``576 / 612``); "-" when unknown."""
    v = [x for x in values if x is not None]
    if not v:
        return DASH
    return format(v[0], fmt) if len(set(v)) == 1 else " / ".join(format(x, fmt) for x in v)


def bytes_cell(b: float) -> str:
    """Bytes per message with their log2: ``3,277,004 (2^21.6)``; ``0`` when nothing is sent."""
    return "0" if b <= 0 else f"{b:,.0f} (2^{math.log2(b):.1f})"


def mean_bytes_cell(values: Sequence[Optional[float]]) -> str:
    """The mean bytes per message over seeds (late fusion's box lists vary with the trained detector);
    "-" when a seed did not measure them."""
    return DASH if None in values else f"{round(sum(values) / len(values)):,}"


def bold_best(cells: List[str], means: Sequence[float]) -> List[str]:
    """``cells`` with the leading number of the cell(s) of the highest mean in bold."""
    best = max(means)
    return [f"**{c.split(' ')[0]}**" + c[len(c.split(' ')[0]):] if m == best else c for c, m in zip(cells, means)]


def row(cells: Sequence[object]) -> str:
    """One markdown table line: ``| a | b |``."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: Sequence[str], rows: Iterable[Sequence[object]] = ()) -> List[str]:
    """A markdown table: the header line, the ``|---|`` rule (one per column), one line per row."""
    return [row(header), "|" + "---|" * len(header)] + [row(r) for r in rows]


def threshold_index(thresholds: Sequence[float], thr: str) -> int:
    """The position of the IoU threshold ``thr`` (text, as JSON keys it: "0.5") in ``thresholds`` (floats);
    ValueError naming both when absent."""
    wanted = f"{float(thr):g}"
    for k, t in enumerate(thresholds):
        if f"{float(t):g}" == wanted:
            return k
    evaluated = ", ".join(f"{float(t):g}" for t in thresholds)
    raise ValueError(f"IoU threshold {thr} is not one of the evaluated {evaluated}")


def short_name(method: str) -> str:
    """A row's display name without its parenthesised qualifier, for prose and plot labels:
    "GenComm (m3 onboarded)" -> "GenComm". Display only: rows are found by their method id."""
    return method.split(" (")[0]
