"""Training seeds of the main table, kept and combined across invocations.

One training seed of the main job costs about an hour on a 2-core CPU, so the three seeds a
run-to-run spread needs may be trained on different days or machines. Each seed therefore leaves
a small archive (tens of kB) that can be committed and combined later::

    <dir>/seed<s>/rows.json          meta (training seed, data seed, profile, commit, command, the test
                                     scenes' families), one entry per main-table row ("rows") and, from
                                     version 2, one per benchmark row ("benchmark"), each with its
                                     protocol, training seed and optimizer steps
    <dir>/seed<s>/row<k>.npz         the row's per-frame records (opencood_ext.eval.records)
    <dir>/seed<s>/row<k>_ego_only.npz   the same weights with the collaborators off
    <dir>/seed<s>/bench<k>_<types>.npz  benchmark row k's records for the alliance <types> (m1m3, ...)

:func:`archive_seed` writes one from a main job's rows (the main job does it for every seed, into
``<out>/seeds``); :func:`seed_section` turns a set of archives into the report's spread section:
every row's AP per seed with mean and standard deviation, each row's paired difference against
GenComm per seed and pooled over seeds, what cooperation adds (same weights, collaborators off),
and which claims hold in every seed. ``gencomm-seed-report`` (from a checkout
``python tools/seed_report.py``) runs both from the command line.
"""
from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from opencood_ext.eval.bootstrap import paired_difference, pooled_paired_difference
from opencood_ext.eval.records import FrameRecords
from opencood_ext.run_folder import RunFolder, epoch_checkpoint, evaluation_label
from opencood_ext.sim.families import scenario_families

from .report_epochs import scored_run
from .results import (ArchivedAlliance, ArchivedBenchmarkRow, ArchivedEval, ArchivedRow, ResultRow, Results,
                      ResultsError)

THRESHOLDS = ("0.3", "0.5", "0.7")
REFERENCE = "GenComm"
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


def _copy_eval(ev: dict, src: Optional[str], tmp: Path, name: str, what: str) -> ArchivedEval:
    """Copy an evaluation's per-frame records into the archive folder ``tmp`` as ``name``."""
    if not src or not Path(src).is_file():
        raise FileNotFoundError(f"{what} {src!r} is missing; evaluate the run again (gencomm-infer writes it) "
                                "before archiving")
    shutil.copyfile(src, tmp / name)
    return ArchivedEval(ap=ev["ap"], ap_ci=ev.get("ap_ci"), frames=name, bytes_per_message=ev.get("bytes_per_message"),
                        recall_by_visibility=ev.get("recall_by_visibility"))


def _archived_alliances(entries: Sequence[dict], run: Optional[str], tmp: Path, prefix: str, what: str,
                        checkpoint: Optional[str] = None) -> List[ArchivedAlliance]:
    """A growing-alliance table's entries (``eval_dynamic[_<checkpoint>].json``) with each alliance's
    records copied as ``<prefix>_<types>.npz``. A row evaluated once for every alliance (no fusion: the
    ego alone) has one records file, which its alliances share."""
    alliances = []
    for d in entries:
        types = list(d["types"])
        src = RunFolder(run).frames(evaluation_label(alliance=types, checkpoint=checkpoint)) if run else None
        same = next((a for a in alliances if a.eval.ap == d["ap"]), None)
        if (src is None or not src.is_file()) and same is not None:
            alliances.append(ArchivedAlliance(types, same.eval))
            continue
        ev = _copy_eval(d, str(src) if src else None, tmp, f"{prefix}_{''.join(types)}.npz",
                        f"{what}: the frames file of alliance {'+'.join(types)}")
        alliances.append(ArchivedAlliance(types, ev))
    return alliances


def _benchmark_entry(k: int, r: ResultRow, tmp: Path) -> ArchivedBenchmarkRow:
    """Benchmark row ``r`` with each alliance's records copied as ``bench<k>_<types>.npz``, and, when the
    job scored its onboarding's kept epochs (``--score_epochs``), each epoch's as ``bench<k>_e<n>_<types>.npz``."""
    what = f"benchmark row {r.method!r}"
    alliances = _archived_alliances(r.dynamic or [], r.run, tmp, f"bench{k}", what)
    if not alliances:
        raise ValueError(f"{what} has no evaluation per alliance (dynamic) to archive")
    epochs, best = {}, None
    scored = scored_run(r.method, Path(r.run)) if r.run and r.onboard_method and Path(r.run).is_dir() else None
    if scored is not None:
        for n, entries in sorted(scored.epochs.items()):
            epochs[n] = _archived_alliances(entries, r.run, tmp, f"bench{k}_e{n}", f"{what}, epoch {n}",
                                            epoch_checkpoint(n))
        best = scored.best_epoch
    return ArchivedBenchmarkRow(r.method, alliances, onboard_method=r.onboard_method,
                                trainable_params=r.trainable_params, train_wall_s=r.train_wall_s,
                                protocol=r.protocol, training_seed=r.training_seed, optimizer_steps=r.optimizer_steps,
                                epochs=epochs, best_epoch=best)


