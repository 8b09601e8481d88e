"""REPORT.md's "AP per scene family" section (issue 31 item 5), rendered from the figures results.json
keeps as ``scene_families`` (:class:`~experiments.family_figures.FamilyFigures`, computed there)."""
from __future__ import annotations

import math
from typing import Dict, List, Optional

from .family_figures import FAMILY_POOL, TABLES, FamilyFigure, FamilyFigures, FamilyRow
from .method_ids import LATE_ROWS, NOT_FEATURE_LEVEL
from .tables import ap_cell, diff_cell, table

SHOWN = ("0.5", "0.7")  # the thresholds the tables show (results.json keeps every one evaluated)
TABLE_TITLES = {"main": "Main table", "heterogeneous": "Benchmark, full alliance"}
_NONE = FamilyFigure(scenes=0, frames=0)  # a family a row has no figures for


def _ap_text(fig: FamilyFigure, thr: str) -> str:
    return ap_cell((fig.ap or {}).get(thr), (fig.ap_ci or {}).get(thr))


def _diff_text(fig: FamilyFigure, thr: str) -> str:
    d = (fig.vs_reference or {}).get(thr)
    if d is None or d.diff is None:
        return "not paired" if fig.vs_reference_error else "-"
    lo, hi = d.ci if d.ci else (math.nan, math.nan)
    return diff_cell(d.diff, lo, hi, d.significant)


def _ap(e: FamilyRow, fam: str, thr: str) -> Optional[float]:
    return ((e.families.get(fam) or _NONE).ap or {}).get(thr)


def _late_clause(entries: List[FamilyRow], families: List[str], thr: str = "0.5") -> List[str]:
    """What the figures show about late fusion against the feature-level rows of one table, per family."""
    late = next((e for e in entries if e.method_id in LATE_ROWS), None)
    feature = [e for e in entries if e.method_id not in NOT_FEATURE_LEVEL]
    if late is None or not feature:
        return []
    leads, said = [], []
    for fam in [*families, FAMILY_POOL]:
        mine = _ap(late, fam, thr)
        if mine is None:
            continue
        theirs = {e.method: _ap(e, fam, thr) for e in feature}
        ahead = [m for m, v in theirs.items() if v is not None and v > mine]
        tied = [m for m, v in theirs.items() if v is not None and v == mine]
        where = "pooled" if fam == FAMILY_POOL else f"on {fam} scenes"
        if ahead:
            said.append(f"{where} {', '.join(ahead)} beat{'s' if len(ahead) == 1 else ''} late fusion ({mine:.3f})")
        elif tied:  # equal is no lead (e.g. every row at 0 on a tiny test set)
            said.append(f"{where} late fusion ({mine:.3f}) ties {', '.join(tied)}, and no feature-level row is ahead")
        else:
            said.append(f"{where} late fusion ({mine:.3f}) is ahead of every feature-level row")
            if fam != FAMILY_POOL:
                leads.append(fam)
    if not said:
        return []
    rest = [f for f in families if f not in leads]
    verdict = (f"late fusion's lead is confined to {', '.join(leads)} scenes" if leads and rest else
               "late fusion leads in every family, so its lead is not a property of one family" if leads else
               "late fusion leads in no family")
    return [f"AP@{thr}: " + "; ".join(said) + f": {verdict}."]


def family_section(figures: Optional[FamilyFigures], why_not: Optional[str] = None) -> List[str]:
    """The section's markdown lines: [] without figures (no row has per-frame records), one line when
    ``why_not`` or when the test set holds one family."""
    head = ["## AP per scene family", ""]
    if figures is None:
        return [] if why_not is None else head + [f"Not computed: {why_not}", ""]
    fams: Dict[str, int] = figures.families
    if len(fams) < 2:
        only = ", ".join(f"{f} ({n} scenes)" for f, n in fams.items()) or "none recorded"
        return head + [f"The test set `{figures.test_data}` holds one scene family only: {only}; no per-family "
                       "split.", ""]
    families = list(fams)
    lines = head + [
        "Is late fusion's lead over feature-level fusion a property of perpendicular junctions (collaborators on "
        "the other arms, crossing the ego's heading) rather than of cooperative perception? The test scenes split "
        "by scene family (" + ", ".join(f"{f} {n}" for f, n in fams.items()) + f" scenes of `{figures.test_data}`); "
        "AP (global order) with 95% scene-bootstrap intervals per family, and the pool (every test frame: the "
        "rows' own AP). Point estimates, per table:", ""]
    cols = [*families, FAMILY_POOL]
    for name in TABLES:
        entries = [e for e in figures.rows if e.table == name]
        if not entries:
            continue
        said = [c for thr in SHOWN for c in _late_clause(entries, families, thr)]
        lines += [f"- {TABLE_TITLES[name]}: " + (" ".join(said) or "no late-fusion row or no feature-level row "
                                                 "to compare.")]
    header = ["method", *(f"{f} AP@{t}" for f in cols for t in SHOWN)]
    for name in TABLES:
        entries = [e for e in figures.rows if e.table == name]
        if not entries:
            continue
        lines += ["", f"### {TABLE_TITLES[name]}", ""]
        lines += table(header, [[e.method, *(_ap_text(e.families.get(f, _NONE), t) for f in cols for t in SHOWN)]
                                for e in entries])
        ref = next((e.reference for e in entries if e.reference), None)
        if ref is None:
            continue
        lines += ["", f"Paired differences against {ref} per family (AP minus GenComm's on the same frames of the "
                  "family; **bold**: the 95% interval excludes 0):", ""]
        lines += table(header, [[e.method, *(_diff_text(e.families.get(f, _NONE), t) for f in cols for t in SHOWN)]
                                for e in entries if e.reference])
    return lines + [""]
