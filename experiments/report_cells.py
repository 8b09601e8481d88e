"""What REPORT.md's sections share (:mod:`experiments.report` and :mod:`experiments.report_hetero`):
a paired difference's cell and the paired-differences section against GenComm. The cells themselves
are :mod:`experiments.tables`'."""
from __future__ import annotations

from typing import Sequence

from opencood_ext.eval.bootstrap import PairedDifference, paired_difference

from .method_ids import REFERENCE
from .results import ResultRow
from .tables import diff_cell, table


def difference_cell(d: PairedDifference, k: int) -> str:
    """Threshold ``k`` of a paired difference (global order), :func:`~experiments.tables.diff_cell`."""
    return diff_cell(d.diff["global"][k], d.lo["global"][k], d.hi["global"][k], bool(d.significant("global")[k]))


def differences(rows: Sequence[ResultRow], reference: str = REFERENCE) -> list:
    """Paired differences ``AP(row) - AP(GenComm)`` on the same test frames (the rows' per-frame
    records), global order, with their 95% intervals and which exclude 0; ``reference``: the method id
    of the row the others are compared with."""
    ref = next((r for r in rows if r.method_id == reference), None)
    if ref is None:
        return []
    lines = ["", f"## Paired differences against {ref.method}", "",
             "Each method's AP minus GenComm's on the same test frames, global order; the 95% interval "
             "resamples whole test scenes with the same draws for both methods. **Bold**: the interval "
             "excludes 0 (significant at 95%).", ""]
    if not ref.eval.has_records(ref.run):
        return lines[:2] + [f"Not computed: {ref.method} has no per-frame records (eval frames_file)."]
    ref_rec = ref.eval.load_records(ref.run)
    verdicts = {True: [], False: []}  # "method (AP@0.5, AP@0.7)" per side
    cells = []
    for r in rows:
        if r is ref:
            continue
        if not r.eval.has_records(r.run):
            cells.append([r.method, "-", "-", "-", "no per-frame records"])
            continue
        try:
            d = paired_difference(r.eval.load_records(r.run), ref_rec, ref.eval.resamples, ref.eval.seed)
        except ValueError as exc:
            cells.append([r.method, "-", "-", "-", f"not paired: {exc}"])
            continue
        sig = d.significant("global")
        named = [f"AP@{t}" for k, t in enumerate(d.thresholds) if sig[k]]
        for side in (True, False):
            which = [f"AP@{t}" for k, t in enumerate(d.thresholds) if sig[k] == side]
            if which:
                verdicts[side].append(f"{r.method} ({', '.join(which)})")
        cells.append([r.method, *(difference_cell(d, k) for k in range(len(d.thresholds))), ", ".join(named) or "none"])
    lines += table(["method", "AP@0.3", "AP@0.5", "AP@0.7", "significant"], cells)
    lines += ["", "Significant: " + ("; ".join(verdicts[True]) or "none") + ".",
              "Not significant: " + ("; ".join(verdicts[False]) or "none") + "."]
    return lines
