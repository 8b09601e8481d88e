"""The fair benchmark's results (issue 31), computed once from the seed archives into one typed object,
:class:`FairResults`, that ``results.json`` keeps and every report renders: REPORT.md
(:mod:`experiments.fair_report`) and the README's tables (:mod:`experiments.fair_readme`).

Per protocol (:class:`~experiments.comparisons.Group`), :func:`compute` makes every comparison once:
the seed section's (:class:`~experiments.comparisons.SeedComparisons`: the spread, every main-table row
minus GenComm, what cooperation adds), the benchmark's rows minus GenComm at the ego's alliance and at the
full one, the issue's acceptance checks, what each camera type adds (selected weights and every scored
onboarding epoch), and the per-family split. ``results.json`` holds the rows of every seed (records
relative to the combined folder), ``checks``, ``camera`` and ``against_gencomm`` (every row minus its
table's GenComm row at AP@0.5 and AP@0.7: the main table's from the seed section, the benchmark's full
alliance's from the benchmark's comparisons).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from opencood_ext.eval.bootstrap import bootstrap_ap
from opencood_ext.run_folder import epoch_checkpoint

from .comparisons import (Group, Paired, PairedAt, SeedComparisons, alliance_getter, bench_getter, compare,
                          main_getter, seed_comparisons)
from .evaluation import Evaluation, ResultsError
from .method_ids import INTERMEDIATE, LATE, LATE_OF_STAGE1, NO_FUSION, NONE_OF_STAGE1, REFERENCE, legacy_method_id
from .report_epochs import camera_steps
from .results import ResultRow, validated
from .tables import threshold_index

NOT_ONBOARDING = (NONE_OF_STAGE1, LATE_OF_STAGE1)  # the benchmark's rows that onboard nothing
CHECK_THRESHOLD = CAMERA_THRESHOLD = "0.5"
AGAINST_THRESHOLDS = ("0.5", "0.7")


def _id(method_id: str, derived: bool) -> dict:
    return {} if derived else {"method_id": method_id}


@dataclass
class Check:
    """One of the issue's acceptance comparisons at AP@0.5 (``what``: "A minus B", ``where``: which rows)."""

    protocol: str
    what: str
    where: str
    at: PairedAt
    at_least: bool  # the pooled difference and every seed's are >= 0
    above_every_seed: bool  # above 0 and significant in every seed

    def to_json(self) -> dict:
        return {"protocol": self.protocol, "what": self.what, "where": self.where, **self.at.to_json(),
                "at_least": self.at_least, "above_every_seed": self.above_every_seed}


@dataclass
class CameraStep:
    """What a camera type adds to a benchmark row: the alliance with it minus the one before it, the same
    weights (``weights``: "selected" or "epoch_<n>") on the same frames, at AP@0.5."""

    protocol: str
    method_id: str
    method: str
    step: str
    weights: str
    at: PairedAt
    id_derived: bool = field(default=False, compare=False, repr=False)

    def to_json(self) -> dict:
        return {"protocol": self.protocol, **_id(self.method_id, self.id_derived), "method": self.method,
                "step": self.step, "weights": self.weights, **self.at.to_json()}


@dataclass
class AgainstReference:
    """A row minus its table's GenComm row on the same frames, at AP@0.5 and AP@0.7 (``diff``)."""

    protocol: str
    table: str
    method_id: str
    method: str
    minus: str
    diff: Dict[str, PairedAt]
    id_derived: bool = field(default=False, compare=False, repr=False)

    def to_json(self) -> dict:
        return {"protocol": self.protocol, "table": self.table, **_id(self.method_id, self.id_derived),
                "method": self.method, "minus": self.minus, "diff": {t: d.to_json() for t, d in self.diff.items()}}

    @classmethod
    def from_json(cls, doc: dict, source: str) -> "AgainstReference":
        found = doc.get("method_id") or legacy_method_id(doc["method"], doc["table"])
        if found is None:
            raise ResultsError(f"{source}: against_gencomm entry {doc['method']!r} has no method_id")
        return cls(doc["protocol"], doc["table"], found, doc["method"], doc["minus"],
                   {t: PairedAt.from_json(d) for t, d in doc["diff"].items()}, "method_id" not in doc)


