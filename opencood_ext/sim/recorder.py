"""Record any :class:`~opencood_ext.sim.world.World` as an OPV2V-H dataset.

Layout (read back by :class:`opencood_ext.data.formats.OPV2VReader`)::

    <out>/<split>/<scenario>/data_protocol.yaml
    <out>/<split>/<scenario>/<agent_id>/<timestamp>{.pcd,.yaml,_bev_visibility.png,_camera{i}.png}
    <het>/<split>/<scenario>/<agent_id>/<timestamp>{_32.pcd,_16.pcd,_depth{i}.png}
    <out>/modality_assignment.json          {scenario: {agent_id: "m1".."m4"}}
    <out>/.gencomm_sim/scenario_NNNN.json    completion markers

``<het>`` is ``<out>`` itself, or HEAL's ``OPV2V_Hetero`` side tree when
``hetero_root`` is given (see :func:`opencood_ext.data.formats.layout.hetero_tree`).

Scenario ``k`` uses the seed ``SeedSequence([seed, k])`` and goes to the split
given by ``split_ratio`` (contiguous blocks: train, validate, test). Its
completion marker is written LAST and atomically, so a rerun skips exactly
the finished scenarios and redoes (after deleting) a half-written one. The
same arguments give byte-identical files.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
from tqdm import tqdm

from opencood_ext.data.formats import write_data_protocol, write_modality_json, write_opv2v_frame
from opencood_ext.data.formats.opv2v_writer import WRITER_FORMAT

from .world import World

SPLITS = ("train", "validate", "test")
MARKER_DIR = ".gencomm_sim"
MODALITY_JSON = "modality_assignment.json"


def split_plan(n: int, ratio: Sequence[float]) -> List[str]:
    """Split name per scenario index: largest-remainder counts, contiguous blocks."""
    r = np.asarray(ratio, dtype=np.float64)
    if r.shape != (3,) or (r < 0).any() or r.sum() <= 0:
        raise ValueError(f"split_ratio must be 3 non-negative numbers (train validate test), got {list(ratio)}")
    share = r / r.sum() * n
    counts = np.floor(share).astype(int)
    for k in np.argsort(-(share - counts), kind="stable")[: n - counts.sum()]:
        counts[k] += 1
    return [s for s, c in zip(SPLITS, counts) for _ in range(c)]


def scenario_seed(seed: int, index: int) -> int:
    """Independent 63-bit seed of scenario ``index``."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(2, np.uint64)[0] >> np.uint64(1))


@dataclass
class RecordResult:
    out: Path
    recorded: List[str] = field(default_factory=list)   # scenarios simulated in this run
    skipped: List[str] = field(default_factory=list)    # scenarios finished by an earlier run
    assignment: Dict[str, Dict[str, str]] = field(default_factory=dict)
    splits: Dict[str, str] = field(default_factory=dict)   # scenario -> split
    frames: List[Path] = field(default_factory=list)        # ego yaml of every frame written in this run


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def record(world: World, out, scenarios: int, frames: int, seed: int = 0,
           split_ratio: Sequence[float] = (0.6, 0.2, 0.2), write_cameras: bool = True,
           pcd_data: str = "binary", progress: bool = True, settings: Optional[dict] = None,
           hetero_root=None) -> RecordResult:
    """Simulate ``scenarios`` x ``frames`` and write them under ``out``.

    ``settings`` (plain YAML types) is stored in each ``data_protocol.yaml``
    under ``recorder`` and in the markers, with the writer's file format and
    the side tree; a marker whose settings differ from this run's is not
    trusted (the scenario is recorded again). ``hetero_root``: where the
    32/16-beam scans and depth images go (None: beside the rest).
    """
    if scenarios < 1 or frames < 1:
        raise ValueError(f"need at least one scenario and one frame, got scenarios={scenarios}, frames={frames}")
    out = Path(out)
    marks = out / MARKER_DIR
    marks.mkdir(parents=True, exist_ok=True)
    plan = split_plan(scenarios, split_ratio)
    het = None if hetero_root is None else Path(hetero_root)
    run = {"seed": int(seed), "frames": int(frames), "pcd_data": pcd_data, "cameras": bool(write_cameras),
           "format": WRITER_FORMAT, "hetero_tree": None if het is None else het.name, **(settings or {})}
    result = RecordResult(out)
    bar = tqdm(total=scenarios * frames, unit="frame", disable=not progress, desc="simulate")
    try:
        for k, split in enumerate(plan):
            marker = marks / f"scenario_{k:04d}.json"
            sseed = scenario_seed(seed, k)
            done = json.loads(marker.read_text()) if marker.exists() else None
            if done is not None and done.get("seed") == sseed and done.get("split") == split \
                    and done.get("run") == run and all((root / split / str(done.get("scenario"))).is_dir()
                                                       for root in {out, het or out}):
                result.skipped.append(done["scenario"])
                result.assignment[done["scenario"]] = done["assignment"]
                result.splits[done["scenario"]] = split
                bar.update(frames)
                continue
            world.reset(sseed)
            name = world.scenario
            if name in result.splits:
                raise RuntimeError(f"scenario name {name!r} repeats (scenarios {k} and an earlier one); "
                                   f"choose another --seed")
            for scen_dir in {out / split / name, (het or out) / split / name}:
                if scen_dir.exists():
                    shutil.rmtree(scen_dir)   # left over from an interrupted run
            bar.set_postfix_str(f"{split}/{name}")
            for _ in range(frames):
                frame = world.tick()
                frame.split = split
                write_opv2v_frame(out, split, frame, pcd_data=pcd_data, write_cameras=write_cameras,
                                  hetero_root=het)
                result.frames.append(out / split / name / str(frame.agents[0].agent_id) / f"{frame.timestamp}.yaml")
                bar.update(1)
            assignment = {str(a.agent_id): a.agent_type for a in world.agents}
            write_data_protocol(out, split, name, {**world.protocol(), "recorder": run})
            _write_json_atomic(marker, {"index": k, "seed": sseed, "split": split, "scenario": name,
                                        "assignment": assignment, "run": run})
            result.recorded.append(name)
            result.assignment[name] = assignment
            result.splits[name] = split
    finally:
        bar.close()
    write_modality_json(out / MODALITY_JSON, result.assignment)
    return result


def record_world(world: World, out, split: str = "train", frames: int = 50, scenarios: int = 1, seed: int = 0,
                 write_cameras: bool = True, progress: bool = True) -> List[Path]:
    """Record ``scenarios`` x ``frames`` of ``world`` into one ``split``; returns
    the ego yaml path of every frame written (see :func:`record`)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    ratio = [1.0 if s == split else 0.0 for s in SPLITS]
    return record(world, out, scenarios, frames, seed, ratio, write_cameras=write_cameras,
                  progress=progress).frames
