"""What the fair benchmark's sections share (:mod:`experiments.fair`, :mod:`experiments.fair_camera`):
the seed archives of one protocol (:class:`Group`), getters of one row's per-frame records in a seed
archive, and the paired comparison of two getters over a group's seeds, per seed and pooled
(:func:`~opencood_ext.eval.bootstrap.pooled_paired_difference`: its interval covers the test scenes,
not the seeds)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from opencood_ext.eval.bootstrap import paired_difference, pooled_paired_difference
from opencood_ext.eval.records import FrameRecords

from .archives import SeedArchive, load_archive, load_archives
from .seeds import holds_every_seed
from .tables import paired_cell, threshold_index


@dataclass
class Group:
    """The seed archives of one protocol (same profile, data seed and test frames)."""

    protocol: str
    archives: List[SeedArchive]

    @property
    def seeds(self) -> List[int]:
        return [a.seed for a in self.archives]

    def name(self, method_id: str, table: str = "main") -> str:
        """The display name of the row ``method_id`` of ``table`` (the first seed's)."""
        a = self.archives[0]
        return (a.row(method_id) if table == "main" else a.bench_row(method_id)).method


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
    """The archives at ``folders`` grouped by protocol, each group checked as one experiment."""
    by: Dict[str, List[Path]] = {}
    for f in folders:
        by.setdefault(protocol_of(load_archive(f)), []).append(Path(f))
    return [Group(p, load_archives(fs)) for p, fs in sorted(by.items(), key=lambda kv: kv[0] != "equalized")]


Getter = Callable[[SeedArchive], Optional[FrameRecords]]


def main_getter(method: str, key: str = "eval") -> Getter:
    def get(a: SeedArchive):
        r = a.row(method)
        return None if r is None else a.records(r, key)
    return get


def bench_getter(method: str, alliance: Optional[int] = None) -> Getter:
    """Records of benchmark row ``method``'s alliance number ``alliance`` (None: the full one)."""
    def get(a: SeedArchive):
        r = a.bench_row(method)
        return None if r is None else a.load(r.alliances[-1 if alliance is None else alliance].eval)
    return get


def alliance_getter(method: str, types: Sequence[str], epoch: Optional[int] = None) -> Getter:
    """Records of benchmark row ``method``'s alliance ``types`` (ego first), with the selected weights or
    with epoch ``epoch``'s (rows whose job scored their epochs); None where the archive lacks it."""
    def get(a: SeedArchive):
        r = a.bench_row(method)
        found = None if r is None else r.alliance(types, epoch)
        return None if found is None else a.load(found.eval)
    return get


def compare(group: Group, a: Getter, b: Getter, resamples: int, scenes: Optional[Sequence[str]] = None):
    """(per-seed differences, pooled difference) of ``a`` minus ``b`` over the group's seeds, on the test
    scenes ``scenes`` only when given; None when a seed lacks either side."""
    pairs = []
    for arc in group.archives:
        x, y = a(arc), b(arc)
        if x is None or y is None:
            return None
        if scenes is not None:
            x, y = x.subset(scenes), y.subset(scenes)
        pairs.append((x, y))
    return [paired_difference(x, y, resamples) for x, y in pairs], pooled_paired_difference(pairs, resamples)


def diff_cell(per_seed, pooled, thr: str) -> str:
    """``+0.021 [+0.00, +0.04]; +0.030*, +0.010, +0.022*``: pooled with its interval, bold when it
    excludes 0, then each seed (* when that seed's interval excludes 0)."""
    return entry_cell(diff_json(range(len(per_seed)), per_seed, pooled, thr))


def entry_cell(c: Optional[dict]) -> str:
    """A :func:`diff_json` entry as the cell :func:`diff_cell` writes; "-" when absent."""
    if c is None:
        return "-"
    p = c["pooled"]
    return paired_cell(p["diff"], p["ci"][0], p["ci"][1], p["significant"],
                       [(v["diff"], v["significant"]) for v in c["per_seed"].values()])



def _common(archives: Sequence[SeedArchive], names: Callable[[SeedArchive], List[str]]) -> List[str]:
    """Names present in every archive, in the first one's order."""
    return [m for m in names(archives[0]) if all(m in names(a) for a in archives[1:])]


def main_methods(group: Group) -> List[str]:
    """The ids of the main-table rows every seed of ``group`` has, in the first seed's order."""
    return _common(group.archives, lambda a: [r.method_id for r in a.rows])


def bench_methods(group: Group) -> List[str]:
    return _common(group.archives, lambda a: [r.method_id for r in a.benchmark])


def diff_json(seeds: Sequence[int], per_seed, pooled, thr: str = "0.5") -> dict:
    """A comparison as results.json keeps it: the pooled difference with its interval and whether it
    excludes 0, each seed's (keyed by ``seeds``) with whether its interval does, and whether that holds
    in every seed (:func:`holds_every_seed`)."""
    k = threshold_index(pooled.thresholds, thr)
    return {"threshold": thr,
            "pooled": {"diff": float(pooled.diff["global"][k]),
                       "ci": [float(pooled.lo["global"][k]), float(pooled.hi["global"][k])],
                       "significant": bool(pooled.significant("global")[k])},
            "per_seed": {str(s): {"diff": float(p.diff["global"][k]), "significant": bool(p.significant("global")[k])}
                         for s, p in zip(seeds, per_seed)},
            "significant_every_seed": holds_every_seed(per_seed, pooled, thr)}