@dataclass
class FamilySplit:
    """AP@0.5 per scene family (each seed's) and the row minus its table's GenComm row per family, for the
    main table's rows and the benchmark's full alliance; ``ordering``: late fusion minus full-feature
    intermediate fusion (main table) per family and on every frame ("all")."""

    parts: Dict[str, List[str]]  # family -> its test scenes
    entries: List[Tuple[str, str]]  # (table, method id): "main" / "benchmark"
    aps: Dict[Tuple[str, str], Dict[str, List[float]]]
    vs_reference: Dict[Tuple[str, str], Dict[str, Optional[Paired]]]
    ordering: Dict[str, Paired] = field(default_factory=dict)


@dataclass
class GroupResults:
    """Every comparison of one protocol's seed archives (the report's sections)."""

    group: Group
    seeds: SeedComparisons
    bench_first: Dict[str, Paired]  # benchmark row minus GenComm's, the ego's alliance alone
    bench_full: Dict[str, Paired]  # the same, full alliance
    checks: List[Check]
    camera: List[CameraStep]
    families: Optional[FamilySplit]

    def against_reference(self) -> List[AgainstReference]:
        g, out = self.group, []
        for table, found in (("main", self.seeds.vs_reference), ("heterogeneous", self.bench_full)):
            for m, comparison in found.items():
                row = g.archives[0].row(m) if table == "main" else g.archives[0].bench_row(m)
                out.append(AgainstReference(g.protocol, table, m, g.name(m, table), g.name(REFERENCE, table),
                                            {t: comparison.at(t) for t in AGAINST_THRESHOLDS}, row.id_derived))
        return out


@dataclass
class FairGroup:
    """One protocol of the combined archive: its seeds and what each seed's archive says it came from."""

    protocol: str
    seeds: List[int]
    archives: List[dict]  # {seed, commit, command, profile, data_seed}

    def to_json(self) -> dict:
        return {"protocol": self.protocol, "seeds": self.seeds, "archives": self.archives}


@dataclass
class FairResults:
    """What results.json keeps (``groups``, ``rows`` with their records relative to the combined folder,
    ``checks``, ``camera``, ``against_gencomm``, ``resamples``) and, when computed from the archives, every
    comparison behind REPORT.md (``computed``, one per protocol; not in results.json)."""

    groups: List[FairGroup]
    rows: List[ResultRow]
    checks: List[Check]
    camera: List[CameraStep]
    against_gencomm: List[AgainstReference]
    resamples: int
    computed: List[GroupResults] = field(default_factory=list, compare=False, repr=False)

    def to_json(self) -> dict:
        return {"groups": [g.to_json() for g in self.groups], "rows": [r.to_combined() for r in self.rows],
                "checks": [c.to_json() for c in self.checks], "camera": [c.to_json() for c in self.camera],
                "against_gencomm": [a.to_json() for a in self.against_gencomm], "resamples": self.resamples}

    def rows_of(self, protocol: str, table: str) -> Dict[str, List[ResultRow]]:
        """The rows of one protocol and table by method id (in results.json's order), one per seed."""
        out: Dict[str, List[ResultRow]] = {}
        for r in self.rows:
            if r.protocol == protocol and r.table == table:
                out.setdefault(r.method_id, []).append(r)
        return out

    @classmethod
    def from_json(cls, doc, source: str) -> "FairResults":
        """What results.json keeps (``computed`` empty); a malformed file raises ResultsError naming it."""
        if not isinstance(doc, dict):
            raise ResultsError(f"{source}: not a fair benchmark results.json (expected a JSON object)")
        for key in ("groups", "rows", "against_gencomm"):
            if key not in doc:
                raise ResultsError(f"{source}: no field '{key}' (combine the seed archives again with "
                                   "tools/fair_benchmark.py)")
        rows = validated(_Rows, {"rows": [_combined_row_fields(r, f"rows.{k}", source) for k, r in
                                          enumerate(doc["rows"])]}, source).rows
        for row, r in zip(rows, doc["rows"]):
            row.id_derived = "method_id" not in r
        try:
            groups = [FairGroup(g["protocol"], g["seeds"], g.get("archives", [])) for g in doc["groups"]]
            against = [AgainstReference.from_json(a, source) for a in doc["against_gencomm"]]
        except (KeyError, TypeError, IndexError) as exc:
            raise ResultsError(f"{source}: missing or malformed field {exc!r}") from None
        return cls(groups, rows, [], [], against, doc.get("resamples", 0))


