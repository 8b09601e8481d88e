"""Data faults: holes and oddities in a dataset that a reader can read past, named
instead of passed over in silence.

Index-time check of an OPV2V-format split (OPV2V, OPV2V-H, V2XSet, V2X-Real),
from file names only, over each scenario's agents x timestamps
(:func:`layout_faults`). An agent "has" a timestamp when it has its yaml or its
point cloud there; its *span* is its first to its last timestamp. Agents enter
and leave a scenario, so an agent absent before its first or after its last
timestamp is normal. Faults, each named by a path:

* ``no_yaml``: ``<t>.pcd`` (``.bin``) without ``<t>.yaml``: the agent is left
  out of frame ``t`` (frames are indexed by yaml);
* ``no_lidar``: ``<t>.yaml`` without its point cloud: loading frame ``t`` fails;
* ``missing``: an agent has no file at a timestamp inside its span that more
  of the scenario's agents have than lack: frame ``t`` holds the others only
  (if the agent would have been the ego, another agent is: the message says so);
* ``stray``: a timestamp fewer agents have than lack although it lies inside
  their spans (a renamed file): named by the lone file(s);
* ``mismatch``: a timestamp inside the spans of as many agents that lack it as
  agents that have it: named by the present file(s), the absent ones listed.

Which frames a split has. A frame is a timestamp that more of the agents recording
through it have than lack (agents outside their span do not count). A *disputed*
timestamp (``stray`` or ``mismatch``: no more agents have it than lack it) is no
frame (:func:`disputed_frames`): a renamed file neither adds a frame nor turns a
lone agent into an ego, so a timestamp fault never adds a frame to what an
evaluation scores. A tie (two agents, one file renamed or lost) cannot tell the
real timestamp from the stray one, so both sides of it are left out; the warning
names each. Agent faults at a frame's timestamp (``no_yaml``, ``no_lidar``,
``missing``) keep the frame: the agent is left out, or loading it fails by name.

Load-time: points with a NaN or infinite value (:func:`drop_nonfinite`).

Policy. Default: the reader reads on (the agent is left out, the rows dropped)
and each fault is a :class:`~.errors.DataFaultWarning` (``warnings.warn``) plus
a logging WARNING, both starting with the file. Strict (``data.strict`` or a
reader's ``strict=True``): a fault is a :class:`~.errors.DataFaultError` naming
the file; at construction the reader refuses a split with layout faults, or,
with ``skip_bad`` as well, raises it when an affected frame is loaded, so
``skip_bad`` logs and leaves out that frame like any other bad frame.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Set, Tuple

import numpy as np

from .errors import DataFaultError, DataFaultWarning
from .frame import sort_agent_ids

log = logging.getLogger(__name__)

MAX_REPORTED = 20  # faults warned about one by one per reader; the rest are counted in one more warning
_MAX_REMEMBERED = 100_000
_logged_points: Set[str] = set()  # files whose non-finite points were logged (once per file and process)


@dataclass(frozen=True)
class Fault:
    """One data fault: ``kind`` (see the module docstring), the file it is about and what is wrong."""

    kind: str
    path: Path
    problem: str
    scenario: str = ""
    timestamp: str = ""

    @property
    def message(self) -> str:
        return f"{self.path}: {self.problem}"

    def error(self, note: str = "") -> DataFaultError:
        return DataFaultError(self.path, self.problem + note)


def warn_fault(path, problem: str, stacklevel: int = 3) -> None:
    """The default report of one fault: a logging WARNING and a DataFaultWarning, both ``"<path>: <problem>"``."""
    text = f"{path}: {problem}"
    log.warning("%s", text)
    warnings.warn(DataFaultWarning(text), stacklevel=stacklevel)


def report_faults(faults: List[Fault], where, strict: bool) -> None:
    """Raise the first fault (strict; the message counts the rest and names a few) or warn about
    each (at most :data:`MAX_REPORTED`, then one warning counting the others)."""
    if not faults:
        return
    if strict:
        note = ""
        if len(faults) > 1:
            others = "; ".join(f.message for f in faults[1:4])
            note = (f" [{len(faults)} data faults in all under {where} (strict); also: {others}"
                    f"{'; ...' if len(faults) > 4 else ''}]")
        raise faults[0].error(note)
    for f in faults[:MAX_REPORTED]:
        warn_fault(f.path, f.problem, stacklevel=4)
    if len(faults) > MAX_REPORTED:
        warn_fault(where, f"{len(faults) - MAX_REPORTED} more data faults not shown ({len(faults)} in all; "
                          "the reader's .faults lists them, tools/inspect_data.py prints them)", stacklevel=4)


def drop_nonfinite(points: np.ndarray, path, columns: int = 4, strict: bool = False) -> np.ndarray:
    """``points`` without the rows having a NaN or infinite value among their first ``columns``.

    Such rows are a fault: strict raises a DataFaultError naming the file and the count;
    otherwise the count is warned about (DataFaultWarning each time; the log line once per
    file and process, as an epoch rereads every file) and the rows are dropped.
    """
    pts = np.asarray(points)
    if not len(pts):
        return pts
    finite = np.isfinite(pts[:, :columns])
    if finite.all():  # the usual case, checked without the per-row reduction (25x faster)
        return pts
    bad = ~finite.all(axis=1)
    n = int(bad.sum())
    what = "x, y, z" if columns == 3 else "x, y, z, intensity"
    if strict:
        raise DataFaultError(path, f"{n} of {len(pts)} points have a non-finite (NaN/inf) value in {what} "
                                   "(strict: refused instead of dropped)")
    text = f"{path}: dropped {n} of {len(pts)} points with NaN/inf values (non-finite {what})"
    key = str(path)
    if key not in _logged_points:
        if len(_logged_points) < _MAX_REMEMBERED:
            _logged_points.add(key)
        log.warning("%s", text)
    warnings.warn(DataFaultWarning(text), stacklevel=3)
    return pts[~bad]


# ----------------------------------------------------------------------------- layout check

@dataclass
class AgentStamps:
    """Timestamps at which one agent has ``<t>.yaml`` and ``<t>.<lidar ext>``."""

    yaml: Set[str]
    lidar: Set[str]

    @property
    def any(self) -> Set[str]:
        return self.yaml | self.lidar


def _ids(agents: Iterable[int]) -> List[int]:
    return sort_agent_ids(list(agents))


def layout_faults(split_path: Path, layout: Mapping[str, Mapping[int, AgentStamps]],
                  lidar_ext: str) -> List[Fault]:
    """Every fault of the agents x timestamps ``layout`` of ``split_path`` (see the module
    docstring), in scenario, timestamp, agent order."""
    faults: List[Fault] = []
    for scen in sorted(layout):
        agents = layout[scen]
        base = Path(split_path) / scen

        def yaml_of(a: int, t: str) -> Path:
            return base / str(a) / f"{t}.yaml"

        def lidar_of(a: int, t: str) -> Path:
            return base / str(a) / f"{t}.{lidar_ext}"

        def file_of(a: int, t: str) -> Path:
            return yaml_of(a, t) if t in agents[a].yaml else lidar_of(a, t)

        in_frame: Dict[str, List[int]] = {}  # timestamp -> agents with a yaml (the frame's agents)
        for a, st in agents.items():
            for t in st.yaml:
                in_frame.setdefault(t, []).append(a)

        spans = {a: (min(st.any, key=int), max(st.any, key=int)) for a, st in agents.items() if st.any}
        stamps = sorted(set().union(*(st.any for st in agents.values())), key=int)
        have_of = {t: _ids(a for a, st in agents.items() if t in st.any) for t in stamps}
        lack_of = {t: _ids(a for a, (lo, hi) in spans.items() if int(lo) < int(t) < int(hi)
                           and t not in agents[a].any) for t in stamps}
        disputed = {t for t in stamps if lack_of[t] and len(have_of[t]) <= len(lack_of[t])}

        def frame_note(t: str, left_out: int) -> str:
            present = _ids(in_frame.get(t, []))
            if not present or t in disputed:
                return f"; no frame {scen}/{t} is indexed"
            note = f"; frame {scen}/{t} holds agents {present} without agent {left_out}"
            if _ids(present + [left_out])[0] == left_out:
                note += f", so its ego (first agent) is agent {present[0]} instead of agent {left_out}"
            return note

        per_ts: Dict[str, List[Fault]] = {}
        for a in _ids(agents):
            st = agents[a]
            for t in sorted(st.lidar - st.yaml, key=int):
                per_ts.setdefault(t, []).append(Fault(
                    "no_yaml", yaml_of(a, t), f"missing, though {lidar_of(a, t).name} of agent {a} exists: the "
                    f"agent is left out at timestamp {t}" + frame_note(t, a), scen, t))
            for t in sorted(st.yaml - st.lidar, key=int):
                per_ts.setdefault(t, []).append(Fault(
                    "no_lidar", lidar_of(a, t), f"missing, though {yaml_of(a, t).name} of agent {a} exists: "
                    f"loading frame {scen}/{t} fails", scen, t))
        for t in stamps:
            have, lack = have_of[t], lack_of[t]
            if not lack:
                continue
            span_txt = ", ".join(f"{a}: {spans[a][0]}..{spans[a][1]}" for a in lack)
            if len(have) > len(lack):
                for a in lack:
                    per_ts.setdefault(t, []).append(Fault(
                        "missing", yaml_of(a, t), f"agent {a} has no file at timestamp {t} (neither .yaml nor "
                        f".{lidar_ext}) although its recording spans {spans[a][0]}..{spans[a][1]} and agents "
                        f"{have} have it" + frame_note(t, a), scen, t))
                continue
            kind = "stray" if len(have) < len(lack) else "mismatch"
            present = ", ".join(str(file_of(a, t)) for a in have)
            absent = ", ".join(str(yaml_of(a, t)) for a in lack)
            why = ("exists only for agent(s) " if kind == "stray" else "exists for agent(s) ") + str(have)
            per_ts.setdefault(t, []).append(Fault(
                kind, file_of(have[0], t), f"timestamp {t} {why} but not for agent(s) {lack} whose recordings "
                f"span it ({span_txt}): a renamed, stray or lost file? present: {present}; absent: {absent}; "
                f"no frame {scen}/{t} is indexed (a timestamp no more agents have than lack is no frame)",
                scen, t))
        for t in sorted(per_ts, key=int):
            faults.extend(per_ts[t])
    return faults


def disputed_frames(faults: Iterable[Fault]) -> Set[Tuple[str, str]]:
    """``{(scenario, timestamp)}`` of the disputed timestamps among ``faults`` (``stray``, ``mismatch``),
    which are no frames (the module docstring)."""
    return {(f.scenario, f.timestamp) for f in faults if f.kind in ("stray", "mismatch")}


def frame_faults(faults: Iterable[Fault]) -> Dict[Tuple[str, str], List[Fault]]:
    """``{(scenario, timestamp): [fault, ...]}``."""
    out: Dict[Tuple[str, str], List[Fault]] = {}
    for f in faults:
        out.setdefault((f.scenario, f.timestamp), []).append(f)
    return out
