"""Compare evaluations of the same test frames: AP with 95% intervals, and paired differences.

    python tools/compare.py RUN_A[:LABEL] RUN_B[:LABEL] ... [--reference RUN[:LABEL]]
                            [--order global|per_frame|both] [--resamples 1000] [--seed 0] [--json OUT]

RUN is a run folder holding ``eval_<LABEL>.json`` and its per-frame records
``eval_<LABEL>_frames.npz`` (written by ``tools/inference.py``); LABEL may be left out when the
folder holds one evaluation. Every AP gets its 95% percentile-bootstrap interval over the test
scenes; every run but the reference (default: the first) gets its paired difference
``AP(run) - AP(reference)`` on the same scene draws, marked ``*`` when the interval excludes 0
(:mod:`opencood_ext.eval.bootstrap`). Runs evaluated on different frames are an error.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional, Tuple

Spec = Tuple[Path, Optional[str]]


def parse_spec(text: str) -> Spec:
    """``RUN`` or ``RUN:LABEL`` (a path that exists as written is never split)."""
    path = Path(text)
    if path.exists() or ":" not in text:
        return path, None
    run, label = text.rsplit(":", 1)
    if not label:
        raise ValueError(f"{text}: empty label after ':'")
    from opencood_ext.cli.errors import check_label
    return Path(run), check_label(label, f"{text}: LABEL")


def _cell(value: float, ci) -> str:
    if value != value:  # nan
        return "n/a"
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci is not None else f"{value:.3f} [n/a]"


def _diff_cell(value: float, lo: float, hi: float, significant: bool) -> str:
    if value != value or lo != lo:
        return "n/a"
    return f"{value:+.3f} [{lo:+.3f}, {hi:+.3f}]" + (" *" if significant else "  ")


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    widths = [max(len(r[c]) for r in [header] + rows) for c in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [fmt(header), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]


def compare(specs: List[Spec], reference: int = 0, orders=("global",), resamples: int = 1000,
            seed: int = 0) -> Tuple[str, dict]:
    """(printed text, JSON summary) for the evaluations ``specs``; ``reference`` indexes ``specs``."""
    from opencood_ext.cli.errors import reading
    from opencood_ext.eval.bootstrap import bootstrap_ap, paired_difference, scene_draws
    from opencood_ext.eval.run_records import load_eval_records
    from opencood_ext.run_folder import RunFolder

    loaded = []
    for run, label in specs:
        if label is None and Path(run).is_dir():
            labels = RunFolder(run).evaluation_labels()
            label = labels[0] if len(labels) == 1 else None  # else load_eval_records says none / several
        with reading(RunFolder(run).frames(label) if label is not None else run, "evaluation records"):
            label, rec = load_eval_records(run, label)
        loaded.append((f"{run}:{label}", rec))
    ref_name, ref = loaded[reference]
    try:
        aligned = [(name, rec.aligned_to(ref)) for name, rec in loaded]
    except ValueError as exc:
        raise ValueError(f"{exc} (reference {ref_name})") from exc
    draws = scene_draws(ref.num_scenes, resamples, seed)
    boots = [bootstrap_ap(rec, resamples, seed, draws=draws) for _, rec in aligned]
    diffs = [None if k == reference else paired_difference(rec, ref, resamples, seed, draws=draws)
             for k, (_, rec) in enumerate(aligned)]
    thr = [str(t) for t in ref.thresholds]
    lines = [f"{ref.num_frames} test frames of {ref.num_scenes} scenes; 95% percentile bootstrap over scenes, "
             f"{resamples} resamples (seed {seed}); differences are paired (same scene draws) against "
             f"{ref_name}; * = the interval excludes 0"]
    summary = {"reference": ref_name, "frames": ref.num_frames, "scenes": ref.num_scenes,
               "resamples": resamples, "seed": seed, "runs": []}
    for k, ((name, _), boot, diff) in enumerate(zip(aligned, boots, diffs)):
        summary["runs"].append({"run": name, "ap": {o: dict(zip(thr, map(float, boot.ap[o]))) for o in boot.ap},
                                "ap_ci": boot.ci_json(), "minus_reference": None if diff is None else diff.to_json()})
    for order in orders:
        lines += ["", f"AP, {order} order"]
        lines += _table(["run"] + [f"AP@{t}" for t in thr],
                        [[name + (" (reference)" if k == reference else "")]
                         + [_cell(v, ci) for v, ci in zip(boot.ap[order], boot.ci_json()[order].values())]
                         for k, ((name, _), boot) in enumerate(zip(aligned, boots))])
        rows = [[name] + [_diff_cell(d, lo, hi, s) for d, lo, hi, s in
                          zip(diff.diff[order], diff.lo[order], diff.hi[order], diff.significant(order))]
                for (name, _), diff in zip(aligned, diffs) if diff is not None]
        if rows:
            lines += ["", f"difference minus {ref_name}, {order} order"]
            lines += _table(["run"] + [f"dAP@{t}" for t in thr], rows)
    return "\n".join(lines), summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN[:LABEL]")
    p.add_argument("--reference", default=None, metavar="RUN[:LABEL]",
                   help="the run every other is compared with (default: the first; added if not listed)")
    p.add_argument("--order", choices=["global", "per_frame", "both"], default="global")
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    from opencood_ext.cli.errors import USER_ERRORS, report
    try:
        specs = [parse_spec(s) for s in args.runs]
        reference = 0
        if args.reference is not None:
            ref = parse_spec(args.reference)
            if ref not in specs:
                specs.append(ref)
            reference = specs.index(ref)
        orders = ("global", "per_frame") if args.order == "both" else (args.order,)
        text, summary = compare(specs, reference, orders, args.resamples, args.seed)
    except (*USER_ERRORS, ValueError) as exc:  # a missing or truncated npz, frames that do not pair, a bad LABEL
        return report(exc)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
