"""AP per scene family (issue 31 item 5): the figures behind REPORT.md's "AP per scene family"
section (:mod:`experiments.report_family`), which results.json keeps as ``scene_families``.

Every row of the main table and of the benchmark's full alliance is split by the scene family
(:mod:`opencood_ext.sim.families`: ``scenario.layout`` in each test scene's data_protocol.yaml, read
from the data root the rows were evaluated on) of its test frames: AP (global order) with the 95 %
scene-bootstrap interval per family and for the pool (every frame: the row's own AP and interval),
and the paired difference against its table's GenComm row per family, computed as the
paired-differences section computes it (:func:`opencood_ext.eval.bootstrap.paired_difference`, the
row's own resamples and seed).

The figures (JSON)::

    {"test_data": root, "families": {family: test scenes},
     "rows": [{"method_id", "method", "table", "reference" (the GenComm row compared against; absent for it),
               "families": {family | "pool": {"scenes", "frames", "ap": {thr: AP | null},
                                               "ap_ci": {thr: [lo, hi] | null},
                                               "vs_reference": {thr: {"diff", "ci", "significant"}},
                                               "vs_reference_error": why not paired}}}]}

``rows`` is empty when the test set holds one family only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Dict, List, Literal, Optional, Sequence, Tuple

from opencood_ext.config import NONFINITE_OK, FieldError
from opencood_ext.data.errors import DataFormatError
from opencood_ext.eval.bootstrap import bootstrap_ap, paired_difference
from opencood_ext.eval.records import FrameRecords
from opencood_ext.sim.families import LAYOUTS, scenario_families

from .evaluation import Number, field_error
from .method_ids import REFERENCE, legacy_method_id

FAMILY_POOL = "pool"  # beside each family: every test frame
TABLES = ("main", "heterogeneous")


def _plain(obj) -> dict:
    """A dataclass as JSON, None fields left out."""
    return {f.name: getattr(obj, f.name) for f in fields(obj) if getattr(obj, f.name) is not None}


@dataclass
class PairedFigure:
    """A row minus its table's GenComm row on one family's frames: the difference (None: undefined),
    its 95 % interval and whether that excludes 0."""

    diff: Optional[Number]
    ci: Optional[List[Number]]
    significant: bool

    def to_dict(self) -> dict:
        return {"diff": self.diff, "ci": self.ci, "significant": self.significant}


@dataclass
class FamilyFigure:
    """One row's figures on one family's frames (or the pool's)."""

    scenes: int
    frames: int
    ap: Optional[Dict[str, Optional[Number]]] = field(default=None, metadata={NONFINITE_OK: True})
    ap_ci: Optional[Dict[str, Optional[List[Number]]]] = field(default=None, metadata={NONFINITE_OK: True})
    vs_reference: Optional[Dict[str, PairedFigure]] = field(default=None, metadata={NONFINITE_OK: True})
    vs_reference_error: Optional[str] = None

    def to_dict(self) -> dict:
        out = _plain(self)
        if self.vs_reference is not None:
            out["vs_reference"] = {t: p.to_dict() for t, p in self.vs_reference.items()}
        return out


@dataclass
class FamilyRow:
    method_id: str
    method: str
    table: Literal["main", "heterogeneous"]
    families: Dict[str, FamilyFigure]
    reference: Optional[str] = None
    id_derived: bool = field(default=False, init=False, compare=False, repr=False)

    def to_dict(self) -> dict:
        out = {} if self.id_derived else {"method_id": self.method_id}
        out.update({"method": self.method, "table": self.table})
        if self.reference is not None:
            out["reference"] = self.reference
        out["families"] = {f: fig.to_dict() for f, fig in self.families.items()}
        return out


@dataclass
class FamilyFigures:
    """See the module docstring: the test data, its families (test scenes each), every row's figures."""

    test_data: str
    families: Dict[str, int]
    rows: List[FamilyRow]

    def __post_init__(self):
        for k, row in enumerate(self.rows):
            for fam in row.families:
                if fam not in self.families and fam != FAMILY_POOL:
                    raise FieldError(f"{fam!r} is not a family of scene_families.families "
                                     f"({', '.join(self.families)})", f"rows.{k}.families.{fam}")

    def to_dict(self) -> dict:
        return {"test_data": self.test_data, "families": self.families, "rows": [r.to_dict() for r in self.rows]}

    @staticmethod
    def fields_of(doc: dict, source: str) -> dict:
        """results.json's ``scene_families`` with each row's ``method_id`` (from its name in a file that
        predates it); the loader validates the rest."""
        rows = doc.get("rows")
        if not isinstance(rows, list):
            return doc
        out = []
        for k, r in enumerate(rows):
            if isinstance(r, dict) and "method_id" not in r and isinstance(r.get("method"), str):
                found = legacy_method_id(r["method"], r.get("table", "main"))
                if found is None:
                    raise field_error(source, f"scene_families.rows.{k}.method_id",
                                      f"missing, and {r['method']!r} is no method this code ever named")
                r = {"method_id": found, **r}
            out.append(r)
        return {**doc, "rows": out}


def mark_derived(figures: Optional[FamilyFigures], doc) -> None:
    """The rows whose file did not state ``method_id``: written back without it."""
    if figures is None or not isinstance(doc, dict):
        return
    for row, r in zip(figures.rows, doc.get("rows") or []):
        row.id_derived = isinstance(r, dict) and "method_id" not in r


def _number(v: float) -> Optional[float]:
    return None if math.isnan(v) else float(v)


def _figure(part: FrameRecords, ref: Optional[FrameRecords], resamples: int, seed: int) -> FamilyFigure:
    """One family's (or the pool's) figures of one row; ``ref``: its table's GenComm records (None: no pairing)."""
    fig = FamilyFigure(scenes=part.num_scenes, frames=part.num_frames)
    if not part.num_frames:
        return fig
    boot = bootstrap_ap(part, resamples, seed)
    fig.ap = {str(t): _number(v) for t, v in zip(boot.thresholds, boot.ap["global"])}
    fig.ap_ci = boot.ci_json()["global"]
    if ref is not None:
        try:
            d = paired_difference(part, ref.subset(part.scene_ids), resamples, seed)
        except ValueError as exc:  # the reference holds other frames
            fig.vs_reference_error = " ".join(str(exc).split())
        else:
            fig.vs_reference = {t: PairedFigure(_number(v["diff"]), v["ci"], v["significant"])
                                for t, v in d.to_json()["global"].items()}
    return fig


def family_figures(rows: Sequence, test_root) -> Optional[FamilyFigures]:
    """The per-family figures of ``rows`` (:class:`~experiments.results.ResultRow`; those whose records
    are kept in their run folder) on the test data at ``test_root``; None when no row has records. A
    scene without a recorded family raises (FileNotFoundError, or
    :class:`~opencood_ext.data.errors.DataFormatError` naming the file)."""
    have = [r for r in rows if r.table in TABLES and r.eval.has_records(r.run)]
    if not have:
        return None
    records = {id(r): r.eval.load_records(r.run) for r in have}
    family_of = scenario_families(test_root, (s for rec in records.values() for s in rec.scene_ids))
    families = [f for f in LAYOUTS if f in family_of.values()]
    out = FamilyFigures(str(test_root), {f: sum(g == f for g in family_of.values()) for f in families}, [])
    if len(families) < 2:
        return out
    for table in TABLES:
        in_table = [r for r in have if r.table == table]
        ref = next((r for r in in_table if r.method_id == REFERENCE), None)
        for r in in_table:
            rec = records[id(r)]
            paired = None if ref is None or r is ref else records[id(ref)]
            entry = FamilyRow(r.method_id, r.method, table, {}, ref.method if paired is not None else None)
            for fam in families:
                part = rec.subset(s for s in rec.scene_ids if family_of[s] == fam)
                entry.families[fam] = _figure(part, paired, r.eval.resamples, r.eval.seed)
            entry.families[FAMILY_POOL] = _figure(rec, paired, r.eval.resamples, r.eval.seed)
            out.rows.append(entry)
    return out


def compute_family_figures(rows: Sequence, test_root) -> Tuple[Optional[FamilyFigures], Optional[str]]:
    """(figures, None), or (None, why not in one line) when the test scenes record no family."""
    try:
        return family_figures(rows, test_root), None
    except (FileNotFoundError, DataFormatError) as exc:
        return None, " ".join(str(exc).split())
