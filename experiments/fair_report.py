"""The fair benchmark's REPORT.md, rendered from the comparisons computed once
(:class:`~experiments.fair_results.FairResults`, its ``computed`` groups) through the cells and tables of
:mod:`experiments.tables`: per protocol, the main table's spread over seeds (the seed section), what each
row trained, the heterogeneous benchmark over seeds and against GenComm, the issue's acceptance checks,
what the camera adds, and the per-family split."""
from __future__ import annotations

from typing import Dict, List, Sequence

from opencood_ext.run_folder import epoch_checkpoint

from .comparisons import Group
from .fair_results import (CAMERA_THRESHOLD, CameraStep, Check, FairResults, FamilySplit, GroupResults, camera_methods,
                           full_types, scored_epochs)
from .method_ids import INTERMEDIATE, LATE, REFERENCE
from .report_epochs import camera_steps
from .seeds import SPREAD_HEADING, render_seed_section
from .tables import DASH, budget_cell, mean_std_cell, seed_marks, short_name, table

WALL_NOTE = ("Wall time is the sum of a run's epoch times as its train log records them, under whatever else "
             "shared the machine then; the budget that is equal by construction is the optimizer steps.")


def main_budget_section(g: Group) -> List[str]:
    """What each main-table row trained: optimizer steps, training wall time and trainable parameters
    (per seed when they differ)."""
    rows = []
    for m in g.main_methods():
        found = [a.row(m) for a in g.archives]
        rows.append([g.name(m), budget_cell([r.optimizer_steps for r in found], "d"),
                     budget_cell([r.train_wall_s for r in found], ".0f"),
                     budget_cell([r.trainable_params for r in found], ",d")])
    return ["", f"What each main-table row trained (per seed when the seeds differ). {WALL_NOTE}", "",
            *table(["method", "optimizer steps", "training wall time (s)", "trainable params"], rows)]


def bench_section(found: GroupResults) -> List[str]:
    """The benchmark over seeds: AP per growing alliance (mean ± std), the budget, and the paired
    differences against GenComm at the ego's alliance alone and at the full one."""
    g = found.group
    methods = g.bench_methods()
    if not methods:
        return []
    types = [x.types for x in g.archives[0].bench_row(methods[0]).alliances]
    head = ["{" + types[0][0] + "}"] + [f"+{t[-1]}" for t in types[1:]]
    rows = []
    for m in methods:
        found_rows = [a.bench_row(m) for a in g.archives]
        rows.append([g.name(m, "heterogeneous"),
                     *(mean_std_cell([r.alliances[k].eval.ap_at("0.5") for r in found_rows])
                       for k in range(len(types))),
                     mean_std_cell([r.alliances[-1].eval.ap_at("0.7") for r in found_rows]),
                     budget_cell([r.optimizer_steps for r in found_rows], "d"),
                     budget_cell([r.train_wall_s for r in found_rows], ".0f"),
                     budget_cell([r.trainable_params for r in found_rows], ",d")])
    lines = ["", f"### Heterogeneous benchmark ({g.protocol}): {', '.join(t[-1] for t in types[1:])} join "
             f"{types[0][0]}", "",
             "AP@0.5 as the alliance grows, mean ± sample std over the training seeds; the full alliance's "
             "AP@0.7 too; what each row trained (optimizer steps and onboarding wall time, per seed when they "
             f"differ). {WALL_NOTE}", "",
             *table(["method", *head, "full, AP@0.7", "optimizer steps", "wall time (s)", "trainable params"], rows)]
    if REFERENCE not in methods:
        return lines
    ref = g.name(REFERENCE, "heterogeneous")
    lines += ["", f"Each row minus {ref} on the same test frames (global order): pooled over seeds with its 95% "
              "interval (bold: excludes 0), then each seed (*: that seed's interval excludes 0).", ""]
    rows, verdicts = [], []
    for m, full in found.bench_full.items():
        first = found.bench_first[m]
        name = g.name(m, "heterogeneous")
        rows.append([name, first.at("0.5").cell(), full.at("0.5").cell(), full.at("0.7").cell()])
        for alliance, comparison, thr in ((head[0], first, "0.5"), ("full alliance", full, "0.5"),
                                          ("full alliance", full, "0.7")):
            at = comparison.at(thr)
            if at.every_seed:
                verdicts.append(f"{name} {at.side} {short_name(ref)} ({alliance}, AP@{thr})")
    lines += table(["method", f"{head[0]} AP@0.5", "full AP@0.5", "full AP@0.7"], rows)
    return lines + ["", f"Significant in every seed: {'; '.join(verdicts) or 'none'}."]


def checks_section(found: Sequence[Check]) -> List[str]:
    if not found:
        return []
    rows = [[c.what, c.where, f"{c.at.diff:+.3f} [{c.at.lo:+.2f}, {c.at.hi:+.2f}]",
             seed_marks((d, s) for _, d, s in c.at.per_seed), "yes" if c.at_least else "**no**",
             "yes" if c.above_every_seed else "no"] for c in found]
    return ["", "### The issue's acceptance checks (AP@0.5)", "",
            *table(["comparison", "where", "pooled [95%]", "per seed", "at least, every seed",
                    "above, significant every seed"], rows)]


