"""Record OPV2V-H-format datasets with the built-in simulator (no CARLA, no download).

    gencomm-sim -o DIR [--scenarios N] [--frames M] [--frame_interval SECONDS] [--seed S]
        [--split_ratio 0.6 0.2 0.2] [--no_cameras] [--camera_size WxH]
        [--agent_types RIG.yaml] [--workers N] [--family junction|road|free|mixed] [--overwrite]

Writes ``DIR/{train,validate,test}/<scenario>/...`` (64-beam ``.pcd``,
``_32.pcd`` / ``_16.pcd``, ``_camera{i}.png``, ``_depth{i}.png``, ``.yaml``,
``_bev_visibility.png``), ``data_protocol.yaml`` per scenario and
``DIR/modality_assignment.json``. ``--tree heal`` puts the 32/16-beam scans and
the depth images in HEAL's side tree instead, the output path with ``OPV2V``
replaced by ``OPV2V_Hetero`` (``-o data/OPV2V`` -> ``data/OPV2V_Hetero``), where
HEAL's OPV2V-H loader looks for them; our reader finds them there too.
A rerun skips finished scenarios; the same arguments give identical files, whatever
``--workers`` (processes recording scenarios side by side). A folder recorded with other
settings is not overwritten: a recording with cameras serves a ``--no_cameras`` run, one
without cameras gets them added (same LiDAR files), any other difference is refused unless
``--overwrite``. From a checkout,
``python tools/simulate.py`` runs the same command.

``--family`` (alias ``--layout``) picks the scene family: where the connected vehicles are
(``junction``, the default: on the arms of one junction; ``road``: on the ego's street, same
direction, oncoming or in a platoon; ``free``: anywhere near the ego; ``mixed``: junction and road
scenarios in turn). Each scenario's family is ``scenario.layout`` in its ``data_protocol.yaml``
(:func:`opencood_ext.sim.families.scenario_family` reads it back).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections import Counter
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Dict

from opencood_ext.data.formats.layout import HETERO_FROM, HETERO_TO, hetero_tree
from opencood_ext.sim.agent_types import DEFAULT_PATH, load_agent_types
from opencood_ext.sim.builtin import AgentParams, BuiltinWorld, SimConfig
from opencood_ext.sim.families import DATASET_FAMILIES, MIXED, MIXED_CYCLE, check_family, scenario_layouts
from opencood_ext.sim.recorder import record
from opencood_ext.sim.town import TownParams
from opencood_ext.sim.traffic import TrafficParams


def _size(text: str):
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--camera_size must look like 800x600, got {text!r}") from None
    if w < 1 or h < 1:
        raise argparse.ArgumentTypeError(f"--camera_size must be positive, got {text!r}")
    return w, h


def default_workers() -> int:
    """min(2, the CPUs this process may use)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(2, cpus))


DEFAULT_FRAME_INTERVAL = 0.1
TICK_SECONDS = SimConfig.tick_seconds


def ticks_per_frame(interval: float) -> int:
    """Physics ticks between saved frames for ``interval`` seconds; ValueError unless a positive
    multiple of the tick (0.05 s)."""
    ticks = round(interval / TICK_SECONDS)
    if ticks < 1 or abs(ticks * TICK_SECONDS - interval) > 1e-6:
        raise ValueError(f"--frame_interval must be a positive multiple of the {TICK_SECONDS} s physics tick, "
                         f"got {interval}")
    return ticks


def _interval(text: str) -> float:
    try:
        value = float(text)
        ticks_per_frame(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--frame_interval must be a positive multiple of {TICK_SECONDS} s, "
                                         f"got {text!r}") from None
    return value


