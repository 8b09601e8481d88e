"""Training seeds of the main table, combined across invocations from their seed archives
(:mod:`experiments.archives`: one small folder per seed, written by the main job into ``<out>/seeds``).

:func:`seed_section` turns a set of archives into the report's spread section:
every row's AP per seed with mean and standard deviation, each row's paired difference against
GenComm per seed and pooled over seeds, what cooperation adds (same weights, collaborators off),
and which claims hold in every seed. ``gencomm-seed-report`` (from a checkout
``python tools/seed_report.py``) runs both from the command line.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

from opencood_ext.eval.bootstrap import paired_difference, pooled_paired_difference

from .archives import SeedArchive, archive_seed, load_archives
from .method_ids import REFERENCE
from .results import Results, ResultsError
from .tables import mean_std, paired_cell, short_name, table, threshold_index

THRESHOLDS = ("0.3", "0.5", "0.7")


def _methods(archives: Sequence[SeedArchive]) -> List[str]:
    """The ids of the rows present in every archive, in the first archive's order."""
    return [r.method_id for r in archives[0].rows if all(a.row(r.method_id) for a in archives)]


def spread_json(archives: Sequence[SeedArchive]) -> List[dict]:
    """Per row: global AP of every seed, and mean / sample std over seeds per IoU threshold."""
    out = []
    for m in _methods(archives):
        aps = {str(a.seed): a.row(m).eval.ap["global"] for a in archives}
        entry = {"method": archives[0].row(m).method, "seeds": aps}
        for t in THRESHOLDS:
            mean, std = mean_std([ap[t] for ap in aps.values()])
            entry[t] = {"mean": mean, "std": std}
        out.append(entry)
    return out


def holds_every_seed(per_seed, pooled, thr: str) -> bool:
    """Every seed's interval excludes 0 with the pooled difference's sign."""
    k = threshold_index(pooled.thresholds, thr)
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
    return [paired_cell(pooled.diff["global"][k], pooled.lo["global"][k], pooled.hi["global"][k],
                        bool(pooled.significant("global")[k]),
                        [(p.diff["global"][k], p.significant("global")[k]) for p in per_seed])
            for k in range(len(THRESHOLDS))]


def seed_section(archives: Sequence[SeedArchive], resamples: int = 1000) -> List[str]:
    """Markdown: the spread over training seeds, paired differences against GenComm per seed and pooled,
    what cooperation adds, and which claims hold in every seed."""
    seeds = [a.seed for a in archives]
    methods = _methods(archives)
    names = {m: archives[0].row(m).method for m in methods}
    meta, test = archives[0].meta, archives[0].records(archives[0].rows[0])
    lines = ["## Run-to-run spread over training seeds", "",
             f"Training seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: every row trained from "
             "scratch once per seed on the same "
             f"data (profile `{meta.get('profile', '?')}`, data seed {meta.get('data_seed', '?')}, "
             f"{test.num_frames} test frames of {test.num_scenes} scenes). Per-seed archives: "
             + ", ".join(f"`{a.folder}` (commit {str(a.meta.get('commit') or '?')[:7]})" for a in archives) + ".", ""]
    spread = []
    for e in spread_json(archives):
        cells = [f"{e[t]['mean']:.3f}" + (f" ± {e[t]['std']:.3f}" if len(seeds) > 1 else "") for t in THRESHOLDS]
        spread.append([e["method"], *cells, ", ".join(f"{e['seeds'][str(s)]['0.5']:.3f}" for s in seeds)])
    lines += table(["method", *(f"AP@{t}" + (" mean ± std" if len(seeds) > 1 else "") for t in THRESHOLDS),
                    "AP@0.5 per seed"], spread)
    ref = REFERENCE if REFERENCE in methods else None
    verdicts: Dict[str, List[str]] = {"every": [], "pooled": [], "no": []}
    if ref is not None:
        short = short_name(names[ref])
        lines += ["", f"Each row's AP minus {names[ref]}'s on the same test frames (global order). Cells: the mean "
                  "over seeds with its 95% interval (the same scene draws for every seed and both rows, so it covers "
                  "the test scenes, not the seeds), then the per-seed differences; * marks a seed whose own paired "
                  "interval excludes 0. **Bold**: the pooled interval excludes 0.", ""]
        paired = []
        for m in methods:
            if m == ref:
                continue
            per_seed, pooled = _paired(archives, [a.row(m) for a in archives], [a.row(ref) for a in archives],
                                       resamples=resamples)
            for k, t in enumerate(THRESHOLDS):
                d, sig = pooled.diff["global"][k], bool(pooled.significant("global")[k])
                every = holds_every_seed(per_seed, pooled, t)
                side = "above" if d > 0 else "below" if d < 0 else "equal to"
                verdicts["every" if every else "pooled" if sig else "no"].append(
                    f"{names[m]} {side} {short} at AP@{t}")
            paired.append([names[m], *_paired_cells(per_seed, pooled)])
        lines += table(["method", *(f"AP@{t}" for t in THRESHOLDS)], paired)
    lines += ["", "What cooperation adds: each row's AP minus the same weights' AP with the collaborators off "
              "(paired on the same frames; cells as above):", ""]
    adds = []
    for m in methods:
        rows = [a.row(m) for a in archives]
        if all(r.eval.records == r.ego_only.records for r in rows):
            continue  # no fusion: its own ego-only evaluation
        per_seed, pooled = _paired(archives, rows, rows, "eval", "ego_only", resamples)
        adds.append([names[m], *_paired_cells(per_seed, pooled)])
    lines += table(["method", *(f"AP@{t}" for t in THRESHOLDS)], adds)
    lines += _collaborator_only_recall(archives, methods, names)
    if ref is not None:
        lines += ["", f"Against {short_name(names[ref])}, significant in every seed with the same sign: "
                  + ("; ".join(verdicts["every"]) or "none") + ".",
                  "Significant only pooled over seeds: " + ("; ".join(verdicts["pooled"]) or "none") + ".",
                  "Not significant pooled: " + ("; ".join(verdicts["no"]) or "none") + "."]
    return lines + [""]


def _collaborator_only_recall(archives: Sequence[SeedArchive], methods: Sequence[str], names: Dict[str, str]
                              ) -> List[str]:
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
            rows.append([names[m], *(c or "-" for c in cells)])
    if not rows:
        return []
    return ["", "Recall@0.5 of the test objects only a collaborator sees (>= 5 of its LiDAR points, none of the "
            "ego's), per seed:", "", *table(["method", *(f"seed {a.seed}" for a in archives)], rows)]


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