@dataclass
class _Rows:
    rows: List[ResultRow]


def _combined_row_fields(doc, key: str, source: str) -> dict:
    """A fair results.json row as :class:`ResultRow`'s fields (its records' paths are the combined folder's)."""
    if not isinstance(doc, dict):
        return doc
    table = doc.get("table", "main")
    out = dict(doc)
    if "method_id" not in doc:
        found = legacy_method_id(doc.get("method", ""), table, doc.get("onboard_method"))
        if found is None:
            raise ResultsError(f"{source}: key '{key}.method_id': missing, and {doc.get('method')!r} is no method "
                               "this code ever named")
        out["method_id"] = found
    for name in ("eval", "ego_only"):
        if isinstance(doc.get(name), dict):
            out[name] = Evaluation.archive_fields(doc[name])
    if isinstance(doc.get("alliances"), list):
        out["alliances"] = [{"types": a.get("types"), "eval": Evaluation.archive_fields(a)}
                            if isinstance(a, dict) else a for a in doc["alliances"]]
    return out


def _combined(row: ResultRow, where: str) -> ResultRow:
    """An archive's row with its records' paths under the combined folder (``where``: the archive's folder there)."""
    def moved(ev: Optional[Evaluation]) -> Optional[Evaluation]:
        return None if ev is None else dataclasses.replace(ev, records=f"{where}/{ev.records}")
    alliances = None if row.alliances is None else [dataclasses.replace(a, eval=moved(a.eval)) for a in row.alliances]
    out = dataclasses.replace(row, eval=moved(row.eval), ego_only=moved(row.ego_only), alliances=alliances,
                              epochs={})
    out.id_derived = row.id_derived
    return out


def _checks(g: Group, resamples: int) -> List[Check]:
    """The issue's acceptance comparisons at AP@0.5, each pooled and per seed: full-feature intermediate
    minus no fusion (main table), and every onboarding method's {m1} minus no fusion twice: against the
    benchmark's no-fusion row (the ego's stage-1 model with its collaborators off) and against the main
    table's no fusion (a model trained alone; the same ego LiDAR, test frames and ground truth)."""
    main, bench = g.main_methods(), g.bench_methods()
    items = [] if INTERMEDIATE not in main or NO_FUSION not in main else [
        (g.name(INTERMEDIATE), g.name(NO_FUSION), "main table", main_getter(INTERMEDIATE), main_getter(NO_FUSION))]
    for m in bench:
        if m in NOT_ONBOARDING:
            continue
        name = g.name(m, "heterogeneous")
        if NONE_OF_STAGE1 in bench:
            items.append((name, g.name(NONE_OF_STAGE1, "heterogeneous"), "benchmark, ego alliance alone",
                          bench_getter(m, 0), bench_getter(NONE_OF_STAGE1, 0)))
        if NO_FUSION in main:
            items.append((name, f"{g.name(NO_FUSION)} (main table, trained alone)",
                          "benchmark {m1} against the main table", bench_getter(m, 0), main_getter(NO_FUSION)))
    out = []
    for a, b, where, ga, gb in items:
        found = compare(g, ga, gb, resamples)
        if found is not None:
            at = found.at(CHECK_THRESHOLD)
            at_least = bool(at.diff >= 0 and all(d >= 0 for _, d, _ in at.per_seed))
            out.append(Check(g.protocol, f"{a} minus {b}", where, at, at_least, at.every_seed and at.diff > 0))
    return out


def camera_methods(g: Group) -> List[str]:
    """The benchmark rows the camera question asks about: all but no fusion (every alliance is the ego alone)."""
    return [m for m in g.bench_methods() if m != NONE_OF_STAGE1]


