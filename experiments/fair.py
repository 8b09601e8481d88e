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
epoch (:mod:`experiments.fair_camera`), and ``against_gencomm``: every row minus its table's GenComm
row (:func:`against_reference`), which the README's tables show (:mod:`experiments.fair_readme`).

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
from typing import List, Sequence

from opencood_ext.eval.bootstrap import bootstrap_ap

from .archives import load_archive
from .fair_camera import camera_json, camera_section
from .fair_plot import plot_fair
from .fair_stats import (Group, bench_getter, bench_methods, compare, diff_cell, diff_json, group_by_protocol,
                         main_getter, main_methods, protocol_of)
from .method_ids import INTERMEDIATE as FULL_FEATURE, LATE, LATE_OF_STAGE1, NO_FUSION, NONE_OF_STAGE1, REFERENCE
from .seeds import holds_every_seed, seed_section
from .tables import budget_cell, mean_std_cell, short_name, threshold_index

NOT_ONBOARDING = (NONE_OF_STAGE1, LATE_OF_STAGE1)  # the benchmark's rows that onboard nothing


def flat_rows(group: Group) -> List[dict]:
    """Every row of every seed of ``group`` as ``results.json`` keeps it (frames paths relative to the
    destination folder)."""
    out = []
    for a in group.archives:
        where = f"{group.protocol}/seed{a.seed}"
        out += [r.to_combined(where) for r in [*a.rows, *a.benchmark]]
    return out


WALL_NOTE = ("Wall time is the sum of a run's epoch times as its train log records them, under whatever else "
             "shared the machine then; the budget that is equal by construction is the optimizer steps.")


def main_budget_section(group: Group) -> List[str]:
    """What each main-table row trained: optimizer steps, training wall time and trainable parameters
    (per seed when they differ)."""
    methods = main_methods(group)
    lines = ["", f"What each main-table row trained (per seed when the seeds differ). {WALL_NOTE}", "",
             "| method | optimizer steps | training wall time (s) | trainable params |", "|---|---|---|---|"]
    for m in methods:
        rows = [a.row(m) for a in group.archives]
        lines.append(f"| {group.name(m)} | {budget_cell([r.optimizer_steps for r in rows], 'd')} | "
                     f"{budget_cell([r.train_wall_s for r in rows], '.0f')} | "
                     f"{budget_cell([r.trainable_params for r in rows], ',d')} |")
    return lines


def bench_section(group: Group, resamples: int) -> List[str]:
    """The benchmark over seeds: AP per growing alliance (mean ± std), the budget, and paired
    differences against GenComm at the ego's alliance alone and at the full one."""
    methods = bench_methods(group)
    if not methods:
        return []
    arcs = group.archives
    types = [x.types for x in arcs[0].bench_row(methods[0]).alliances]
    head = ["{" + types[0][0] + "}"] + [f"+{t[-1]}" for t in types[1:]]
    lines = ["", f"### Heterogeneous benchmark ({group.protocol}): {', '.join(t[-1] for t in types[1:])} join "
             f"{types[0][0]}", "",
             "AP@0.5 as the alliance grows, mean ± sample std over the training seeds; the full alliance's "
             "AP@0.7 too; what each row trained (optimizer steps and onboarding wall time, per seed when they "
             f"differ). {WALL_NOTE}", "",
             "| method | " + " | ".join(head) + " | full, AP@0.7 | optimizer steps | wall time (s) | trainable params |",
             "|---|" + "---|" * (len(head) + 4)]
    for m in methods:
        rows = [a.bench_row(m) for a in arcs]
        cells = [mean_std_cell([r.alliances[k].eval.ap["global"]["0.5"] for r in rows]) for k in range(len(types))]
        lines.append(f"| {group.name(m, 'heterogeneous')} | " + " | ".join(cells)
                     + f" | {mean_std_cell([r.alliances[-1].eval.ap['global']['0.7'] for r in rows])}"
                     f" | {budget_cell([r.optimizer_steps for r in rows], 'd')} | "
                     f"{budget_cell([r.train_wall_s for r in rows], '.0f')}"
                     f" | {budget_cell([r.trainable_params for r in rows], ',d')} |")
    ref = REFERENCE if REFERENCE in methods else None
    if ref is None:
        return lines
    lines += ["", f"Each row minus {group.name(ref, 'heterogeneous')} on the same test frames (global order): "
              "pooled over seeds with its 95% "
              "interval (bold: excludes 0), then each seed (*: that seed's interval excludes 0).", "",
              f"| method | {head[0]} AP@0.5 | full AP@0.5 | full AP@0.7 |", "|---|---|---|---|"]
    verdicts = []
    for m in methods:
        if m == ref:
            continue
        first = compare(group, bench_getter(m, 0), bench_getter(ref, 0), resamples)
        full = compare(group, bench_getter(m), bench_getter(ref), resamples)
        name_m = group.name(m, "heterogeneous")
        lines.append(f"| {name_m} | {diff_cell(*first, '0.5')} | {diff_cell(*full, '0.5')} | {diff_cell(*full, '0.7')} |")
        for name, res, thr in ((head[0], first, "0.5"), ("full alliance", full, "0.5"), ("full alliance", full, "0.7")):
            if holds_every_seed(*res, thr):
                side = "above" if res[1].diff["global"][threshold_index(res[1].thresholds, thr)] > 0 else "below"
                verdicts.append(f"{name_m} {side} {short_name(group.name(ref, 'heterogeneous'))} ({name}, AP@{thr})")
    lines += ["", f"Significant in every seed: {'; '.join(verdicts) or 'none'}."]
    return lines


