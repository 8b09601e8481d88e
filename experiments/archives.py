"""Seed archives: one training seed's rows, kept small enough to commit and combine later.

One training seed of the main job costs about an hour on a 2-core CPU, so the three seeds a
run-to-run spread needs may be trained on different days or machines. Each seed therefore leaves
a small archive (tens of kB)::

    <dir>/seed<s>/rows.json          meta (training seed, data seed, profile, commit, command, the test
                                     scenes' families), one entry per main-table row ("rows") and, from
                                     version 2, one per benchmark row ("benchmark"), each with its
                                     protocol, training seed and optimizer steps
    <dir>/seed<s>/row<k>.npz         the row's per-frame records (opencood_ext.eval.records)
    <dir>/seed<s>/row<k>_ego_only.npz   the same weights with the collaborators off
    <dir>/seed<s>/bench<k>_<types>.npz  benchmark row k's records for the alliance <types> (m1m3, ...)

Every row is a :class:`~experiments.results.ResultRow` whose evaluations'
``records`` are file names in the archive folder. :func:`archive_seed` writes one from a main job's
rows (the main job does it for every seed, into ``<out>/seeds``); :func:`load_archive` reads one,
validated by the config loader (errors name the file and the key); :func:`load_archives` checks that
several are one experiment.
"""
from __future__ import annotations

import datetime
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from opencood_ext.eval.records import FrameRecords
from opencood_ext.sim.families import scenario_families

from .evaluation import Alliance, Evaluation, ResultsError, field_error
from .report_epochs import scored_run
from .results import ResultRow, mark_derived_ids, validated, with_method_id

ARCHIVE_VERSION = 2  # 2 added the benchmark rows, each row's protocol / seed / steps and scene_families
READS = (1, 2)


