"""Paired comparisons over training seeds, computed once and kept as typed objects that every report
renders (the seed section of REPORT.md and docs/results.md, the fair benchmark's REPORT.md, results.json
and the README's tables).

A comparison is ``AP(a) - AP(b)`` on the same test frames: per training seed with its own 95 %
scene-bootstrap interval (:func:`~opencood_ext.eval.bootstrap.paired_difference`) and pooled over
seeds (:func:`~opencood_ext.eval.bootstrap.pooled_paired_difference`: the mean of the per-seed
differences with an interval over scene draws shared by every seed, so it covers the test scenes, not
the seeds). :class:`Paired` holds one comparison at every evaluated threshold, :class:`PairedAt` one
threshold of it; a difference "holds in every seed" when every seed's own interval excludes 0 with the
pooled difference's sign (:func:`holds_every_seed`).

:class:`Group` is the seed archives of one experiment (one protocol of the fair benchmark), its rows
found by method id; :class:`SeedComparisons` is what the seed section shows of a group: the spread of
AP over seeds, every main-table row against GenComm, and what cooperation adds to each row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from opencood_ext.eval.bootstrap import PairedDifference, paired_difference, pooled_paired_difference
from opencood_ext.eval.records import FrameRecords

from .archives import SeedArchive, load_archive, load_archives
from .method_ids import REFERENCE
from .tables import diff_cell, mean_std, paired_cell, threshold_index

THRESHOLDS = ("0.3", "0.5", "0.7")


def holds_every_seed(per_seed: Sequence[PairedDifference], pooled: PairedDifference, thr: str) -> bool:
    """Every seed's interval excludes 0 with the pooled difference's sign."""
    k = threshold_index(pooled.thresholds, thr)
    sign = np.sign(pooled.diff["global"][k])
    return bool(sign != 0 and all(p.significant("global")[k] and np.sign(p.diff["global"][k]) == sign
                                  for p in per_seed))


@dataclass
class PairedAt:
    """One threshold of a comparison (global order): the pooled difference, its interval and whether that
    excludes 0; each seed's difference and whether its own interval does; whether that holds in every
    seed with the pooled sign (``every_seed``)."""

    threshold: str
    diff: float
    lo: float
    hi: float
    significant: bool
    per_seed: List[Tuple[int, float, bool]]  # (seed, difference, its interval excludes 0)
    every_seed: bool

    @property
    def side(self) -> str:
        return "above" if self.diff > 0 else "below" if self.diff < 0 else "equal to"

    def cell(self) -> str:
        """``+0.021 [+0.00, +0.04]; +0.030*, +0.010, +0.022*`` (:func:`~experiments.tables.paired_cell`)."""
        return paired_cell(self.diff, self.lo, self.hi, self.significant, [(d, s) for _, d, s in self.per_seed])

    def pooled_cell(self) -> str:
        """The pooled difference alone (:func:`~experiments.tables.diff_cell`)."""
        return diff_cell(self.diff, self.lo, self.hi, self.significant)

    def to_json(self) -> dict:
        """As the fair benchmark's results.json keeps a comparison."""
        return {"threshold": self.threshold,
                "pooled": {"diff": self.diff, "ci": [self.lo, self.hi], "significant": self.significant},
                "per_seed": {str(s): {"diff": d, "significant": sig} for s, d, sig in self.per_seed},
                "significant_every_seed": self.every_seed}

    @classmethod
    def from_json(cls, doc: dict) -> "PairedAt":
        p = doc["pooled"]
        return cls(doc["threshold"], p["diff"], p["ci"][0], p["ci"][1], p["significant"],
                   [(int(s), v["diff"], v["significant"]) for s, v in doc["per_seed"].items()],
                   doc["significant_every_seed"])


@dataclass
class Paired:
    """``a`` minus ``b`` on the same test frames, per training seed (``seeds``, ``per_seed``) and pooled."""

    seeds: List[int]
    per_seed: List[PairedDifference]
    pooled: PairedDifference

    def at(self, thr: str) -> PairedAt:
        k = threshold_index(self.pooled.thresholds, thr)
        p = self.pooled
        return PairedAt(thr, float(p.diff["global"][k]), float(p.lo["global"][k]), float(p.hi["global"][k]),
                        bool(p.significant("global")[k]),
                        [(s, float(d.diff["global"][k]), bool(d.significant("global")[k]))
                         for s, d in zip(self.seeds, self.per_seed)],
                        holds_every_seed(self.per_seed, p, thr))


def paired(seeds: Sequence[int], pairs: Sequence[Tuple[FrameRecords, FrameRecords]], resamples: int) -> Paired:
    """The comparison of ``pairs`` (one (a, b) per seed, in ``seeds``' order)."""
    return Paired(list(seeds), [paired_difference(a, b, resamples) for a, b in pairs],
                  pooled_paired_difference(pairs, resamples))


@dataclass
class Group:
    """The seed archives of one experiment (same profile, data seed and test frames; one protocol, None
    when the archives predate the rows' protocol)."""

    protocol: Optional[str]
    archives: List[SeedArchive]

    @property
    def seeds(self) -> List[int]:
        return [a.seed for a in self.archives]

    def name(self, method_id: str, table: str = "main") -> str:
        """The display name of the row ``method_id`` of ``table`` (the first seed's)."""
        a = self.archives[0]
        return (a.row(method_id) if table == "main" else a.bench_row(method_id)).method

    def main_methods(self) -> List[str]:
        """The ids of the main-table rows every seed has, in the first seed's order."""
        return _common(self.archives, lambda a: [r.method_id for r in a.rows])

    def bench_methods(self) -> List[str]:
        """The ids of the benchmark rows every seed has, in the first seed's order."""
        return _common(self.archives, lambda a: [r.method_id for r in a.benchmark])