def archive_seed(rows: Sequence[ResultRow], seed: int, dest: Path, meta: Optional[dict] = None,
                 test_root: Optional[Path] = None) -> Path:
    """Write ``dest/seed<seed>/`` from ``rows``: the main table's (their ``eval`` and ``ego_only`` with
    their ``frames_file``, ``trainable_params``, ``train_wall_s``, protocol, training seed and optimizer
    steps) and the benchmark's (each alliance's evaluation with its records); returns the folder.
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
            evals = {}
            for key, ev, suffix in (("eval", r.eval, ""), ("ego_only", r.ego_only or {}, "_ego_only")):
                if key == "ego_only" and ev.get("frames_file") == r.eval.get("frames_file"):
                    evals[key] = evals["eval"]  # no fusion: its own evaluation has no collaborators to switch off
                    continue
                evals[key] = _copy_eval(ev, ev.get("frames_file"), tmp, f"row{k}{suffix}.npz",
                                        f"row {r.method!r}: {key}.frames_file")
            entries.append(ArchivedRow(r.method, evals["eval"], evals["ego_only"], r.trainable_params, r.train_wall_s,
                                       protocol=r.protocol, training_seed=r.training_seed,
                                       optimizer_steps=r.optimizer_steps).to_dict())
        bench = [_benchmark_entry(k, r, tmp).to_dict() for k, r in enumerate(r for r in rows
                                                                            if r.table == "heterogeneous")]
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
    """One training seed's main-table rows and (version 2) benchmark rows, read from an archive folder."""

    folder: Path
    seed: int
    meta: dict
    rows: List[ArchivedRow]
    benchmark: List[ArchivedBenchmarkRow] = field(default_factory=list)

    def row(self, method: str) -> Optional[ArchivedRow]:
        return next((r for r in self.rows if r.method == method), None)

    def bench_row(self, method: str) -> Optional[ArchivedBenchmarkRow]:
        return next((r for r in self.benchmark if r.method == method), None)

    def records(self, row: ArchivedRow, key: str = "eval") -> FrameRecords:
        """The per-frame records of ``row``'s evaluation ``key`` ("eval" or "ego_only")."""
        return self.load(row.eval if key == "eval" else row.ego_only)

    def load(self, ev: ArchivedEval) -> FrameRecords:
        """The per-frame records of an archived evaluation of this archive."""
        return FrameRecords.load(self.folder / ev.frames)

    def test_frames(self) -> set:
        """The keys (``scene/timestamp``) of the test frames its rows were evaluated on."""
        return set(self.records(self.rows[0]).frames.tolist())


def load_archive(folder) -> SeedArchive:
    """Read ``folder/rows.json``; errors name the file and the field."""
    path = Path(folder) / "rows.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no seed archive here (written by the main job in <out>/seeds/seed<s>/ "
                                "or by gencomm-seed-report archive)")
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON seed archive ({exc})") from exc
    for name in ("version", "seed", "rows"):
        if name not in doc:
            raise ValueError(f"{path}: missing field {name!r}")
    if doc["version"] not in READS:
        raise ValueError(f"{path}: field 'version' is {doc['version']!r}; this code reads versions "
                         f"{', '.join(map(str, READS))}")
    for field_name in ("rows", "benchmark"):
        if not isinstance(doc.get(field_name, []), list):
            raise ValueError(f"{path}: field {field_name!r} must be a list")
    rows = [ArchivedRow.from_dict(r, f"rows[{k}].", str(path)) for k, r in enumerate(doc["rows"])]
    bench = [ArchivedBenchmarkRow.from_dict(r, f"benchmark[{k}].", str(path))
             for k, r in enumerate(doc.get("benchmark", []))]
    meta = {k: v for k, v in doc.items() if k not in ("rows", "seed", "benchmark")}
    return SeedArchive(Path(folder), int(doc["seed"]), meta, rows, bench)


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


def _methods(archives: Sequence[SeedArchive]) -> List[str]:
    """Rows present in every archive, in the first archive's order."""
    return [r.method for r in archives[0].rows if all(a.row(r.method) for a in archives)]


def _mean_std(values: Sequence[float]) -> tuple:
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def spread_json(archives: Sequence[SeedArchive]) -> List[dict]:
    """Per row: global AP of every seed, and mean / sample std over seeds per IoU threshold."""
    out = []
    for m in _methods(archives):
        aps = {str(a.seed): a.row(m).eval.ap["global"] for a in archives}
        entry = {"method": m, "seeds": aps}
        for t in THRESHOLDS:
            mean, std = _mean_std([ap[t] for ap in aps.values()])
            entry[t] = {"mean": mean, "std": std}
        out.append(entry)
    return out