def checks(group: Group, resamples: int) -> List[dict]:
    """The issue's acceptance comparisons at AP@0.5, each pooled and per seed: full-feature intermediate
    minus no fusion (main table), and every onboarding method's {m1} minus no fusion twice: against the
    benchmark's no-fusion row (the ego's stage-1 model with its collaborators off) and against the main
    table's no fusion (a model trained alone; the same ego LiDAR, test frames and ground truth)."""
    out = []
    main = main_methods(group)
    items = [] if FULL_FEATURE not in main or NO_FUSION not in main else [
        (group.name(FULL_FEATURE), group.name(NO_FUSION), "main table", main_getter(FULL_FEATURE), main_getter(NO_FUSION))]
    nf = NONE_OF_STAGE1 if NONE_OF_STAGE1 in bench_methods(group) else None
    alone = NO_FUSION in main
    for m in bench_methods(group):
        if m in NOT_ONBOARDING:
            continue
        name = group.name(m, "heterogeneous")
        if nf is not None:
            items.append((name, group.name(nf, "heterogeneous"), "benchmark, ego alliance alone", bench_getter(m, 0),
                          bench_getter(nf, 0)))
        if alone:
            items.append((name, f"{group.name(NO_FUSION)} (main table, trained alone)",
                          "benchmark {m1} against the main table", bench_getter(m, 0), main_getter(NO_FUSION)))
    for a, b, where, ga, gb in items:
        res = compare(group, ga, gb, resamples)
        if res is None:
            continue
        per_seed, pooled = res
        found = diff_json(group.seeds, per_seed, pooled, "0.5")
        diff = found["pooled"]["diff"]
        out.append({"protocol": group.protocol, "what": f"{a} minus {b}", "where": where, **found,
                    "at_least": bool(diff >= 0 and all(v["diff"] >= 0 for v in found["per_seed"].values())),
                    "above_every_seed": found["significant_every_seed"] and diff > 0})
    return out


def against_reference(group: Group, resamples: int) -> List[dict]:
    """Every row minus its table's GenComm row on the same test frames, at AP@0.5 and AP@0.7, pooled
    over seeds with its interval and per seed (:func:`diff_json`): the main table's rows and the
    benchmark's full alliances. The same figures as the report's paired tables; the README's tables
    read them from results.json (:mod:`experiments.fair_readme`)."""
    out = []
    for table, methods, getter in (("main", main_methods(group), main_getter),
                                   ("heterogeneous", bench_methods(group), bench_getter)):
        ref = REFERENCE if REFERENCE in methods else None
        for m in methods if ref is not None else []:
            res = None if m == ref else compare(group, getter(m), getter(ref), resamples)
            if res is not None:
                out.append({"protocol": group.protocol, "table": table, "method": group.name(m, table),
                            "minus": group.name(ref, table),
                            "diff": {t: diff_json(group.seeds, *res, t) for t in ("0.5", "0.7")}})
    return out


def checks_section(found: Sequence[dict]) -> List[str]:
    if not found:
        return []
    lines = ["", "### The issue's acceptance checks (AP@0.5)", "",
             "| comparison | where | pooled [95%] | per seed | at least, every seed | above, significant every seed |",
             "|---|---|---|---|---|---|"]
    for c in found:
        p = c["pooled"]
        seeds = ", ".join(f"{v['diff']:+.3f}" + ("*" if v["significant"] else "") for v in c["per_seed"].values())
        lines.append(f"| {c['what']} | {c['where']} | {p['diff']:+.3f} [{p['ci'][0]:+.2f}, {p['ci'][1]:+.2f}] | "
                     f"{seeds} | {'yes' if c['at_least'] else '**no**'} | {'yes' if c['above_every_seed'] else 'no'} |")
    return lines