def _workers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--workers must be a positive integer, got {text!r}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gencomm-sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--out", type=Path, required=True, help="dataset root to write")
    p.add_argument("--scenarios", type=int, default=4)
    p.add_argument("--frames", type=int, default=50, help="saved frames per scenario")
    p.add_argument("--frame_interval", type=_interval, default=DEFAULT_FRAME_INTERVAL, metavar="SECONDS",
                   help=f"simulated time between saved frames (default {DEFAULT_FRAME_INTERVAL}: 10 Hz, as OPV2V); "
                        f"a multiple of the {TICK_SECONDS} s physics tick. Longer intervals make the frames of a "
                        f"scenario differ (vehicles move on), for training data as varied as OPV2V's, whose "
                        f"frames are moments of long drives")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split_ratio", type=float, nargs=3, default=(0.6, 0.2, 0.2), metavar=("TRAIN", "VAL", "TEST"))
    p.add_argument("--no_cameras", action="store_true", help="LiDAR only (no _camera / _depth PNGs)")
    p.add_argument("--camera_size", type=_size, default=None, help="WxH; intrinsics scale (default 800x600)")
    p.add_argument("--agent_types", type=Path, default=DEFAULT_PATH, help="agent types and sensor rig yaml")
    p.add_argument("--vehicles", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                   help="moving vehicles per scenario (default 20 60)")
    p.add_argument("--family", "--layout", dest="layout", default="junction", metavar="|".join(DATASET_FAMILIES),
                   help="scene family, where the connected vehicles go: 'junction' (ego approaching a junction, "
                        "collaborators on its other arms, so they see what the ego cannot), 'road' (on the ego's "
                        "street: ahead, behind, oncoming, platoons), 'free' (anywhere near the ego) or 'mixed' "
                        "(junction and road scenarios in turn)")
    p.add_argument("--points_per_second", type=int, default=None, help="override the LiDAR rate (faster tests)")
    p.add_argument("--raster_res", type=float, default=0.25, help="ground raster cell, m")
    p.add_argument("--no_shadows", action="store_true", help="skip camera shadow rays")
    p.add_argument("--pcd_data", choices=("binary", "binary_compressed", "ascii"), default="binary")
    p.add_argument("--tree", choices=("flat", "heal"), default="flat",
                   help=f"'flat': every file beside the .yaml; 'heal': the 32/16-beam scans and depth images in "
                        f"HEAL's side tree, the output path with {HETERO_FROM} replaced by {HETERO_TO}")
    p.add_argument("--workers", type=_workers, default=default_workers(),
                   help="processes recording scenarios in parallel (default min(2, CPUs)); same files for any N")
    p.add_argument("--overwrite", action="store_true",
                   help="record again the finished scenarios of OUT that were recorded with other settings "
                        "(default: refuse; a recording with cameras serves a run without them)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _rig_id(path: Path) -> str:
    """The rig file by name and content (not by location, which differs between installs)."""
    return f"{path.name} sha256:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"


def split_counts(splits: Dict[str, str]) -> str:
    """``scenario -> split`` as one short line, e.g. ``train 340, validate 20, test 40 scenarios`` (the
    scenario folders themselves are under ``<out>/<split>/``); a 400-scenario dataset used to print every name."""
    counts = Counter(splits.values())
    usual = ("train", "validate", "test")
    order = [s for s in usual if s in counts] + sorted(set(counts) - set(usual))
    return ", ".join(f"{s} {counts[s]}" for s in order) + " scenarios" if counts else "no scenarios"


def main(argv=None) -> int:
    """Exit status 0, or 2 with one line on stderr for bad input (a missing or malformed rig file,
    an output path --tree heal cannot use, a bad split ratio)."""
    args = build_parser().parse_args(argv)
    try:
        return _record(args)
    except Exception as exc:
        # imported only here: the error module pulls in the training stack (torch), seconds of start-up
        from opencood_ext.cli.errors import USER_ERRORS, report
        if isinstance(exc, (*USER_ERRORS, ValueError)):
            return report(exc)
        raise


def _record(args) -> int:
    hetero = None
    if args.tree == "heal":
        hetero = hetero_tree(args.out)
        if hetero is None:
            raise ValueError(f"--tree heal: HEAL finds the 32/16-beam scans and depth images by replacing "
                             f"{HETERO_FROM!r} with {HETERO_TO!r} in the dataset path, so the output path must "
                             f"contain {HETERO_FROM!r} (e.g. -o data/{HETERO_FROM}); got {args.out}")
    layouts = scenario_layouts(check_family(args.layout), args.scenarios)
    sensors = load_agent_types(args.agent_types)
    if args.points_per_second is not None:
        sensors = replace(sensors, lidar=replace(sensors.lidar, points_per_second=args.points_per_second))
    traffic = TrafficParams() if args.vehicles is None else TrafficParams(vehicles=tuple(args.vehicles))
    cfg = SimConfig(town=TownParams(raster_res=args.raster_res), traffic=traffic, sensors=sensors,
                    agents=AgentParams(layout=MIXED_CYCLE[0] if args.layout == MIXED else args.layout),
                    cameras=not args.no_cameras, camera_size=args.camera_size, camera_shadows=not args.no_shadows,
                    ticks_per_frame=ticks_per_frame(args.frame_interval))
    settings = {"agent_types": _rig_id(args.agent_types), "camera_size": list(args.camera_size or ()),
                "vehicles": list(traffic.vehicles), "points_per_second": sensors.lidar.points_per_second,
                "raster_res": args.raster_res, "shadows": not args.no_shadows, "layout": args.layout}
    if ticks_per_frame(args.frame_interval) != ticks_per_frame(DEFAULT_FRAME_INTERVAL):
        # only when not the default, so that recordings made before the option stay reusable
        settings["frame_interval"] = args.frame_interval
    world = BuiltinWorld(cfg)
    try:
        res = record(world, args.out, args.scenarios, args.frames, args.seed, args.split_ratio,
                     write_cameras=not args.no_cameras, pcd_data=args.pcd_data, progress=not args.quiet,
                     settings=settings, hetero_root=hetero, workers=args.workers,
                     world_factory=partial(BuiltinWorld, cfg), layouts=layouts, overwrite=args.overwrite)
    finally:
        world.close()
    side = f"; 32/16-beam scans and depth in {hetero}" if hetero else ""
    print(f"{args.out}: recorded {len(res.recorded)} scenario(s), skipped {len(res.skipped)} finished; "
          f"{split_counts(res.splits)}{side}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
