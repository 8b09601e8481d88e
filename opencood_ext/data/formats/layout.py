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
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from ..errors import DataFormatError, SkippedFrame
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


def scan_scenarios(split_path: Path) -> Dict[str, Dict[int, List[str]]]:
    """``{scenario: {agent_id: [timestamp, ...]}}`` from file names only.

    Agent directories are the integer-named sub-directories of a scenario; a
    timestamp exists for an agent when ``<timestamp>.yaml`` does.
    """
    out: Dict[str, Dict[int, List[str]]] = {}
    for scen in sorted(os.scandir(split_path), key=lambda e: e.name):
        if not scen.is_dir():
            continue
        agents: Dict[int, List[str]] = {}
        for ag in os.scandir(scen.path):
            aid = _int_or_none(ag.name) if ag.is_dir() else None
            if aid is None:
                continue
            stamps = sorted(m.group(1) for m in (_YAML_NAME.match(f) for f in os.listdir(ag.path)) if m)
            if stamps:
                agents[aid] = stamps
        if agents:
            out[scen.name] = agents
        else:
            log.debug("%s: no <agent_id>/<timestamp>.yaml files; scenario ignored", scen.path)
    return out


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

    def __init__(self, skip_bad: bool = False):
        self.skip_bad = bool(skip_bad)
        self.skipped = 0
        self._bad: Dict[int, str] = {}  # frame index -> why it is bad
        self._root: Path = Path(".")

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
