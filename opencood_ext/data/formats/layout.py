"""What the readers share: the ``<root>/<split>/<scenario>/<agent_id>/<timestamp>.*``
directory scan (OPV2V, OPV2V-H, V2XSet, V2X-Real) and the indexed-reader base
with the ``skip_bad`` policy.

``skip_bad`` policy (all readers): frames are indexed from file names only, so
a corrupt frame is found when it is loaded. With ``skip_bad=False`` the
:class:`DataFormatError` propagates. With ``skip_bad=True`` the frame is logged
(``logging.warning`` naming the file and the reason), remembered as bad and
counted once in ``.skipped``; ``reader[i]`` of a bad frame raises
:class:`SkippedFrame` (a DataFormatError) without reading it again, and
``iter(reader)`` visits every good frame exactly once. No other frame stands in
for a bad one (that would show it twice an epoch):
:class:`~opencood_ext.data.dataset.CooperativeDataset` turns a skipped frame
into a ``None`` sample that the collate function and the training and
evaluation loops leave out.

``strict`` policy (data faults, :mod:`opencood_ext.data.faults`): the
directory scan (:func:`scan_layout`) also finds agents missing inside their
recording span, stray timestamps and half-present agent files; ``.faults``
lists them. By default each is warned about (DataFaultWarning plus a logging
WARNING naming the file) and the data is read on; a disputed timestamp (a stray
or tied one: a renamed file) is no frame, so a fault never adds one to what an
evaluation scores (:func:`~opencood_ext.data.faults.disputed_frames`). With ``strict`` they are
:class:`~opencood_ext.data.errors.DataFaultError` s: raised at construction,
or with ``skip_bad`` too, when a frame they concern is loaded (so it is
skipped like any bad frame).
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

from ..errors import DataFormatError, SkippedFrame
from ..faults import AgentStamps, Fault, frame_faults, report_faults
from ..frame import Frame, sort_agent_ids

log = logging.getLogger(__name__)

_YAML_NAME = re.compile(r"^(\d+)\.yaml$")


HETERO_FROM, HETERO_TO = "OPV2V", "OPV2V_Hetero"


def hetero_tree(root) -> Optional[Path]:
    """OPV2V-H's side tree of an OPV2V ``root`` (whether or not it exists): HEAL
    finds ``_32.pcd`` / ``_16.pcd`` / ``_depth{i}.png`` by replacing every
    ``OPV2V`` in the file path with ``OPV2V_Hetero`` (``heter_utils.Adaptor.
    switch_lidar_channels``, the base dataset's depth paths); None when ``root``
    has no ``OPV2V`` or already names the side tree."""
    s = str(root)
    if HETERO_FROM not in s or HETERO_TO in s:
        return None
    return Path(s.replace(HETERO_FROM, HETERO_TO))


def split_dir(root, split: str, layout_hint: str) -> Path:
    """``root/split`` or a DataFormatError listing the splits that do exist."""
    root = Path(root)
    if not root.is_dir():
        raise DataFormatError(root, "dataset root does not exist or is not a directory")
    d = root / str(split)
    if not d.is_dir():
        existing = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise DataFormatError(root, f"split {split!r} not found; existing splits: {existing} "
                              f"(expected layout {layout_hint})", key="split")
    return d


def _int_or_none(name: str) -> Optional[int]:
    try:
        return int(name)
    except ValueError:
        return None


def scan_layout(split_path: Path, lidar_ext: str = "pcd") -> Dict[str, Dict[int, AgentStamps]]:
    """``{scenario: {agent_id: AgentStamps(yaml, lidar)}}`` from file names only: the
    timestamps at which each integer-named agent directory has ``<timestamp>.yaml`` and
    ``<timestamp>.<lidar_ext>`` (agents and scenarios with neither are left out)."""
    lidar_name = re.compile(r"^(\d+)\." + re.escape(lidar_ext) + "$")
    out: Dict[str, Dict[int, AgentStamps]] = {}
    for scen in sorted(os.scandir(split_path), key=lambda e: e.name):
        if not scen.is_dir():
            continue
        agents: Dict[int, AgentStamps] = {}
        for ag in os.scandir(scen.path):
            aid = _int_or_none(ag.name) if ag.is_dir() else None
            if aid is None:
                continue
            names = os.listdir(ag.path)
            st = AgentStamps(yaml={m.group(1) for m in map(_YAML_NAME.match, names) if m},
                             lidar={m.group(1) for m in map(lidar_name.match, names) if m})
            if st.yaml or st.lidar:
                agents[aid] = st
        if agents:
            out[scen.name] = agents
        else:
            log.debug("%s: no <agent_id>/<timestamp>.yaml or point-cloud files; scenario ignored", scen.path)
    return out


def yaml_tree(layout: Dict[str, Dict[int, AgentStamps]]) -> Dict[str, Dict[int, List[str]]]:
    """The :func:`scan_scenarios` view of a :func:`scan_layout`: agents with a yaml, their yaml timestamps."""
    out: Dict[str, Dict[int, List[str]]] = {}
    for scen, agents in layout.items():
        tree = {a: sorted(st.yaml) for a, st in agents.items() if st.yaml}
        if tree:
            out[scen] = tree
        else:
            log.debug("scenario %s: point clouds but no <agent_id>/<timestamp>.yaml files; no frames", scen)
    return out


def scan_scenarios(split_path: Path) -> Dict[str, Dict[int, List[str]]]:
    """``{scenario: {agent_id: [timestamp, ...]}}`` from file names only.

    Agent directories are the integer-named sub-directories of a scenario; a
    timestamp exists for an agent when ``<timestamp>.yaml`` does.
    """
    return yaml_tree(scan_layout(split_path))


def frame_keys(scenarios: Dict[str, Dict[int, List[str]]]) -> List[Tuple[str, str, Tuple[int, ...]]]:
    """One ``(scenario, timestamp, agent_ids)`` per timestamp any agent has;
    agent ids sorted vehicles first (by id), then RSUs."""
    keys = []
    for scen, agents in scenarios.items():
        by_stamp: Dict[str, List[int]] = {}
        for aid, stamps in agents.items():
            for ts in stamps:
                by_stamp.setdefault(ts, []).append(aid)
        for ts in sorted(by_stamp):
            keys.append((scen, ts, tuple(sort_agent_ids(by_stamp[ts]))))
    return keys


class IndexedReader:
    """Base of every reader: ``len``, ``reader[i] -> Frame``, iteration, skip_bad.

    Subclasses set ``self._root`` and implement ``__len__``, ``_load(i)`` and
    ``frame_path(i)``.
    """

    def __init__(self, skip_bad: bool = False, strict: bool = False):
        self.skip_bad = bool(skip_bad)
        self.strict = bool(strict)
        self.skipped = 0
        self._bad: Dict[int, str] = {}  # frame index -> why it is bad
        self._root: Path = Path(".")
        self.faults: List[Fault] = []  # index-time data faults (opencood_ext.data.faults)
        self._frame_faults: Dict[Tuple[str, str], List[Fault]] = {}
        self._faults_where: Path = Path(".")

    # ------------------------------------------------------------------ data faults
    def _set_faults(self, faults: List[Fault], where: Path, indexed: Set[Tuple[str, str]]) -> None:
        """Keep the index-time ``faults`` and apply the policy (see :mod:`opencood_ext.data.faults`):
        warn (default), raise (strict), or with strict and skip_bad leave them to the frames they
        concern (warning now about those of frames not indexed, which no load will meet)."""
        self.faults = list(faults)
        self._faults_where = Path(where)
        self._frame_faults = frame_faults(self.faults)
        if not self.strict:
            report_faults(self.faults, where, strict=False)
        elif not self.skip_bad:
            report_faults(self.faults, where, strict=True)
        else:
            report_faults([f for f in self.faults if (f.scenario, f.timestamp) not in indexed], where, strict=False)

    def set_strict(self, strict: bool = True) -> None:
        """Turn the strict setting on (or off) after construction, as ``data.strict`` does: from
        now on a fault is a DataFaultError; without skip_bad, index-time faults found at
        construction (and warned about then) are raised at once."""
        was, self.strict = self.strict, bool(strict)
        if self.strict and not was and not self.skip_bad:
            report_faults(self.faults, self._faults_where, strict=True)

    def _check_frame_faults(self, scenario: str, timestamp: str) -> None:
        """Strict: a frame with an index-time fault raises it (skip_bad then leaves the frame out)."""
        found = self._frame_faults.get((scenario, timestamp)) if self.strict else None
        if found:
            more = f" [and {len(found) - 1} more fault(s) in this frame]" if len(found) > 1 else ""
            raise found[0].error(more)

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _load(self, i: int) -> Frame:  # pragma: no cover - abstract
        raise NotImplementedError

    def frame_path(self, i: int) -> Path:  # pragma: no cover - abstract
        raise NotImplementedError

    def _index(self, i: int) -> int:
        n = len(self)
        j = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"frame index {i} out of range for {n} frames under {self._root}")
        return j

    def _try_load(self, j: int) -> Optional[Frame]:
        if j in self._bad:
            return None
        try:
            return self._load(j)
        except DataFormatError as exc:
            self._bad[j] = str(exc)
            self.skipped += 1
            log.warning("skipping bad frame %d (%s): %s", j, self.frame_path(j), exc)
            return None

    def __getitem__(self, i: int) -> Frame:
        j = self._index(i)
        if not self.skip_bad:
            return self._load(j)
        frame = self._try_load(j)
        if frame is None:
            raise SkippedFrame(self.frame_path(j), f"frame {j} skipped (skip_bad): {self._bad[j]}")
        return frame

    def __iter__(self) -> Iterator[Frame]:
        for j in range(len(self)):
            frame = self._try_load(j) if self.skip_bad else self._load(j)
            if frame is not None:
                yield frame