def camera_section(g: Group, found: Sequence[CameraStep]) -> List[str]:
    """"What the camera adds": the selected weights of every method, then every scored epoch of a method
    that has them."""
    steps = camera_steps(full_types(g))
    if not steps or not found:
        return []
    names = [s[0] for s in steps]
    by: Dict[tuple, CameraStep] = {(c.method_id, c.step, c.weights): c for c in found}

    def cell(key) -> str:
        return by[key].at.cell() if key in by else DASH
    lines = ["", f"### What the camera adds ({g.protocol})", "",
             "Each camera step's alliance minus the alliance before it (e.g. +m2: {m1, m2} minus {m1}), the same "
             f"weights on the same test frames, AP@{CAMERA_THRESHOLD}: pooled over seeds with its 95% interval (bold: "
             "excludes 0), then each seed (*: that seed's interval excludes 0). Selected weights (best.pth, "
             "chosen on the validation split).", ""]
    verdicts, rows = [], []
    for m in camera_methods(g):
        name = g.name(m, "heterogeneous")
        for step in names:
            c = by.get((m, step, "selected"))
            if c is not None and c.at.every_seed:
                verdicts.append(f"{step} {'adds to' if c.at.diff > 0 else 'takes from'} {name}")
        rows.append([name, *(cell((m, step, "selected")) for step in names)])
    lines += table(["method", *names], rows)
    lines += ["", f"Significant in every seed: {'; '.join(verdicts) or 'none'}."]
    for m in camera_methods(g):
        epochs = scored_epochs(g, m)
        if not epochs:
            continue
        found_rows = [a.bench_row(m) for a in g.archives]
        full = found_rows[0].alliances[-1].types
        best = ", ".join(f"seed {a.seed}: {'?' if r.best_epoch is None else r.best_epoch}"
                         for a, r in zip(g.archives, found_rows))
        lines += ["", f"#### {found_rows[0].method} at every scored onboarding epoch ({g.protocol})", "",
                  f"The full alliance's AP@{CAMERA_THRESHOLD} (mean ± std over seeds) and what each camera adds at "
                  f"that epoch (cells as above). The selected weights are from epoch {best}.", ""]
        lines += table(["epoch", f"full AP@{CAMERA_THRESHOLD}", *names],
                       [[n, mean_std_cell([r.alliance(full, n).eval.ap_at(CAMERA_THRESHOLD) for r in found_rows]),
                         *(cell((m, step, epoch_checkpoint(n))) for step in names)] for n in epochs])
    return lines


def family_section(g: Group, split: FamilySplit) -> List[str]:
    """AP@0.5 per scene family (mean ± std over seeds) and the pooled paired difference against the
    table's GenComm row per family: main-table rows and the benchmark's full alliance; then the field's
    ordering per family (late fusion minus full-feature intermediate fusion, main table)."""
    families = list(split.parts)
    rows = []
    for table_name, m in split.entries:
        cells = []
        for f in families:
            cells.append(mean_std_cell(split.aps[table_name, m][f]))
            found = split.vs_reference[table_name, m][f]
            cells.append(DASH if found is None else found.at("0.5").cell())
        rows.append([table_name, g.name(m, "main" if table_name == "main" else "heterogeneous"), *cells])
    lines = ["", f"### Per scene family ({g.protocol})", "",
             "AP@0.5 per family, mean ± std over seeds, and the row minus its table's GenComm on that family's "
             "frames (pooled over seeds [95%]; per seed, * significant). " + ", ".join(
                 f"{f}: {len(split.parts[f])} test scenes" for f in families) + ".", "",
             *table(["table", "method", *(h for f in families for h in (f"{f} AP@0.5", f"{f} vs GenComm"))], rows)]
    if not split.ordering:
        return lines
    return lines + ["", f"The field's ordering per family: {g.name(LATE)} minus {g.name(INTERMEDIATE)} (main "
                    "table, paired on the same frames; pooled over seeds [95%], then each seed, * significant):", "",
                    *table(["frames", "AP@0.5", "AP@0.7"],
                           [[name, c.at("0.5").cell(), c.at("0.7").cell()] for name, c in split.ordering.items()])]


def render(results: FairResults) -> str:
    """REPORT.md from results computed from the archives (``results.computed``)."""
    lines = ["# Fair benchmark", "",
             "Generated by `python tools/fair_benchmark.py` from the seed archives beside this file "
             "(experiments/fair.py says how every figure is computed).", "",
             "![AP@0.5 per training seed, every row](fair_benchmark.png)"]
    for found in results.computed:
        g = found.group
        a0 = g.archives[0]
        lines += ["", f"## Protocol `{g.protocol}`: training seed{'s' if len(g.seeds) > 1 else ''} "
                      f"{', '.join(map(str, g.seeds))}", "",
                  "Commits and commands: " + "; ".join(f"seed {a.seed}: `{a.meta.get('command', '?')}` at "
                                                      f"{str(a.meta.get('commit') or '?')[:7]}" for a in g.archives)
                  + f". Profile `{a0.meta.get('profile', '?')}`, data seed {a0.meta.get('data_seed', '?')}."]
        lines += ["", f"### Main table ({g.protocol}): the LiDAR pair m1 + m3"]
        lines += [ln.replace(SPREAD_HEADING, "#### Spread over training seeds")
                  for ln in render_seed_section(found.seeds)]
        lines += main_budget_section(g)
        lines += bench_section(found)
        lines += checks_section(found.checks)
        lines += camera_section(g, found.camera)
        lines += family_section(g, found.families) if found.families is not None else []
    return "\n".join(lines) + "\n"