def _common(archives: Sequence[SeedArchive], ids: Callable[[SeedArchive], List[str]]) -> List[str]:
    return [m for m in ids(archives[0]) if all(m in ids(a) for a in archives[1:])]


def protocol_of(archive: SeedArchive) -> str:
    """The one protocol every row of ``archive`` states; ValueError naming the file otherwise."""
    found = {r.protocol for r in [*archive.rows, *archive.benchmark]}
    if None in found:
        raise ValueError(f"{archive.folder / 'rows.json'}: a row has no field 'protocol' (a version-1 archive: "
                         "archive the run again with gencomm-seed-report archive)")
    if len(found) != 1:
        raise ValueError(f"{archive.folder / 'rows.json'}: rows of several protocols ({', '.join(sorted(found))})")
    return found.pop()


def group_by_protocol(folders: Sequence) -> List[Group]:
    """The archives at ``folders`` grouped by protocol (``equalized`` first), each checked as one experiment."""
    by: Dict[str, List[Path]] = {}
    for f in folders:
        by.setdefault(protocol_of(load_archive(f)), []).append(Path(f))
    return [Group(p, load_archives(fs)) for p, fs in sorted(by.items(), key=lambda kv: kv[0] != "equalized")]


Getter = Callable[[SeedArchive], Optional[FrameRecords]]


def main_getter(method_id: str, key: str = "eval") -> Getter:
    """Records of main-table row ``method_id``'s evaluation ``key`` ("eval" or "ego_only")."""
    def get(a: SeedArchive):
        r = a.row(method_id)
        return None if r is None else a.records(r, key)
    return get


def bench_getter(method_id: str, alliance: Optional[int] = None) -> Getter:
    """Records of benchmark row ``method_id``'s alliance number ``alliance`` (None: the full one)."""
    def get(a: SeedArchive):
        r = a.bench_row(method_id)
        return None if r is None else a.load(r.alliances[-1 if alliance is None else alliance].eval)
    return get


def alliance_getter(method_id: str, types: Sequence[str], epoch: Optional[int] = None) -> Getter:
    """Records of benchmark row ``method_id``'s alliance ``types`` (ego first), with the selected weights or
    epoch ``epoch``'s (rows whose job scored their epochs); None where the archive lacks it."""
    def get(a: SeedArchive):
        r = a.bench_row(method_id)
        found = None if r is None else r.alliance(types, epoch)
        return None if found is None else a.load(found.eval)
    return get


def compare(group: Group, a: Getter, b: Getter, resamples: int,
            scenes: Optional[Sequence[str]] = None) -> Optional[Paired]:
    """``a`` minus ``b`` over the group's seeds, on the test scenes ``scenes`` only when given; None when a
    seed lacks either side."""
    pairs = []
    for arc in group.archives:
        x, y = a(arc), b(arc)
        if x is None or y is None:
            return None
        if scenes is not None:
            x, y = x.subset(scenes), y.subset(scenes)
        pairs.append((x, y))
    return paired(group.seeds, pairs, resamples)


@dataclass
class SpreadRow:
    """One main-table row's AP over seeds: ``aps`` {seed: {threshold: AP}} (global order)."""

    method_id: str
    method: str
    aps: Dict[int, Dict[str, float]]

    def mean_std(self, thr: str) -> Tuple[float, float]:
        return mean_std([ap[thr] for ap in self.aps.values()])


@dataclass
class SeedComparisons:
    """What the seed section shows of a group of seed archives: every main-table row's AP per seed
    (``spread``), each row minus the reference row (``vs_reference``, by method id; the reference is
    GenComm's row when present), and what cooperation adds to each row: the same weights with the
    collaborators on minus off (``cooperation``; rows evaluated once, as no fusion, left out)."""

    group: Group
    spread: List[SpreadRow]
    reference: Optional[str]
    vs_reference: Dict[str, Paired] = field(default_factory=dict)
    cooperation: Dict[str, Paired] = field(default_factory=dict)

    def name(self, method_id: str) -> str:
        return self.group.name(method_id)


def spread_of(group: Group) -> List[SpreadRow]:
    """Every main-table row's global AP per seed."""
    return [SpreadRow(m, group.name(m), {a.seed: a.row(m).eval.ap["global"] for a in group.archives})
            for m in group.main_methods()]


def spread_rows_json(spread: Sequence[SpreadRow]) -> List[dict]:
    """Per row: global AP of every seed, and mean / sample std over seeds per IoU threshold (results.json's
    ``seed_spread``, ``gencomm-seed-report report --json``)."""
    out = []
    for r in spread:
        entry = {"method": r.method, "seeds": {str(s): ap for s, ap in r.aps.items()}}
        for t in THRESHOLDS:
            mean, std = r.mean_std(t)
            entry[t] = {"mean": mean, "std": std}
        out.append(entry)
    return out


def seed_comparisons(group: Group, resamples: int = 1000) -> SeedComparisons:
    """Every comparison the seed section shows, computed once for ``group``."""
    arcs = group.archives
    methods = group.main_methods()
    ref = REFERENCE if REFERENCE in methods else None
    out = SeedComparisons(group, spread_of(group), ref)
    for m in methods if ref is not None else []:
        if m != ref:
            out.vs_reference[m] = compare(group, main_getter(m), main_getter(ref), resamples)
    for m in methods:
        if all(a.row(m).eval.records == a.row(m).ego_only.records for a in arcs):
            continue  # no fusion: its own ego-only evaluation
        out.cooperation[m] = compare(group, main_getter(m), main_getter(m, "ego_only"), resamples)
    return out
