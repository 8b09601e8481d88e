"""The fair benchmark's camera question (issue 31 item 3): what each camera type adds to each method,
per training seed and pooled over seeds, with the selected weights and, for a method whose job scored
its kept onboarding epochs (``gencomm-reproduce --score_epochs gencomm``), at every scored epoch.

"What +m2 adds" is a paired difference within one row: the alliance with the camera type minus the
alliance before it ({m1, m2} minus {m1}), the same weights on the same test frames
(:func:`experiments.report_epochs.camera_steps` names the steps). Read from the seed archives only:
each benchmark row's ``alliances`` and, when scored, its ``epochs`` (:class:`~experiments.results.ResultRow`).
No fusion is left out: every alliance of it is the ego alone."""
from __future__ import annotations

from typing import List, Sequence

from opencood_ext.run_folder import epoch_checkpoint

from .fair_stats import Group, alliance_getter, bench_methods, compare, diff_json, entry_cell
from .method_ids import NONE_OF_STAGE1
from .report_epochs import camera_steps
from .tables import mean_std_cell

THRESHOLD = "0.5"


def _full_types(group: Group) -> List[str]:
    methods = bench_methods(group)
    return group.archives[0].bench_row(methods[0]).alliances[-1].types if methods else []


def _methods(group: Group) -> List[str]:
    return [m for m in bench_methods(group) if m != NONE_OF_STAGE1]


def scored_epochs(group: Group, method: str) -> List[int]:
    """The onboarding epochs of ``method`` scored in every seed of ``group``."""
    found = [set(a.bench_row(method).epochs) for a in group.archives]
    return sorted(set.intersection(*found)) if found else []


def camera_json(group: Group, resamples: int) -> List[dict]:
    """Every (method, camera step, weights) difference as results.json keeps it (``weights``: "selected"
    or "epoch_<n>")."""
    out = []
    steps = camera_steps(_full_types(group))
    for m in _methods(group):
        for weights, epoch in [("selected", None)] + [(epoch_checkpoint(n), n) for n in scored_epochs(group, m)]:
            for name, alliance, before in steps:
                res = compare(group, alliance_getter(m, alliance, epoch), alliance_getter(m, before, epoch),
                              resamples)
                if res is not None:
                    out.append({"protocol": group.protocol, "method": group.name(m, "heterogeneous"), "step": name,
                                "weights": weights,
                                **diff_json(group.seeds, *res, THRESHOLD)})
    return out


def camera_section(group: Group, found: Sequence[dict]) -> List[str]:
    """REPORT.md's "What the camera adds" from ``found`` (:func:`camera_json` of ``group``): the selected
    weights of every method, then every scored epoch of a method that has them."""
    steps = camera_steps(_full_types(group))
    if not steps or not found:
        return []
    names = [s[0] for s in steps]
    by = {(c["method"], c["step"], c["weights"]): c for c in found}
    lines = ["", f"### What the camera adds ({group.protocol})", "",
             "Each camera step's alliance minus the alliance before it (e.g. +m2: {m1, m2} minus {m1}), the same "
             f"weights on the same test frames, AP@{THRESHOLD}: pooled over seeds with its 95% interval (bold: "
             "excludes 0), then each seed (*: that seed's interval excludes 0). Selected weights (best.pth, "
             "chosen on the validation split).", "",
             "| method | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    verdicts = []
    for m in [group.name(m, "heterogeneous") for m in _methods(group)]:
        for name in names:
            c = by.get((m, name, "selected"))
            if c is not None and c["significant_every_seed"]:
                verdicts.append(f"{name} {'adds to' if c['pooled']['diff'] > 0 else 'takes from'} {m}")
        lines.append(f"| {m} | " + " | ".join(entry_cell(by.get((m, n, "selected"))) for n in names) + " |")
    lines += ["", f"Significant in every seed: {'; '.join(verdicts) or 'none'}."]
    for m in _methods(group):
        epochs = scored_epochs(group, m)
        if epochs:
            lines += epoch_lines(group, m, epochs, names, by)
    return lines


def epoch_lines(group: Group, method: str, epochs: Sequence[int], names: Sequence[str], by: dict) -> List[str]:
    """``method`` at every scored onboarding epoch: the full alliance's AP (mean ± std over seeds) and
    what each camera step adds at that epoch; the epoch each seed's selected weights are from."""
    rows = [a.bench_row(method) for a in group.archives]
    full = rows[0].alliances[-1].types
    name = rows[0].method
    best = ", ".join(f"seed {a.seed}: {'?' if r.best_epoch is None else r.best_epoch}"
                     for a, r in zip(group.archives, rows))
    lines = ["", f"#### {name} at every scored onboarding epoch ({group.protocol})", "",
             f"The full alliance's AP@{THRESHOLD} (mean ± std over seeds) and what each camera adds at that epoch "
             f"(cells as above). The selected weights are from epoch {best}.", "",
             f"| epoch | full AP@{THRESHOLD} | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for n in epochs:
        aps = [r.alliance(full, n).eval.ap["global"][THRESHOLD] for r in rows]
        lines.append(f"| {n} | {mean_std_cell(aps)} | "
                     + " | ".join(entry_cell(by.get((name, x, epoch_checkpoint(n)))) for x in names) + " |")
    return lines
