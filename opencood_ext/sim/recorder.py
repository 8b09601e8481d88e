"""Record any :class:`~opencood_ext.sim.world.World` as an OPV2V-H dataset.

Layout (read back by :class:`opencood_ext.data.formats.OPV2VReader`)::

    <out>/<split>/<scenario>/data_protocol.yaml
    <out>/<split>/<scenario>/<agent_id>/<timestamp>{.pcd,.yaml,_bev_visibility.png,_camera{i}.png}
    <het>/<split>/<scenario>/<agent_id>/<timestamp>{_32.pcd,_16.pcd,_depth{i}.png}
    <out>/modality_assignment.json          {scenario: {agent_id: "m1".."m4"}}
    <out>/.gencomm_sim/scenario_NNNN.json    completion markers
    <out>/.gencomm_sim/lock                  held by the recorder writing the folder

``<het>`` is ``<out>`` itself, or HEAL's ``OPV2V_Hetero`` side tree when
``hetero_root`` is given (see :func:`opencood_ext.data.formats.layout.hetero_tree`).

Scenario ``k`` uses the seed ``SeedSequence([seed, k])`` and goes to the split
given by ``split_ratio`` (contiguous blocks: train, validate, test). Its
completion marker is written LAST and atomically, so a rerun skips exactly
the finished scenarios and redoes (after deleting) a half-written one. The
same arguments give byte-identical files.

A finished scenario recorded with other settings is never silently replaced
(several runs share a dataset folder, e.g. every protocol of the main job shares
its test set): a recording with cameras serves a run without cameras (the
scans, labels and poses do not depend on the cameras; what cameras add is
their images, the frame yaml's ``camera<i>`` entries and camera agents'
visibility masks, which LiDAR-only runs do not read), a recording without
cameras is recorded again when cameras are asked for (the same scans, with
the camera files added), and any other difference is refused, naming the
marker and the setting, unless ``overwrite`` is given.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from tqdm import tqdm

from opencood_ext.atomic_files import atomic_write_json
from opencood_ext.data.formats import write_data_protocol, write_modality_json, write_opv2v_frame
from opencood_ext.data.formats.opv2v_writer import WRITER_FORMAT
from opencood_ext.file_lock import HeldLock

from .world import World

SPLITS = ("train", "validate", "test")
MARKER_DIR = ".gencomm_sim"
MODALITY_JSON = "modality_assignment.json"
_BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


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


CAMERA_SETTINGS = ("cameras", "camera_size", "shadows")   # marker settings that change only camera images


def _lidar_settings(run: dict) -> dict:
    return {k: v for k, v in run.items() if k not in CAMERA_SETTINGS}


def _reuse_verdict(done: dict, seed: int, split: str, run: dict) -> str:
    """What to do with a finished scenario whose marker is ``done``, for a run asking ``seed``,
    ``split`` and settings ``run``: "reuse" (same, or recorded with cameras and none asked), "add
    cameras" (recorded without cameras, asked with: recorded again, same LiDAR files) or what
    differs, in words (to be refused unless overwriting)."""
    if done.get("seed") != seed or done.get("split") != split:
        return (f"seed {done.get('seed')} / split {done.get('split')!r} recorded, "
                f"seed {seed} / split {split!r} asked")
    had = done.get("run") or {}
    if had == run:
        return "reuse"
    if _lidar_settings(had) == _lidar_settings(run):
        if had.get("cameras") is True and run.get("cameras") is False:
            return "reuse"
        if had.get("cameras") is False and run.get("cameras") is True:
            return "add cameras"
    keys = sorted(k for k in set(had) | set(run) if had.get(k) != run.get(k))
    return ", ".join(f"{k}: recorded {had.get(k)!r}, asked {run.get(k)!r}" for k in keys)


@dataclass(frozen=True)
class _Job:
    """One scenario to record (everything a worker process needs besides its world)."""

    index: int
    split: str
    seed: int
    frames: int
    out: Path
    het: Optional[Path]
    run: dict
    write_cameras: bool
    pcd_data: str
    layout: Optional[str] = None   # the scene family of this scenario (None: the world's own)


def _record_scenario(world: World, job: _Job, seen: Optional[set] = None,
                     bar=None) -> Tuple[str, dict, List[Path]]:
    """Simulate and write one scenario, marker last; returns (name, assignment, ego yaml per frame).
    A name in ``seen`` (scenario names already used; this one is added) is refused before anything
    is written."""
    out, het, split = job.out, job.het, job.split
    if job.layout is None:
        world.reset(job.seed)
    else:
        world.reset(job.seed, layout=job.layout)
    name = world.scenario
    if seen is not None:
        if name in seen:
            raise RuntimeError(f"scenario name {name!r} repeats (scenarios {job.index} and an earlier one); "
                               f"choose another --seed")
        seen.add(name)
    # an earlier recording's marker goes first: were this one interrupted, its half-written files
    # must not pass for that finished scenario
    (out / MARKER_DIR / f"scenario_{job.index:04d}.json").unlink(missing_ok=True)
    for scen_dir in {out / split / name, (het or out) / split / name}:
        if scen_dir.exists():
            shutil.rmtree(scen_dir)   # left over from an interrupted run, or recorded with other settings
    if bar is not None:
        bar.set_postfix_str(f"{split}/{name}")
    paths = []
    for _ in range(job.frames):
        frame = world.tick()
        frame.split = split
        write_opv2v_frame(out, split, frame, pcd_data=job.pcd_data, write_cameras=job.write_cameras,
                          hetero_root=het)
        paths.append(out / split / name / str(frame.agents[0].agent_id) / f"{frame.timestamp}.yaml")
        if bar is not None:
            bar.update(1)
    assignment = {str(a.agent_id): a.agent_type for a in world.agents}
    write_data_protocol(out, split, name, {**world.protocol(), "recorder": job.run})
    atomic_write_json(out / MARKER_DIR / f"scenario_{job.index:04d}.json",
                      {"index": job.index, "seed": job.seed, "split": split, "scenario": name,
                       "assignment": assignment, "run": job.run}, indent=2, sort_keys=True)
    return name, assignment, paths


_WORKER_WORLD: Optional[World] = None   # the world of a recorder worker process
_WORKER_PARENT: Optional[int] = None    # the pid of the process that started it


_PARENT_POLL_S = 2.0  # how often an idle worker checks that its recorder is still alive


def _init_worker(world_factory: Callable[[], World]) -> None:
    global _WORKER_WORLD, _WORKER_PARENT
    _WORKER_WORLD = world_factory()
    _WORKER_PARENT = os.getppid()
    threading.Thread(target=_exit_when_orphaned, args=(_WORKER_PARENT,), daemon=True).start()


def _exit_when_orphaned(parent: int) -> None:
    """A worker whose recorder was killed (SIGKILL, or a kill of the recorder alone, not its process
    group) would otherwise wait on the pool's queue for good, holding its world (about 450 MB); it
    leaves once its parent is gone. A scenario it is recording is cut short: its marker is never
    written, so the next recorder records it again."""
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)


def _worker_job(job: _Job) -> Tuple[str, dict, List[Path]]:
    if os.getppid() != _WORKER_PARENT:
        # the recorder was killed: starting the next queued scenario would write into a folder that is
        # no longer locked (another recorder may be writing it)
        raise SystemExit(f"recorder worker: parent {_WORKER_PARENT} is gone, not starting scenario {job.index}")
    return _record_scenario(_WORKER_WORLD, job)


@contextlib.contextmanager
def _folder_lock(out: Path):
    """Hold ``out/.gencomm_sim/lock`` while open (:class:`~opencood_ext.file_lock.HeldLock`): a second
    recorder of the same folder (another job sharing the dataset) waits here, then finds the scenarios
    finished, instead of writing the same files at the same time. Released when the process ends,
    however it ends; emptied when it ends normally."""
    def busy(holder: str) -> None:
        print(f"{out}: {holder or 'another process'} is recording into this folder; waiting for it to finish",
              flush=True)
    lock = HeldLock(out / MARKER_DIR / "lock", busy)
    try:
        yield
    finally:
        lock.release("")


@contextlib.contextmanager
def _single_threaded_blas():
    """While open, processes started from this one get one BLAS / OpenMP thread (where the user set
    no count). The workers already fill the cores; a BLAS thread pool in each only spins (it doubled
    the CPU time of the BEV visibility masks). One thread or several, the files came out the same
    (tests/opencood_ext/sim/test_sim_speed_identity.py)."""
    saved = {k: os.environ.get(k) for k in _BLAS_THREAD_VARS}
    for k in _BLAS_THREAD_VARS:
        os.environ.setdefault(k, "1")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_pool(jobs: List[_Job], world_factory: Callable[[], World], workers: int, bar) -> list:
    """Results of ``jobs`` (in order) recorded by ``workers`` spawned processes; the first failure is
    raised after cancelling the jobs not yet started."""
    ctx = multiprocessing.get_context("spawn")   # no fork of a process that may hold Embree / BLAS threads
    with _single_threaded_blas(), ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx,
                                                      initializer=_init_worker, initargs=(world_factory,)) as pool:
        futures = [pool.submit(_worker_job, job) for job in jobs]
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)   # progress per scenario
            for f in finished:
                if f.exception() is not None:
                    pool.shutdown(cancel_futures=True)
                    raise f.exception()
                bar.update(jobs[futures.index(f)].frames)
        return [f.result() for f in futures]


def record(world: World, out, scenarios: int, frames: int, seed: int = 0,
           split_ratio: Sequence[float] = (0.6, 0.2, 0.2), write_cameras: bool = True,
           pcd_data: str = "binary", progress: bool = True, settings: Optional[dict] = None,
           hetero_root=None, workers: int = 1,
           world_factory: Optional[Callable[[], World]] = None,
           layouts: Optional[Sequence[str]] = None, overwrite: bool = False) -> RecordResult:
    """Simulate ``scenarios`` x ``frames`` and write them under ``out``.

    ``settings`` (plain YAML types) is stored in each ``data_protocol.yaml``
    under ``recorder`` and in the markers, with the writer's file format and
    the side tree. A finished scenario whose marker differs from this run (seed,
    split or settings) is reused or recorded again as the module docstring says;
    other differences raise ``ValueError`` before anything is written, unless
    ``overwrite`` (then it is recorded again). ``hetero_root``: where the
    32/16-beam scans and depth images go (None: beside the rest).

    ``workers`` > 1 records scenarios in that many processes (spawned), each
    building its world with ``world_factory`` (picklable, e.g.
    ``functools.partial(BuiltinWorld, cfg)``); ``world`` is then not used. A
    scenario depends only on its own seed, so the files are the same for any
    ``workers``. ``layouts``: the scene family of each scenario index, passed to
    ``world.reset(seed, layout=...)`` (:func:`opencood_ext.sim.families.scenario_layouts`; None: the
    world's own; ``settings`` should name the plan, so that markers of another plan are not taken
    for this one). A repeated scenario name (an unlucky ``seed``) is refused before its files are
    written with one worker, after the run with several. Two recorders of one folder take turns
    (``.gencomm_sim/lock``); progress is counted per finished scenario.
    """
    if scenarios < 1 or frames < 1:
        raise ValueError(f"need at least one scenario and one frame, got scenarios={scenarios}, frames={frames}")
    out = Path(out)
    marks = out / MARKER_DIR
    marks.mkdir(parents=True, exist_ok=True)
    plan = split_plan(scenarios, split_ratio)
    if layouts is not None and len(layouts) != scenarios:
        raise ValueError(f"record: layouts needs one scene family per scenario ({scenarios}), got {len(layouts)}")
    het = None if hetero_root is None else Path(hetero_root)
    run = {"seed": int(seed), "frames": int(frames), "pcd_data": pcd_data, "cameras": bool(write_cameras),
           "format": WRITER_FORMAT, "hetero_tree": None if het is None else het.name, **(settings or {})}
    with _folder_lock(out):
        result = RecordResult(out)
        todo: List[_Job] = []
        conflicts: List[str] = []
        for k, split in enumerate(plan):
            marker = marks / f"scenario_{k:04d}.json"
            sseed = scenario_seed(seed, k)
            done = json.loads(marker.read_text()) if marker.exists() else None
            verdict = "record" if done is None else _reuse_verdict(done, sseed, split, run)
            if verdict == "reuse" and not all((root / split / str(done.get("scenario"))).is_dir()
                                              for root in {out, het or out}):
                verdict = "record"   # a folder of the finished scenario is gone
            if verdict == "reuse":
                result.skipped.append(done["scenario"])
                result.assignment[done["scenario"]] = done["assignment"]
                result.splits[done["scenario"]] = split
                continue
            if verdict not in ("record", "add cameras") and not overwrite:
                conflicts.append(f"{marker}: {verdict}")
            todo.append(_Job(k, split, sseed, frames, out, het, run, write_cameras, pcd_data,
                             None if layouts is None else layouts[k]))
        if conflicts:
            raise ValueError(f"{out}: {len(conflicts)} finished scenario(s) were recorded with other settings, "
                             f"which this run would replace: {'; '.join(conflicts[:3])}"
                             f"{' ...' if len(conflicts) > 3 else ''}. Record into another folder, or pass "
                             f"--overwrite (overwrite=True) to record them again")
        bar = tqdm(total=scenarios * frames, initial=(scenarios - len(todo)) * frames, unit="frame",
                   disable=not progress, desc="simulate")
        try:
            if workers > 1 and len(todo) > 1:
                if world_factory is None:
                    raise ValueError("record(workers > 1) needs world_factory "
                                     "(each worker process builds its own world)")
                done_jobs = _run_pool(todo, world_factory, workers, bar)
            else:
                seen = set(result.splits)
                done_jobs = [_record_scenario(world, job, seen, bar) for job in todo]
        finally:
            bar.close()
        for job, (name, assignment, paths) in sorted(zip(todo, done_jobs), key=lambda jd: jd[0].index):
            if name in result.splits:
                raise RuntimeError(f"scenario name {name!r} repeats (scenarios {job.index} and an earlier one); "
                                   f"choose another --seed")
            result.recorded.append(name)
            result.assignment[name] = assignment
            result.splits[name] = job.split
            result.frames.extend(paths)
        write_modality_json(out / MODALITY_JSON, {**_other_scenarios(out, het, result.splits), **result.assignment})
        return result


def _other_scenarios(out: Path, het: Optional[Path], ours: Mapping[str, str]) -> Dict[str, dict]:
    """The modality entries of scenarios ``out`` holds that this run did not cover (a run asking for
    fewer scenarios than an earlier one recorded): they stay in ``modality_assignment.json`` as long as
    their folders are there."""
    path = out / MODALITY_JSON
    if not path.is_file():
        return {}
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); delete it, the simulator writes it again") from exc
    on_disk = {p.name for root in {out, het or out} for split in SPLITS if (root / split).is_dir()
               for p in (root / split).iterdir()}
    return {name: agents for name, agents in table.items() if name not in ours and name in on_disk}


def record_world(world: World, out, split: str = "train", frames: int = 50, scenarios: int = 1, seed: int = 0,
                 write_cameras: bool = True, progress: bool = True) -> List[Path]:
    """Record ``scenarios`` x ``frames`` of ``world`` into one ``split``; returns
    the ego yaml path of every frame written (see :func:`record`)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    ratio = [1.0 if s == split else 0.0 for s in SPLITS]
    return record(world, out, scenarios, frames, seed, ratio, write_cameras=write_cameras,
                  progress=progress).frames
