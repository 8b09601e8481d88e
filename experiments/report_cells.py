"""Table cells that REPORT.md's sections share (:mod:`experiments.report` and
:mod:`experiments.report_hetero`): an AP with its interval, a paired difference, a byte count,
and the paired-differences section against GenComm."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from opencood_ext.eval.bootstrap import paired_difference
from opencood_ext.eval.records import FrameRecords

from .results import ResultRow


def fmt_bytes(b: float) -> str:
    return "0" if b <= 0 else f"{b:,.0f} (2^{math.log2(b):.1f})"


def ap_cell(ev: dict, order: str, thr: str) -> str:
    """``0.646 [0.60, 0.69]``: the AP and its 95% interval (``eval.ap_ci``), the AP alone without one."""
    ap = ev["ap"][order][thr]
    ci = (ev.get("ap_ci") or {}).get(order, {}).get(thr)
    return f"{ap:.3f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def diff_text(diff: float, lo: float, hi: float, significant: bool) -> str:
    """A paired difference as ``+0.012 [-0.01, +0.03]``, bold when ``significant`` (its interval excludes 0)."""
    cell = f"{diff:+.3f} [{lo:+.2f}, {hi:+.2f}]"
    return f"**{cell}**" if significant else cell


def diff_cell(d, k: int) -> str:
    """Threshold ``k`` of a paired difference (global order), :func:`diff_text`."""
    return diff_text(d.diff["global"][k], d.lo["global"][k], d.hi["global"][k], bool(d.significant("global")[k]))


def differences(rows: Sequence[ResultRow], reference: str = "GenComm") -> list:
    """Paired differences ``AP(row) - AP(GenComm)`` on the same test frames (the rows'
    ``eval.frames_file``), global order, with their 95% intervals and which exclude 0."""
    ref = next((r for r in rows if reference in r.method), None)
    if ref is None:
        return []
    lines = ["", f"## Paired differences against {ref.method}", "",
             "Each method's AP minus GenComm's on the same test frames, global order; the 95% interval "
             "resamples whole test scenes with the same draws for both methods. **Bold**: the interval "
             "excludes 0 (significant at 95%).", "",
             "| method | AP@0.3 | AP@0.5 | AP@0.7 | significant |", "|---|---|---|---|---|"]
    ref_file = ref.eval.get("frames_file")
    if not ref_file or not Path(ref_file).is_file():
        return lines[:2] + [f"Not computed: {ref.method} has no per-frame records (eval frames_file)."]
    ref_rec = FrameRecords.load(ref_file)
    boot = ref.eval.get("bootstrap") or {}
    verdicts = {True: [], False: []}  # "method (AP@0.5, AP@0.7)" per side
    for r in rows:
        if r is ref:
            continue
        path = r.eval.get("frames_file")
        if not path or not Path(path).is_file():
            lines.append(f"| {r.method} | - | - | - | no per-frame records |")
            continue
        try:
            d = paired_difference(FrameRecords.load(path), ref_rec, boot.get("resamples", 1000), boot.get("seed", 0))
        except ValueError as exc:
            lines.append(f"| {r.method} | - | - | - | not paired: {exc} |")
            continue
        sig = d.significant("global")
        cells = [diff_cell(d, k) for k in range(len(d.thresholds))]
        named = [f"AP@{t}" for k, t in enumerate(d.thresholds) if sig[k]]
        for side in (True, False):
            which = [f"AP@{t}" for k, t in enumerate(d.thresholds) if sig[k] == side]
            if which:
                verdicts[side].append(f"{r.method} ({', '.join(which)})")
        lines.append(f"| {r.method} | " + " | ".join(cells) + f" | {', '.join(named) or 'none'} |")
    lines += ["", "Significant: " + ("; ".join(verdicts[True]) or "none") + ".",
              "Not significant: " + ("; ".join(verdicts[False]) or "none") + "."]
    return lines
