"""The fair benchmark (issue 31): the main table and the heterogeneous benchmark over training seeds,
per protocol, combined from seed archives (:mod:`experiments.seeds`, version 2) into one folder::

    python tools/fair_benchmark.py RESULTS/seeds/seed0 RESULTS/seeds/seed1 ... -o archive/fair_benchmark

writes ``<dest>/<protocol>/seed<s>/`` (copies of the archives), ``<dest>/results.json``,
``<dest>/REPORT.md`` and its figure ``<dest>/fair_benchmark.png`` (:mod:`experiments.fair_plot`).
``results.json`` holds every row of every seed and protocol, each with
``protocol``, ``training_seed``, ``optimizer_steps``, ``trainable_params``, ``train_wall_s`` and
``eval`` (``ap``, ``ap_ci``, ``bytes_per_message``; a benchmark row's is its full alliance's, and its
``alliances`` give every growing alliance), plus ``checks``: the issue's two acceptance comparisons
(full-feature intermediate against no fusion; every competitor's {m1} against the benchmark's no
fusion and the main table's), each pooled over seeds with its interval and per seed, and ``camera``:
what each camera type adds to each method, with the selected weights and at every scored onboarding
epoch, and ``against_gencomm``: every row minus its table's GenComm row, which the README's tables show
(:mod:`experiments.fair_readme`). Every comparison is computed once (:mod:`experiments.fair_results`);
REPORT.md renders them (:mod:`experiments.fair_report`).

Statistics: the mean and sample standard deviation of AP over seeds (the run-to-run spread), and
paired differences against GenComm (or the check's reference) on the same test frames: per seed and
pooled over seeds with the 95 % scene-bootstrap interval (:func:`~opencood_ext.eval.bootstrap.
pooled_paired_difference`: it covers the test scenes, not the seeds). A difference is called
significant only when every seed's own interval excludes 0 with the same sign.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Sequence

from .archives import load_archive
from .comparisons import group_by_protocol, protocol_of
from .fair_plot import plot_fair
from .fair_report import render
from .fair_results import compute


def write_fair_benchmark(folders: Sequence, dest: Path, resamples: int = 1000) -> Path:
    """Copy the archives at ``folders`` into ``dest/<protocol>/seed<s>/`` and write ``dest/results.json``,
    ``dest/REPORT.md`` and ``dest/fair_benchmark.png`` from those copies; returns the report's path."""
    dest = Path(dest)
    placed = []
    for f in folders:
        a = load_archive(f)
        target = dest / protocol_of(a) / f"seed{a.seed}"
        if Path(f).resolve() != target.resolve():
            tmp = target.with_name(target.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(f, tmp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        placed.append(target)
    groups = group_by_protocol(placed)
    results = compute(groups, resamples)
    (dest / "results.json").write_text(json.dumps(results.to_json(), indent=2))
    plot_fair(groups, dest / "fair_benchmark.png")
    path = dest / "REPORT.md"
    path.write_text(render(results))
    return path


def main(argv=None) -> int:
    """``gencomm-fair-benchmark ARCHIVE... -o DEST``: exit 0 with the report's path, or 2 with one line on
    stderr naming the file for any bad input."""
    import argparse
    import sys
    from opencood_ext.cli.errors import READ_ERRORS, one_line
    p = argparse.ArgumentParser(prog="gencomm-fair-benchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("archives", nargs="+", type=Path, help="seed archive folders (seed<s>/ with rows.json, version 2)")
    p.add_argument("-o", "--out", type=Path, required=True, help="destination folder (e.g. archive/fair_benchmark)")
    p.add_argument("--resamples", type=int, default=1000, help="scene-bootstrap resamples (default 1000)")
    args = p.parse_args(argv)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        path = write_fair_benchmark(args.archives, args.out, args.resamples)
    except READ_ERRORS as exc:
        print(f"error: gencomm-fair-benchmark: {one_line(exc)}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0