def family_section(group: Group, resamples: int) -> List[str]:
    """AP@0.5 per scene family (mean ± std over seeds) and the pooled paired difference against the
    table's GenComm row per family: main-table rows and the benchmark's full alliance."""
    fam = group.archives[0].meta.get("scene_families") or {}
    families = sorted(set(fam.values()))
    if len(families) < 2:
        return []
    parts = {f: [s for s, v in fam.items() if v == f] for f in families}
    main = main_methods(group)
    entries = [("main", m, main_getter(m)) for m in main] + [("benchmark", m, bench_getter(m))
                                                              for m in bench_methods(group)]
    refs = {"main": REFERENCE if REFERENCE in main else None,
            "benchmark": REFERENCE if REFERENCE in bench_methods(group) else None}
    lines = ["", f"### Per scene family ({group.protocol})", "",
             "AP@0.5 per family, mean ± std over seeds, and the row minus its table's GenComm on that family's "
             "frames (pooled over seeds [95%]; per seed, * significant). " + ", ".join(
                 f"{f}: {len(parts[f])} test scenes" for f in families) + ".", "",
             "| table | method | " + " | ".join(f"{f} AP@0.5 | {f} vs GenComm" for f in families) + " |",
             "|---|---|" + "---|---|" * len(families)]
    for table, m, get in entries:
        cells = []
        for f in families:
            aps = []
            for a in group.archives:
                part = get(a).subset(parts[f])
                aps.append(float(bootstrap_ap(part, 1).ap["global"][threshold_index(part.thresholds, "0.5")]))
            cells.append(mean_std_cell(aps))
            ref = refs[table]
            if ref is None or ref == m:
                cells.append("-")
                continue
            ref_get = main_getter(ref) if table == "main" else bench_getter(ref)
            cells.append(diff_cell(*compare(group, get, ref_get, resamples, parts[f]), "0.5"))
        lines.append(f"| {table} | {group.name(m, 'main' if table == 'main' else 'heterogeneous')} | "
                     + " | ".join(cells) + " |")
    return lines + ordering_by_family(group, main, parts, resamples)


def ordering_by_family(group: Group, main: Sequence[str], parts: dict, resamples: int) -> List[str]:
    """The field's ordering per scene family: the main table's late fusion minus its full-feature
    intermediate fusion, paired on each family's frames and on all of them (issue 31: is late fusion's
    lead a property of the perpendicular junctions?)."""
    if LATE not in main or FULL_FEATURE not in main:
        return []
    lines = ["", f"The field's ordering per family: {group.name(LATE)} minus {group.name(FULL_FEATURE)} (main table, "
             "paired on the "
             "same frames; pooled over seeds [95%], then each seed, * significant):", "",
             "| frames | AP@0.5 | AP@0.7 |", "|---|---|---|"]
    for name, scenes in [*parts.items(), ("all", None)]:
        found = compare(group, main_getter(LATE), main_getter(FULL_FEATURE), resamples, scenes)
        lines.append(f"| {name} | {diff_cell(*found, '0.5')} | {diff_cell(*found, '0.7')} |")
    return lines


def report(groups: Sequence[Group], found: Sequence[dict], camera: Sequence[dict], resamples: int) -> str:
    lines = ["# Fair benchmark", "",
             "Generated by `python tools/fair_benchmark.py` from the seed archives beside this file "
             "(experiments/fair.py says how every figure is computed).", "",
             "![AP@0.5 per training seed, every row](fair_benchmark.png)"]
    for g in groups:
        a0 = g.archives[0]
        lines += ["", f"## Protocol `{g.protocol}`: training seed{'s' if len(g.seeds) > 1 else ''} {', '.join(map(str, g.seeds))}", "",
                  "Commits and commands: " + "; ".join(f"seed {a.seed}: `{a.meta.get('command', '?')}` at "
                                                      f"{str(a.meta.get('commit') or '?')[:7]}" for a in g.archives)
                  + f". Profile `{a0.meta.get('profile', '?')}`, data seed {a0.meta.get('data_seed', '?')}."]
        lines += ["", f"### Main table ({g.protocol}): the LiDAR pair m1 + m3"]
        lines += [ln.replace("## Run-to-run spread over training seeds", "#### Spread over training seeds")
                  for ln in seed_section(g.archives, resamples)]
        lines += main_budget_section(g)
        lines += bench_section(g, resamples)
        lines += checks_section([c for c in found if c["protocol"] == g.protocol])
        lines += camera_section(g, [c for c in camera if c["protocol"] == g.protocol])
        lines += family_section(g, resamples)
    return "\n".join(lines) + "\n"


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
    found = [c for g in groups for c in checks(g, resamples)]
    camera = [c for g in groups for c in camera_json(g, resamples)]
    doc = {"groups": [{"protocol": g.protocol, "seeds": g.seeds,
                       "archives": [{"seed": a.seed, "commit": a.meta.get("commit"), "command": a.meta.get("command"),
                                     "profile": a.meta.get("profile"), "data_seed": a.meta.get("data_seed")}
                                    for a in g.archives]} for g in groups],
           "rows": [r for g in groups for r in flat_rows(g)], "checks": found, "camera": camera,
           "against_gencomm": [c for g in groups for c in against_reference(g, resamples)],
           "resamples": resamples}
    (dest / "results.json").write_text(json.dumps(doc, indent=2))
    plot_fair(groups, dest / "fair_benchmark.png")
    path = dest / "REPORT.md"
    path.write_text(report(groups, found, camera, resamples))
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
