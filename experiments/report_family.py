"""REPORT.md's "AP per scene family" section (issue 31 item 5) and the figures behind it, which
results.json keeps as ``scene_families`` (:func:`experiments.results.check_scene_families`).

Every row of the main table and of the benchmark's full alliance is split by the scene family
(:mod:`opencood_ext.sim.families`: ``scenario.layout`` in each test scene's data_protocol.yaml,
read from the data root the rows were evaluated on) of its test frames: AP (global order) with the
95 % scene-bootstrap interval per family and for the pool (every frame: the row's own AP and
interval), and the paired difference against its table's GenComm row per family, computed as the
paired-differences section computes it (:func:`opencood_ext.eval.bootstrap.paired_difference`, the
row's own resamples and seed).

The figures (JSON)::

    {"test_data": root, "families": {family: test scenes},
     "rows": [{"method", "table", "reference" (the GenComm row compared against; absent for it),
               "families": {family | "pool": {"scenes", "frames", "ap": {thr: AP | null},
                                               "ap_ci": {thr: [lo, hi] | null},
                                               "vs_reference": {thr: {"diff", "ci", "significant"}},
                                               "vs_reference_error": why not paired}}}]}

``rows`` is empty when the test set holds one family only.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from opencood_ext.data.errors import DataFormatError
from opencood_ext.eval.bootstrap import bootstrap_ap, paired_difference
from opencood_ext.eval.records import FrameRecords
from opencood_ext.sim.families import LAYOUTS, scenario_families

from .profiles import BASELINES
from .report_cells import diff_text
from .results import FAMILY_POOL, TABLES, ResultRow

SHOWN = ("0.5", "0.7")  # the thresholds the tables show (results.json keeps every one evaluated)
TABLE_TITLES = {"main": "Main table", "heterogeneous": "Benchmark, full alliance"}
# rows that exchange no features: the baselines whose evaluation fusion is not intermediate
NOT_FEATURE_LEVEL = {name for name, _, fusion in BASELINES if fusion != "intermediate"}
LATE = next(name for name, _, fusion in BASELINES if fusion == "late")


def _base(method: str) -> str:
    """"Late fusion (stage-1 models)" -> "Late fusion"."""
    return method.split(" (")[0]


def _number(v: float) -> Optional[float]:
    return None if math.isnan(v) else float(v)


def _figure(part: FrameRecords, ref: Optional[FrameRecords], resamples: int, seed: int) -> dict:
    """One family's (or the pool's) figures of one row; ``ref``: its table's GenComm records (None: no pairing)."""
    fig = {"scenes": part.num_scenes, "frames": part.num_frames}
    if not part.num_frames:
        return fig
    boot = bootstrap_ap(part, resamples, seed)
    fig["ap"] = {str(t): _number(v) for t, v in zip(boot.thresholds, boot.ap["global"])}
    fig["ap_ci"] = boot.ci_json()["global"]
    if ref is not None:
        try:
            d = paired_difference(part, ref.subset(part.scene_ids), resamples, seed)
        except ValueError as exc:  # the reference holds other frames
            fig["vs_reference_error"] = " ".join(str(exc).split())
        else:
            fig["vs_reference"] = {t: dict(v, diff=_number(v["diff"])) for t, v in d.to_json()["global"].items()}
    return fig


def family_figures(rows: Sequence[ResultRow], test_root, reference: str = "GenComm") -> Optional[dict]:
    """The per-family figures of ``rows`` (those with per-frame records, ``eval.frames_file``) on the test
    data at ``test_root``; None when no row has records. A scene without a recorded family raises
    (FileNotFoundError, or :class:`~opencood_ext.data.errors.DataFormatError` naming the file)."""
    have = [r for r in rows if r.table in TABLES and r.eval.get("frames_file")
            and Path(r.eval["frames_file"]).is_file()]
    if not have:
        return None
    records = {id(r): FrameRecords.load(r.eval["frames_file"]) for r in have}
    family_of = scenario_families(test_root, (s for rec in records.values() for s in rec.scene_ids))
    families = [f for f in LAYOUTS if f in family_of.values()]
    out = {"test_data": str(test_root), "families": {f: sum(g == f for g in family_of.values()) for f in families},
           "rows": []}
    if len(families) < 2:
        return out
    for table in TABLES:
        in_table = [r for r in have if r.table == table]
        ref = next((r for r in in_table if reference in r.method), None)
        for r in in_table:
            rec, boot = records[id(r)], r.eval.get("bootstrap") or {}
            resamples, seed = boot.get("resamples", 1000), boot.get("seed", 0)
            paired = None if ref is None or r is ref else records[id(ref)]
            entry = {"method": r.method, "table": table, "families": {}}
            if paired is not None:
                entry["reference"] = ref.method
            for fam in families:
                part = rec.subset(s for s in rec.scene_ids if family_of[s] == fam)
                entry["families"][fam] = _figure(part, paired, resamples, seed)
            entry["families"][FAMILY_POOL] = _figure(rec, paired, resamples, seed)
            out["rows"].append(entry)
    return out