def git_commit(root: Path) -> Optional[str]:
    """HEAD of the checkout at ``root``, None when ``root`` is not a git checkout (an installed package)."""
    if not (Path(root) / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _copy_eval(ev: Evaluation, src: Optional[Path], tmp: Path, name: str, what: str) -> Evaluation:
    """``ev`` as the archive keeps it, its per-frame records copied into the archive folder ``tmp`` as ``name``."""
    if src is None or not src.is_file():
        raise FileNotFoundError(f"{what} {str(src) if src else None!r} is missing; evaluate the run again "
                                "(gencomm-infer writes it) before archiving")
    shutil.copyfile(src, tmp / name)
    return Evaluation(ap=ev.ap, records=name, ap_ci=ev.ap_ci, bytes_per_message=ev.bytes_per_message,
                      recall_by_visibility=ev.recall_by_visibility)


def _archived_alliances(entries: Sequence[Alliance], run: Optional[str], tmp: Path, prefix: str,
                        what: str) -> List[Alliance]:
    """A growing-alliance table's entries with each alliance's records copied as ``<prefix>_<types>.npz``.
    A row evaluated once for every alliance (no fusion: the ego alone) has one records file, which its
    alliances share."""
    alliances: List[Alliance] = []
    for a in entries:
        src = a.eval.records_path(run) if run else None
        same = next((x for x in alliances if x.eval.ap == a.eval.ap), None)
        if (src is None or not src.is_file()) and same is not None:
            alliances.append(Alliance(list(a.types), same.eval))
            continue
        ev = _copy_eval(a.eval, src, tmp, f"{prefix}_{''.join(a.types)}.npz",
                        f"{what}: the frames file of alliance {'+'.join(a.types)}")
        alliances.append(Alliance(list(a.types), ev))
    return alliances


def _benchmark_entry(k: int, r: ResultRow, tmp: Path) -> ResultRow:
    """Benchmark row ``r`` with each alliance's records copied as ``bench<k>_<types>.npz``, and, when the
    job scored its onboarding's kept epochs (``--score_epochs``), each epoch's as ``bench<k>_e<n>_<types>.npz``."""
    what = f"benchmark row {r.method!r}"
    alliances = _archived_alliances(r.alliances or [], r.run, tmp, f"bench{k}", what)
    if not alliances:
        raise ValueError(f"{what} has no evaluation per alliance (dynamic) to archive")
    epochs, best = {}, None
    scored = scored_run(r.method, Path(r.run)) if r.run and r.onboard_method and Path(r.run).is_dir() else None
    if scored is not None:
        for n, found in sorted(scored.epochs.items()):
            epochs[n] = _archived_alliances(found, r.run, tmp, f"bench{k}_e{n}", f"{what}, epoch {n}")
        best = scored.best_epoch
    return ResultRow(r.method_id, r.method, alliances[-1].eval, table="heterogeneous", alliances=alliances,
                     onboard_method=r.onboard_method, trainable_params=r.trainable_params,
                     train_wall_s=r.train_wall_s, protocol=r.protocol, training_seed=r.training_seed,
                     optimizer_steps=r.optimizer_steps, epochs=epochs, best_epoch=best)


def archive_seed(rows: Sequence[ResultRow], seed: int, dest: Path, meta: Optional[dict] = None,
                 test_root: Optional[Path] = None) -> Path:
    """Write ``dest/seed<seed>/`` from ``rows``: the main table's (their ``eval`` and ``ego_only`` with
    their records, ``trainable_params``, ``train_wall_s``, protocol, training seed and optimizer steps)
    and the benchmark's (each alliance's evaluation with its records); returns the folder.
    ``test_root``: the data the rows were evaluated on, whose test scenes' families
    (:func:`opencood_ext.sim.families.scenario_families`) the archive keeps as ``scene_families``.

    Rows without per-frame records raise (the archive would not support the paired statistics)."""
    folder = Path(dest) / f"seed{seed}"
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    entries, bench = [], []
    try:
        for k, r in enumerate(r for r in rows if r.table == "main"):
            ev = _copy_eval(r.eval, r.eval.records_path(r.run), tmp, f"row{k}.npz",
                            f"row {r.method!r}: eval.frames_file")
            own = r.ego_only.records_path(r.run) if r.ego_only is not None else None
            if own is not None and own == r.eval.records_path(r.run):
                solo = ev  # no fusion: its own evaluation has no collaborators to switch off
            else:
                solo = _copy_eval(r.ego_only, own, tmp, f"row{k}_ego_only.npz",
                                  f"row {r.method!r}: ego_only.frames_file")
            entries.append(ResultRow(r.method_id, r.method, ev, ego_only=solo, trainable_params=r.trainable_params,
                                     train_wall_s=r.train_wall_s, protocol=r.protocol, training_seed=r.training_seed,
                                     optimizer_steps=r.optimizer_steps).to_archive())
        bench = [_benchmark_entry(k, r, tmp).to_archive()
                 for k, r in enumerate(r for r in rows if r.table == "heterogeneous")]
        families = None
        if test_root is not None:
            scenes = {s for name in tmp.glob("*.npz") for s in FrameRecords.load(name).scene_ids}
            families = scenario_families(test_root, sorted(scenes))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    doc = {"version": ARCHIVE_VERSION, "seed": int(seed), **(meta or {}),
           # the code that trained the runs: the caller's when it knows it, else this checkout's
           "commit": meta["commit"] if meta and "commit" in meta else git_commit(Path(__file__).resolve().parents[1]),
           "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "rows": entries, "benchmark": bench}
    if families is not None:
        doc["scene_families"] = families
    (tmp / "rows.json").write_text(json.dumps(doc, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


@dataclass
class SeedArchive:
    """One training seed's main-table rows and (version 2) benchmark rows, read from an archive folder;
    rows are found by their method id."""

    folder: Path
    seed: int
    meta: dict
    rows: List[ResultRow]
    benchmark: List[ResultRow] = field(default_factory=list)

    def row(self, method_id: str) -> Optional[ResultRow]:
        return next((r for r in self.rows if r.method_id == method_id), None)

    def bench_row(self, method_id: str) -> Optional[ResultRow]:
        return next((r for r in self.benchmark if r.method_id == method_id), None)

    def records(self, row: ResultRow, key: str = "eval") -> FrameRecords:
        """The per-frame records of ``row``'s evaluation ``key`` ("eval" or "ego_only")."""
        return self.load(row.eval if key == "eval" else row.ego_only)

    def load(self, ev: Evaluation) -> FrameRecords:
        """The per-frame records of an evaluation of this archive."""
        return ev.load_records(self.folder)

    def test_frames(self) -> set:
        """The keys (``scene/timestamp``) of the test frames its rows were evaluated on."""
        return set(self.records(self.rows[0]).frames.tolist())


@dataclass
class _ArchiveRows:
    """What the loader validates of a rows.json: its main-table and benchmark rows."""

    rows: List[ResultRow]
    benchmark: List[ResultRow] = field(default_factory=list)


def _archive_alliances(items, key: str, source: str):
    if isinstance(items, list):
        if not items:
            raise field_error(source, key, "is empty (a benchmark row has one evaluation per growing alliance)")
        return [{**a, "eval": Evaluation.archive_fields(a["eval"])} if isinstance(a, dict)
                and isinstance(a.get("eval"), dict) else a for a in items]
    return items


def _archive_row_fields(doc, key: str, source: str, table: str) -> dict:
    """A rows.json row as :class:`ResultRow`'s fields (records: file names in the archive folder)."""
    if not isinstance(doc, dict):
        return doc
    for name in [n for n in ("eval", "ego_only") if table == "main"] + (["alliances"] if table != "main" else []):
        if name not in doc:
            raise field_error(source, f"{key}.{name}", f"missing (a {table} row of a seed archive keeps it)")
    out = {**with_method_id(doc, key, source, table), "table": table}
    if table == "main":
        for name in ("eval", "ego_only"):
            if isinstance(doc[name], dict):
                out[name] = Evaluation.archive_fields(doc[name])
        return out
    out["alliances"] = _archive_alliances(doc["alliances"], f"{key}.alliances", source)
    if isinstance(out["alliances"], list) and isinstance(out["alliances"][-1], dict):
        out["eval"] = out["alliances"][-1].get("eval")
    if isinstance(doc.get("epochs"), dict):
        epochs = {}
        for n, found in doc["epochs"].items():
            if not n.isdigit():
                raise field_error(source, f"{key}.epochs", f"has key {n!r}, not an epoch number")
            epochs[int(n)] = _archive_alliances(found, f"{key}.epochs.{n}", source)
        out["epochs"] = epochs
    return out


def load_archive(folder) -> SeedArchive:
    """Read ``folder/rows.json``; errors name the file and the field."""
    path = Path(folder) / "rows.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no seed archive here (written by the main job in <out>/seeds/seed<s>/ "
                                "or by gencomm-seed-report archive)")
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{path}: not a JSON seed archive ({exc})") from None
    if not isinstance(doc, dict):
        raise ResultsError(f"{path}: not a seed archive (expected a JSON object)")
    for name in ("version", "seed", "rows"):
        if name not in doc:
            raise field_error(str(path), name, "missing")
    if doc["version"] not in READS:
        raise field_error(str(path), "version", f"is {doc['version']!r}; this code reads versions "
                          f"{', '.join(map(str, READS))}")
    if not isinstance(doc["seed"], int) or isinstance(doc["seed"], bool):
        raise field_error(str(path), "seed", f"expected an integer, got {doc['seed']!r}")
    shaped = {}
    for name, table in (("rows", "main"), ("benchmark", "heterogeneous")):
        items = doc.get(name, [])
        shaped[name] = [_archive_row_fields(r, f"{name}.{k}", str(path), table) for k, r in enumerate(items)] \
            if isinstance(items, list) else items
    found = validated(_ArchiveRows, shaped, str(path))
    mark_derived_ids(found.rows, doc["rows"])
    mark_derived_ids(found.benchmark, doc.get("benchmark"))
    meta = {k: v for k, v in doc.items() if k not in ("rows", "seed", "benchmark")}
    return SeedArchive(Path(folder), doc["seed"], meta, found.rows, found.benchmark)


def load_archives(folders: Sequence) -> List[SeedArchive]:
    """Archives sorted by seed; they must be the same experiment: same profile, data seed and test
    frames, and no seed twice."""
    archives = sorted((load_archive(f) for f in folders), key=lambda a: a.seed)
    if not archives:
        raise ValueError("no seed archives given")
    first = archives[0]
    frames0 = first.test_frames()
    for prev, a in zip(archives, archives[1:]):
        if a.seed == prev.seed:
            raise ValueError(f"seed {a.seed} twice: {prev.folder} and {a.folder}")
        for key in ("profile", "data_seed"):
            if a.meta.get(key) != first.meta.get(key):
                raise ValueError(f"{a.folder / 'rows.json'}: field {key!r} is {a.meta.get(key)!r}, but "
                                 f"{first.folder / 'rows.json'} has {first.meta.get(key)!r}: not the same experiment")
        frames = a.test_frames()
        if frames != frames0:
            raise ValueError(f"{a.folder}: its test frames differ from {first.folder}'s "
                             f"({len(frames)} vs {len(frames0)} frames): not the same test split")
    return archives