def full_types(g: Group) -> List[str]:
    methods = g.bench_methods()
    return g.archives[0].bench_row(methods[0]).alliances[-1].types if methods else []


def scored_epochs(g: Group, method_id: str) -> List[int]:
    """The onboarding epochs of ``method_id`` scored in every seed of ``g``."""
    found = [set(a.bench_row(method_id).epochs) for a in g.archives]
    return sorted(set.intersection(*found)) if found else []


def _camera(g: Group, resamples: int) -> List[CameraStep]:
    """Every (method, camera step, weights) difference: the selected weights, then each scored epoch's."""
    out = []
    steps = camera_steps(full_types(g))
    for m in camera_methods(g):
        derived = g.archives[0].bench_row(m).id_derived
        for weights, epoch in [("selected", None)] + [(epoch_checkpoint(n), n) for n in scored_epochs(g, m)]:
            for name, alliance, before in steps:
                found = compare(g, alliance_getter(m, alliance, epoch), alliance_getter(m, before, epoch), resamples)
                if found is not None:
                    out.append(CameraStep(g.protocol, m, g.name(m, "heterogeneous"), name, weights,
                                          found.at(CAMERA_THRESHOLD), derived))
    return out


def _families(g: Group, resamples: int) -> Optional[FamilySplit]:
    fam = g.archives[0].meta.get("scene_families") or {}
    families = sorted(set(fam.values()))
    if len(families) < 2:
        return None
    parts = {f: [s for s, v in fam.items() if v == f] for f in families}
    main, bench = g.main_methods(), g.bench_methods()
    getters = {("main", m): main_getter(m) for m in main}
    getters.update({("benchmark", m): bench_getter(m) for m in bench})
    refs = {"main": REFERENCE if REFERENCE in main else None, "benchmark": REFERENCE if REFERENCE in bench else None}
    split = FamilySplit(parts, list(getters), {}, {})
    for (table, m), get in getters.items():
        split.aps[table, m] = {}
        split.vs_reference[table, m] = {}
        for f in families:
            aps = []
            for a in g.archives:
                part = get(a).subset(parts[f])
                aps.append(float(bootstrap_ap(part, 1).ap["global"][threshold_index(part.thresholds, "0.5")]))
            split.aps[table, m][f] = aps
            ref = refs[table]
            split.vs_reference[table, m][f] = None if ref is None or ref == m else \
                compare(g, get, getters[table, ref], resamples, parts[f])
    if LATE in main and INTERMEDIATE in main:
        for name, scenes in [*parts.items(), ("all", None)]:
            split.ordering[name] = compare(g, main_getter(LATE), main_getter(INTERMEDIATE), resamples, scenes)
    return split


def compute_group(g: Group, resamples: int) -> GroupResults:
    """Every comparison of one protocol, each once."""
    bench = g.bench_methods()
    first, full = {}, {}
    for m in bench if REFERENCE in bench else []:
        if m != REFERENCE:
            first[m] = compare(g, bench_getter(m, 0), bench_getter(REFERENCE, 0), resamples)
            full[m] = compare(g, bench_getter(m), bench_getter(REFERENCE), resamples)
    return GroupResults(g, seed_comparisons(g, resamples), first, full, _checks(g, resamples), _camera(g, resamples),
                        _families(g, resamples))


def compute(groups: List[Group], resamples: int) -> FairResults:
    """:class:`FairResults` of the combined archive's protocols (``groups``, equalized first)."""
    computed = [compute_group(g, resamples) for g in groups]
    meta = [FairGroup(g.protocol, g.seeds, [{"seed": a.seed, "commit": a.meta.get("commit"),
                                              "command": a.meta.get("command"), "profile": a.meta.get("profile"),
                                              "data_seed": a.meta.get("data_seed")} for a in g.archives])
            for g in groups]
    rows = [_combined(r, f"{g.protocol}/seed{a.seed}") for g in groups for a in g.archives
            for r in [*a.rows, *a.benchmark]]
    return FairResults(meta, rows, [c for r in computed for c in r.checks], [c for r in computed for c in r.camera],
                       [x for r in computed for x in r.against_reference()], resamples, computed)
