"""Training seeds of the main table, combined across invocations from their seed archives
(:mod:`experiments.archives`: one small folder per seed, written by the main job into ``<out>/seeds``).

:func:`seed_section` renders the report's spread section from the comparisons computed once
(:class:`~experiments.comparisons.SeedComparisons`):
every row's AP per seed with mean and standard deviation, each row's paired difference against
GenComm per seed and pooled over seeds, what cooperation adds (same weights, collaborators off),
and which claims hold in every seed. ``gencomm-seed-report`` (from a checkout
``python tools/seed_report.py``) runs both from the command line.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from .archives import SeedArchive, archive_seed, load_archives
from .comparisons import THRESHOLDS, Group, SeedComparisons, seed_comparisons, spread_of, spread_rows_json
from .results import Results, ResultsError
from .tables import short_name, table

SPREAD_HEADING = "## Run-to-run spread over training seeds"


def seed_section(archives: Sequence[SeedArchive], resamples: int = 1000,
                 display: Callable[[Path], str] = str) -> List[str]:
    """Markdown: the spread over training seeds, paired differences against GenComm per seed and pooled,
    what cooperation adds, and which claims hold in every seed (:func:`render_seed_section`)."""
    return render_seed_section(seed_comparisons(Group(None, list(archives)), resamples), display)


def render_seed_section(found: SeedComparisons, display: Callable[[Path], str] = str) -> List[str]:
    """The section's markdown lines from comparisons computed once; ``display``: how the archive folders
    are named (as given, by default)."""
    archives = found.group.archives
    seeds = found.group.seeds
    meta, test = archives[0].meta, archives[0].records(archives[0].rows[0])
    lines = [SPREAD_HEADING, "",
             f"Training seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: every row trained from "
             "scratch once per seed on the same "
             f"data (profile `{meta.get('profile', '?')}`, data seed {meta.get('data_seed', '?')}, "
             f"{test.num_frames} test frames of {test.num_scenes} scenes). Per-seed archives: "
             + ", ".join(f"`{display(a.folder)}` (commit {str(a.meta.get('commit') or '?')[:7]})" for a in archives)
             + ".", ""]
    spread = []
    for r in found.spread:
        cells = []
        for t in THRESHOLDS:
            mean, std = r.mean_std(t)
            cells.append(f"{mean:.3f}" + (f" ± {std:.3f}" if len(seeds) > 1 else ""))
        spread.append([r.method, *cells, ", ".join(f"{r.aps[s]['0.5']:.3f}" for s in seeds)])
    lines += table(["method", *(f"AP@{t}" + (" mean ± std" if len(seeds) > 1 else "") for t in THRESHOLDS),
                    "AP@0.5 per seed"], spread)
    ref = found.reference
    verdicts: Dict[str, List[str]] = {"every": [], "pooled": [], "no": []}
    if ref is not None:
        short = short_name(found.name(ref))
        lines += ["", f"Each row's AP minus {found.name(ref)}'s on the same test frames (global order). Cells: the "
                  "mean over seeds with its 95% interval (the same scene draws for every seed and both rows, so it "
                  "covers the test scenes, not the seeds), then the per-seed differences; * marks a seed whose own "
                  "paired interval excludes 0. **Bold**: the pooled interval excludes 0.", ""]
        for m, comparison in found.vs_reference.items():
            for t in THRESHOLDS:
                at = comparison.at(t)
                verdicts["every" if at.every_seed else "pooled" if at.significant else "no"].append(
                    f"{found.name(m)} {at.side} {short} at AP@{t}")
        lines += table(["method", *(f"AP@{t}" for t in THRESHOLDS)],
                       [[found.name(m), *(c.at(t).cell() for t in THRESHOLDS)] for m, c in found.vs_reference.items()])
    lines += ["", "What cooperation adds: each row's AP minus the same weights' AP with the collaborators off "
              "(paired on the same frames; cells as above):", ""]
    lines += table(["method", *(f"AP@{t}" for t in THRESHOLDS)],
                   [[found.name(m), *(c.at(t).cell() for t in THRESHOLDS)] for m, c in found.cooperation.items()])
    lines += _collaborator_only_recall(found)
    if ref is not None:
        lines += ["", f"Against {short_name(found.name(ref))}, significant in every seed with the same sign: "
                  + ("; ".join(verdicts["every"]) or "none") + ".",
                  "Significant only pooled over seeds: " + ("; ".join(verdicts["pooled"]) or "none") + ".",
                  "Not significant pooled: " + ("; ".join(verdicts["no"]) or "none") + "."]
    return lines + [""]


def _collaborator_only_recall(found: SeedComparisons) -> List[str]:
    """Recall@0.5 of the test objects only a collaborator sees, per seed (when evaluated): what the
    messages carry that the ego cannot see."""
    archives = found.group.archives
    rows = []
    for r in found.spread:
        cells = []
        for a in archives:
            v = ((a.row(r.method_id).eval.recall_by_visibility or {}).get("collaborators_only") or {})
            cells.append(None if v.get("recall") is None else f"{v['recall']:.3f} ({round(v['recall'] * v['gt'])} of "
                                                             f"{v['gt']})")
        if any(cells):
            rows.append([r.method, *(c or "-" for c in cells)])
    if not rows:
        return []
    return ["", "Recall@0.5 of the test objects only a collaborator sees (>= 5 of its LiDAR points, none of the "
            "ego's), per seed:", "", *table(["method", *(f"seed {a.seed}" for a in archives)], rows)]


def spread_json(archives: Sequence[SeedArchive]) -> List[dict]:
    """Per row of ``archives``: global AP of every seed, mean and sample std over seeds per threshold."""
    return spread_rows_json(spread_of(Group(None, list(archives))))


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
        found = seed_comparisons(Group(None, load_archives(args.archives)), args.resamples)
        text = "\n".join(render_seed_section(found))
        if args.out:
            args.out.write_text(text)
        if args.json:
            args.json.write_text(json.dumps(spread_rows_json(found.spread), indent=2))
    except READ_ERRORS as exc:  # a missing or unreadable file, a malformed archive or results.json
        print(f"error: gencomm-seed-report: {one_line(exc)}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