def compute_family_figures(rows: Sequence[ResultRow], test_root) -> Tuple[Optional[dict], Optional[str]]:
    """(figures, None), or (None, why not in one line) when the test scenes record no family."""
    try:
        return family_figures(rows, test_root), None
    except (FileNotFoundError, DataFormatError) as exc:
        return None, " ".join(str(exc).split())


def _ap_text(fig: dict, thr: str) -> str:
    ap = (fig.get("ap") or {}).get(thr)
    if ap is None:
        return "-"
    ci = (fig.get("ap_ci") or {}).get(thr)
    return f"{ap:.3f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def _diff_text(fig: dict, thr: str) -> str:
    d = (fig.get("vs_reference") or {}).get(thr)
    if d is None or d.get("diff") is None:
        return "not paired" if fig.get("vs_reference_error") else "-"
    lo, hi = d["ci"] if d.get("ci") else (math.nan, math.nan)
    return diff_text(d["diff"], lo, hi, d["significant"])


def _late_clause(entries: List[dict], families: List[str], thr: str = "0.5") -> List[str]:
    """What the figures show about late fusion against the feature-level rows of one table, per family."""
    late = next((e for e in entries if _base(e["method"]) == LATE), None)
    feature = [e for e in entries if _base(e["method"]) not in NOT_FEATURE_LEVEL]
    if late is None or not feature:
        return []
    leads, said = [], []
    for fam in [*families, FAMILY_POOL]:
        mine = (late["families"].get(fam) or {}).get("ap", {}).get(thr)
        if mine is None:
            continue
        theirs = {e["method"]: ((e["families"].get(fam) or {}).get("ap") or {}).get(thr) for e in feature}
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


def family_section(figures: Optional[dict], why_not: Optional[str] = None) -> List[str]:
    """The section's markdown lines: [] without figures (no row has per-frame records), one line when
    ``why_not`` or when the test set holds one family."""
    head = ["## AP per scene family", ""]
    if figures is None:
        return [] if why_not is None else head + [f"Not computed: {why_not}", ""]
    fams: Dict[str, int] = figures["families"]
    if len(fams) < 2:
        only = ", ".join(f"{f} ({n} scenes)" for f, n in fams.items()) or "none recorded"
        return head + [f"The test set `{figures['test_data']}` holds one scene family only: {only}; no per-family "
                       "split.", ""]
    families = list(fams)
    lines = head + [
        "Is late fusion's lead over feature-level fusion a property of perpendicular junctions (collaborators on "
        "the other arms, crossing the ego's heading) rather than of cooperative perception? The test scenes split "
        "by scene family (" + ", ".join(f"{f} {n}" for f, n in fams.items()) + f" scenes of `{figures['test_data']}`); "
        "AP (global order) with 95% scene-bootstrap intervals per family, and the pool (every test frame: the "
        "rows' own AP). Point estimates, per table:", ""]
    cols = [*families, FAMILY_POOL]
    for table in TABLES:
        entries = [e for e in figures["rows"] if e["table"] == table]
        if not entries:
            continue
        said = [c for thr in SHOWN for c in _late_clause(entries, families, thr)]
        lines += [f"- {TABLE_TITLES[table]}: " + (" ".join(said) or "no late-fusion row or no feature-level row "
                                                  "to compare.")]
    for table in TABLES:
        entries = [e for e in figures["rows"] if e["table"] == table]
        if not entries:
            continue
        header = "| method | " + " | ".join(f"{f} AP@{t}" for f in cols for t in SHOWN) + " |"
        rule = "|---|" + "---|" * (len(cols) * len(SHOWN))
        lines += ["", f"### {TABLE_TITLES[table]}", "", header, rule]
        lines += [f"| {e['method']} | " + " | ".join(_ap_text(e["families"].get(f, {}), t) for f in cols for t in SHOWN)
                  + " |" for e in entries]
        ref = next((e["reference"] for e in entries if e.get("reference")), None)
        if ref is None:
            continue
        lines += ["", f"Paired differences against {ref} per family (AP minus GenComm's on the same frames of the "
                  "family; **bold**: the 95% interval excludes 0):", "", header, rule]
        lines += [f"| {e['method']} | " + " | ".join(_diff_text(e["families"].get(f, {}), t)
                                                     for f in cols for t in SHOWN) + " |"
                  for e in entries if e.get("reference")]
    return lines + [""]