def _cell(diff: float, lo: float, hi: float, bold: bool) -> str:
    text = f"{diff:+.3f} [{lo:+.2f}, {hi:+.2f}]"
    return f"**{text}**" if bold else text


def _k(d, thr: str) -> int:
    return [f"{t:g}" for t in d.thresholds].index(f"{float(thr):g}")


def holds_every_seed(per_seed, pooled, thr: str) -> bool:
    """Every seed's interval excludes 0 with the pooled difference's sign."""
    k = _k(pooled, thr)
    sign = np.sign(pooled.diff["global"][k])
    return bool(sign != 0 and all(p.significant("global")[k] and np.sign(p.diff["global"][k]) == sign
                                  for p in per_seed))


def _paired(archives, a_rows, b_rows, a_key="eval", b_key="eval", resamples=1000):
    """Per seed and pooled paired differences of rows a minus rows b (global order)."""
    pairs = [(arc.records(ra, a_key), arc.records(rb, b_key)) for arc, ra, rb in zip(archives, a_rows, b_rows)]
    per_seed = [paired_difference(a, b, resamples) for a, b in pairs]
    return per_seed, pooled_paired_difference(pairs, resamples)


def _paired_cells(per_seed, pooled) -> List[str]:
    """One cell per threshold: the pooled difference [interval] (bold when it excludes 0), then each seed's
    difference, starred when that seed's own interval excludes 0."""
    return [_cell(pooled.diff["global"][k], pooled.lo["global"][k], pooled.hi["global"][k],
                  bool(pooled.significant("global")[k])) + "; " + ", ".join(
                f"{p.diff['global'][k]:+.3f}" + ("*" if p.significant("global")[k] else "") for p in per_seed)
            for k in range(len(THRESHOLDS))]


def seed_section(archives: Sequence[SeedArchive], resamples: int = 1000) -> List[str]:
    """Markdown: the spread over training seeds, paired differences against GenComm per seed and pooled,
    what cooperation adds, and which claims hold in every seed."""
    seeds = [a.seed for a in archives]
    methods = _methods(archives)
    meta, test = archives[0].meta, archives[0].records(archives[0].rows[0])
    lines = ["## Run-to-run spread over training seeds", "",
             f"Training seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: every row trained from "
             "scratch once per seed on the same "
             f"data (profile `{meta.get('profile', '?')}`, data seed {meta.get('data_seed', '?')}, "
             f"{test.num_frames} test frames of {test.num_scenes} scenes). Per-seed archives: "
             + ", ".join(f"`{a.folder}` (commit {str(a.meta.get('commit') or '?')[:7]})" for a in archives) + ".", "",
             "| method | " + " | ".join(f"AP@{t}" + (" mean ± std" if len(seeds) > 1 else "") for t in THRESHOLDS)
             + " | AP@0.5 per seed |",
             "|---|---|---|---|---|"]
    for e in spread_json(archives):
        cells = [f"{e[t]['mean']:.3f}" + (f" ± {e[t]['std']:.3f}" if len(seeds) > 1 else "") for t in THRESHOLDS]
        lines.append(f"| {e['method']} | " + " | ".join(cells) + " | "
                     + ", ".join(f"{e['seeds'][str(s)]['0.5']:.3f}" for s in seeds) + " |")
    ref = next((m for m in methods if REFERENCE in m), None)
    verdicts: Dict[str, List[str]] = {"every": [], "pooled": [], "no": []}
    if ref is not None:
        lines += ["", f"Each row's AP minus {ref}'s on the same test frames (global order). Cells: the mean over "
                  "seeds with its 95% interval (the same scene draws for every seed and both rows, so it covers "
                  "the test scenes, not the seeds), then the per-seed differences; * marks a seed whose own paired "
                  "interval excludes 0. **Bold**: the pooled interval excludes 0.", "",
                  "| method | " + " | ".join(f"AP@{t}" for t in THRESHOLDS) + " |", "|---|---|---|---|"]
        for m in methods:
            if m == ref:
                continue
            per_seed, pooled = _paired(archives, [a.row(m) for a in archives], [a.row(ref) for a in archives],
                                       resamples=resamples)
            for k, t in enumerate(THRESHOLDS):
                d, sig = pooled.diff["global"][k], bool(pooled.significant("global")[k])
                every = holds_every_seed(per_seed, pooled, t)
                side = "above" if d > 0 else "below" if d < 0 else "equal to"
                claim = f"{m} {side} {ref.split(' (')[0]} at AP@{t}"
                verdicts["every" if every else "pooled" if sig else "no"].append(claim)
            lines.append(f"| {m} | " + " | ".join(_paired_cells(per_seed, pooled)) + " |")
    lines += ["", "What cooperation adds: each row's AP minus the same weights' AP with the collaborators off "
              "(paired on the same frames; cells as above):", "",
              "| method | " + " | ".join(f"AP@{t}" for t in THRESHOLDS) + " |", "|---|---|---|---|"]
    for m in methods:
        rows = [a.row(m) for a in archives]
        if all(r.eval.frames == r.ego_only.frames for r in rows):
            continue  # no fusion: its own ego-only evaluation
        per_seed, pooled = _paired(archives, rows, rows, "eval", "ego_only", resamples)
        lines.append(f"| {m} | " + " | ".join(_paired_cells(per_seed, pooled)) + " |")
    lines += _collaborator_only_recall(archives, methods)
    if ref is not None:
        lines += ["", f"Against {ref.split(' (')[0]}, significant in every seed with the same sign: "
                  + ("; ".join(verdicts["every"]) or "none") + ".",
                  "Significant only pooled over seeds: " + ("; ".join(verdicts["pooled"]) or "none") + ".",
                  "Not significant pooled: " + ("; ".join(verdicts["no"]) or "none") + "."]
    return lines + [""]


