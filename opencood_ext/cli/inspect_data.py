"""Summarise a dataset and one of its frames; optionally draw a bird's-eye view.

    gencomm-inspect-data ROOT --format opv2v|dairv2x|v2xreal [--split S]
        [--frame I] [--json] [--plot out.png] [--mode vc|ic|v2v|i2i] [--strict]

Prints the scenarios, the frame count and, for frame I (default 0), every
agent with its type, point count, extra beams, cameras, and the ground-truth
counts, then every data fault the reader's index-time check found (an agent
file missing inside its recording span, a stray timestamp, a yaml without its
point cloud or the reverse; ``opencood_ext.data.faults``), one line each,
starting with the file. ``--strict``: a fault is an error (exit 2) instead.
``--json`` prints the same as JSON on stdout. ``--plot`` draws every
agent's points in the ego (first agent's) LiDAR frame, one colour per agent,
with the ground-truth boxes; left-handed CARLA frames are drawn with y flipped
(and the title says so). For ``dairv2x``, ``--split`` is an optional JSON list
of vehicle frame ids. ``python tools/inspect_data.py`` in a checkout runs the same command.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections import Counter
from pathlib import Path

from opencood_ext.cli.errors import USER_ERRORS, report
from opencood_ext.data.errors import DataFaultWarning
from opencood_ext.data.formats import READERS, get_reader
from opencood_ext.data.ground_truth import frame_ground_truth
from opencood_ext.geometry import boxes_to_corners, relative_transform, transform_points

MAX_PLOT_POINTS = 40000  # per agent, evenly subsampled


def summarise(reader, index: int) -> dict:
    frame = reader[index]
    ego = frame.agents[0]
    gt = frame_ground_truth(frame, ego.T_world_from_lidar)
    agents = []
    for a in frame.agents:
        agents.append({
            "id": a.agent_id, "type": a.agent_type, "rsu": a.is_rsu, "points": int(len(a.lidar)),
            "beams": {str(n): int(len(p)) for n, p in sorted(a.lidar_beams.items())},
            "cameras": [{"name": c.name,
                         "image": None if c.image is None else list(c.image.shape),
                         "depth": None if c.depth is None else list(c.depth.shape)} for c in a.cameras],
            "visible_objects": len(a.visible_ids),
            "position_in_ego": [round(float(v), 3) for v in
                                relative_transform(ego.T_world_from_lidar, a.T_world_from_lidar)[:3, 3]],
        })
    return {
        "scenarios": list(reader.scenarios), "num_frames": len(reader),
        "faults": [{"kind": f.kind, "path": str(f.path), "problem": f.problem}
                   for f in getattr(reader, "faults", [])],
        "frame": {"index": index, "scenario": frame.scenario, "timestamp": frame.timestamp,
                  "agents": agents,
                  "gt": {"total": len(gt), "by_class": dict(sorted(Counter(gt.types).items()))}},
    }, frame


def plot_bev(frame, path: Path, flip_y: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ego = frame.agents[0]
    s = -1.0 if flip_y else 1.0
    fig, ax = plt.subplots(figsize=(10, 10))
    colours = plt.get_cmap("tab10")
    for k, a in enumerate(frame.agents):
        pts = transform_points(relative_transform(ego.T_world_from_lidar, a.T_world_from_lidar), a.lidar)
        step = max(1, len(pts) // MAX_PLOT_POINTS)
        pts = pts[::step]
        ax.scatter(pts[:, 0], s * pts[:, 1], s=0.2, color=colours(k % 10), label=f"agent {a.agent_id}",
                   rasterized=True)
    gt = frame_ground_truth(frame, ego.T_world_from_lidar)
    for corners in boxes_to_corners(gt.boxes):
        ring = corners[[0, 1, 2, 3, 0]]
        ax.plot(ring[:, 0], s * ring[:, 1], color="red", linewidth=0.8)
        ax.plot(ring[:2, 0], s * ring[:2, 1], color="black", linewidth=1.2)  # front edge
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("-y (m)" if flip_y else "y (m)")
    title = f"{frame.scenario} {frame.timestamp}: BEV in agent {ego.agent_id}'s LiDAR frame, {len(gt)} GT boxes"
    if flip_y:
        title += "\n(y flipped for display: left-handed CARLA frame)"
    ax.set_title(title)
    ax.legend(loc="upper right", markerscale=20)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _print_text(info: dict, args) -> None:
    print(f"dataset  {args.root} ({args.format}{', split ' + str(args.split) if args.split else ''})")
    print(f"scenarios ({len(info['scenarios'])}): {', '.join(info['scenarios'][:10])}"
          f"{' ...' if len(info['scenarios']) > 10 else ''}")
    print(f"frames   {info['num_frames']}")
    f = info["frame"]
    print(f"frame {f['index']}: scenario {f['scenario']} timestamp {f['timestamp']}")
    for a in f["agents"]:
        cams = ", ".join(f"{c['name']}{'' if c['image'] is None else ' ' + 'x'.join(map(str, c['image'][:2]))}"
                         f"{'+depth' if c['depth'] else ''}" for c in a["cameras"]) or "none"
        beams = ", ".join(f"{n}-beam {p}" for n, p in a["beams"].items())
        print(f"  agent {a['id']:>5} {'RSU' if a['rsu'] else 'CAV'} type {a['type'] or '-':4s} "
              f"points {a['points']:7d}{' (' + beams + ')' if beams else ''}  cameras: {cams}  "
              f"visible objects {a['visible_objects']}")
    print(f"  ground truth: {f['gt']['total']} boxes {f['gt']['by_class']}")
    print(f"data faults ({len(info['faults'])})" + (":" if info["faults"] else ""))
    for fault in info["faults"]:
        print(f"  [{fault['kind']}] {fault['path']}: {fault['problem']}")


def build_reader(fmt: str, root, split, **kw):
    """The reader, without its own report of the index-time data faults (the tool lists them)."""
    faults_log = logging.getLogger("opencood_ext.data.faults")
    level = faults_log.level
    faults_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DataFaultWarning)
            return get_reader(fmt, root, split, **kw)
    finally:
        faults_log.setLevel(level)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gencomm-inspect-data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", type=Path)
    p.add_argument("--format", required=True, choices=sorted(READERS))
    p.add_argument("--split", default=None)
    p.add_argument("--frame", type=int, default=0)
    p.add_argument("--mode", default=None, help="V2X-Real mode: vc, ic, v2v, i2i")
    p.add_argument("--modality", default=None,
                   help="OPV2V: agent-type assignment, 'in_order' or a JSON path (default: ROOT/"
                        "modality_assignment.json when present)")
    p.add_argument("--json", action="store_true", help="print JSON on stdout")
    p.add_argument("--plot", type=Path, default=None, help="write a BEV PNG here")
    p.add_argument("--strict", action="store_true",
                   help="data faults (missing agent files, stray timestamps, NaN/inf points) are errors")
    return p


def main(argv=None) -> int:
    """Exit status 0, or 2 with one line on stderr for a missing or malformed dataset or frame."""
    args = build_parser().parse_args(argv)
    kw = {"mode": args.mode} if args.mode and args.format == "v2xreal" else {}
    if args.strict:
        kw["strict"] = True
    if args.format == "opv2v":
        default_json = args.root / "modality_assignment.json"
        modality = args.modality or (str(default_json) if default_json.exists() else None)
        if modality:
            kw["modality"] = modality
    try:
        reader = build_reader(args.format, args.root, args.split, **kw)
        info, frame = summarise(reader, args.frame)
    except (*USER_ERRORS, ValueError, IndexError) as exc:
        return report(exc)
    if args.plot is not None:
        plot_bev(frame, args.plot, flip_y=bool(getattr(reader, "left_handed", False)))
        info["plot"] = str(args.plot)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_text(info, args)
        if args.plot is not None:
            print(f"plot     {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