def _collaborator_only_recall(archives: Sequence[SeedArchive], methods: Sequence[str]) -> List[str]:
    """Recall@0.5 of the test objects only a collaborator sees, per seed (when evaluated): what the
    messages carry that the ego cannot see."""
    rows = []
    for m in methods:
        cells = []
        for a in archives:
            v = ((a.row(m).eval.recall_by_visibility or {}).get("collaborators_only") or {})
            cells.append(None if v.get("recall") is None else f"{v['recall']:.3f} ({round(v['recall'] * v['gt'])} of "
                                                             f"{v['gt']})")
        if any(cells):
            rows.append(f"| {m} | " + " | ".join(c or "-" for c in cells) + " |")
    if not rows:
        return []
    return ["", "Recall@0.5 of the test objects only a collaborator sees (>= 5 of its LiDAR points, none of the "
            "ego's), per seed:", "", "| method | " + " | ".join(f"seed {a.seed}" for a in archives) + " |",
            "|---|" + "---|" * len(archives), *rows]


def _archive_command(args):
    """``gencomm-seed-report archive``: (archive folder, seed); a bad results file raises ResultsError."""
    res = Results.load(args.results)
    if args.seed is None and not res.training_seeds:
        raise ResultsError(f"{args.results}: missing field 'training_seeds' (give --seed)")
    seed = res.training_seeds[0] if args.seed is None else args.seed
    test_root = Path(res.test_data or res.data)
    folder = archive_seed(res.rows, seed, args.out, {"profile": res.profile, "data_seed": res.seed,
                                                     "from": str(args.results), "commit": args.commit or res.commit,
                                                     "command": res.command},
                          test_root=test_root if test_root.is_dir() else None)
    return folder, seed


def main(argv=None) -> int:
    """``gencomm-seed-report archive RESULTS_JSON -o DIR`` | ``gencomm-seed-report report ARCHIVE... [-o FILE]``:
    exit 0, or 2 with one line on stderr naming the file for any bad input."""
    import argparse
    from opencood_ext.cli.errors import READ_ERRORS, one_line
    p = argparse.ArgumentParser(prog="gencomm-seed-report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("archive", help="archive the main-table rows of a main job's results.json")
    a.add_argument("results", type=Path, help="results.json written by gencomm-reproduce")
    a.add_argument("-o", "--out", type=Path, required=True, help="folder that receives seed<s>/")
    a.add_argument("--seed", type=int, default=None, help="the training seed (default: results.json's first)")
    a.add_argument("--commit", default=None,
                   help="the commit that trained the runs (default: results.json's 'commit'; without either the "
                        "archive records none)")
    r = sub.add_parser("report", help="the spread section from archive folders (seed<s>/)")
    r.add_argument("archives", nargs="+", type=Path)
    r.add_argument("-o", "--out", type=Path, default=None, help="also write the markdown here")
    r.add_argument("--json", type=Path, default=None, help="also write per-row AP per seed, mean and std")
    r.add_argument("--resamples", type=int, default=1000)
    args = p.parse_args(argv)
    try:
        if args.cmd == "archive":
            folder, seed = _archive_command(args)
            print(f"archived seed {seed}: {folder}")
            return 0
        archives = load_archives(args.archives)
        text = "\n".join(seed_section(archives, args.resamples))
        if args.out:
            args.out.write_text(text)
        if args.json:
            args.json.write_text(json.dumps(spread_json(archives), indent=2))
    except READ_ERRORS as exc:  # a missing or unreadable file, a malformed archive or results.json
        print(f"error: gencomm-seed-report: {one_line(exc)}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
