"""What warping a BEV feature map costs a trained detector, on its own scan.

    python tools/bench.py warp --model_dir results/runs/m1m3_intermediate [--split test]
                               [--max_frames N] [--poses "0,0,0;0.5,0,0;0,0,30"]

For every evaluation frame the ego's own LiDAR scan is handed to the ego's
encoder as if a virtual sensor at pose ``M = (dx m, dy m, yaw deg)`` in the ego
frame had recorded it: points ``M^-1 p``, ``T_ego_from_agent = M``. Nothing about
the scene changes; only the grid the feature is computed on, and the warp that
brings it back (``opencood_ext.models.warp``). The identity pose is the plain
ego-only detection. Two readings per pose:

* ``alone``: the warped feature is the only input of the head (what a detector
  gets from a collaborator's feature, with perfect sensing and poses);
* ``fused``: the warped copy is fused with the ego's own un-warped feature by the
  model's ``fusion_op`` (intermediate fusion of two agents that see the same).

A convolutional feature encodes each box relative to the cell and the axes it was
computed on; the warp moves and rotates the map but not what its channels say,
so a 1x1 head reads sub-cell offsets and yaw in the sender's axes. A pose of
whole cells and no yaw is a pure shift and should cost nothing; a half-cell shift
or a yaw shows the loss. Only GT and detections within ``radius`` of the ego
count (default: the largest disc every virtual map still covers), so coverage
lost at the map corners is not counted as precision lost.

Reports AP@0.3/0.5/0.7 and box precision of found GT (mean IoU, share >= 0.7,
median centre and yaw error) per pose and reading.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import List, Tuple

import numpy as np
import torch
from tqdm import tqdm

DEFAULT_POSES = "0,0,0;1,0,0;0.5,0,0;0.5,0.5,0;0.25,0,0;0,0,10;0,0,30;0,0,45;0,0,90;0,0,180"


def parse_poses(text: str) -> List[Tuple[float, float, float]]:
    """"dx,dy,yaw;..." (m, m, deg) -> list of triples."""
    poses = []
    for part in text.split(";"):
        vals = [float(v) for v in part.split(",")]
        if len(vals) != 3:
            raise ValueError(f"--poses: each pose is dx,dy,yaw_deg; got {part!r}")
        poses.append(tuple(vals))
    return poses


def pose_matrix(dx: float, dy: float, yaw_deg: float) -> np.ndarray:
    """(4, 4) virtual sensor pose in the ego frame: rotate by yaw about z, then translate."""
    from opencood_ext.geometry import pose_to_matrix
    return pose_to_matrix([dx, dy, 0.0, 0.0, yaw_deg, 0.0])


def virtual_input(dataset, frame, M: np.ndarray, T_world_from_ego: np.ndarray):
    """The ego's AgentInput recorded from pose M (in the ego frame): points M^-1 p; its header pose
    is the world pose of that virtual sensor, so a receiver computes T_ego_from_agent = M."""
    from opencood_ext.data.dataset import AgentInput
    from opencood_ext.geometry import invert_transform, transform_points
    ego = dataset.select_agents(frame, np.random.default_rng(0), with_collaborators=False)[0]
    spec = dataset.cfg.agent_types[ego.agent_type]
    if spec.sensor != "lidar":
        raise ValueError(f"the warp benchmark needs a LiDAR ego; ego type {ego.agent_type} is a {spec.sensor}")
    pts = transform_points(invert_transform(M), dataset.lidar_points(ego, spec.lidar_beams))
    return AgentInput(ego.agent_id, ego.agent_type, T_world_from_ego @ M,
                      voxels=dataset.voxelizers[ego.agent_type](pts.astype(np.float32)), num_points=len(pts))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_dir", type=Path, required=True, help="a trained run folder")
    p.add_argument("--split", default=None, help="default: eval.split of the run's config")
    p.add_argument("--max_frames", type=int, default=None)
    p.add_argument("--poses", default=DEFAULT_POSES, help="dx,dy,yaw_deg;... virtual sensor poses (m, m, deg)")
    p.add_argument("--radius", type=float, default=None, help="count GT / detections within this many m of the ego")
    p.add_argument("--readings", default="alone,fused")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from opencood_ext.data.batch import collate_samples
    from opencood_ext.eval.ap import APAccumulator
    from opencood_ext.eval.localisation import LocalisationStats
    from opencood_ext.experiment import build_dataset
    from opencood_ext.runs import load_run, set_fusion

    cfg, model = load_run(args.model_dir)
    poses = parse_poses(args.poses)
    readings = [r.strip() for r in args.readings.split(",") if r.strip()]
    bad = set(readings) - {"alone", "fused"}
    if bad:
        raise ValueError(f"--readings: unknown {sorted(bad)}; choose from alone, fused")
    if "fused" in readings and model.link is None:
        raise ValueError(f"{args.model_dir} has no intermediate-fusion link; use --readings alone")
    dataset = build_dataset(cfg, args.split or cfg.eval.split, train=False, fusion="none")
    r = cfg.data.lidar_range
    shift = max(math.hypot(dx, dy) for dx, dy, _ in poses)
    radius = args.radius if args.radius is not None else 0.95 * min(r[3], -r[0], r[4], -r[1]) - shift
    n = len(dataset) if args.max_frames is None else min(len(dataset), args.max_frames)
    acc = {(k, rd): APAccumulator() for k in range(len(poses)) for rd in readings}
    loc = {key: LocalisationStats() for key in acc}
    model.eval()
    for i in tqdm(range(n), desc="warp benchmark"):
        frame = dataset.read_frame(i)
        sample = dataset[i]  # the ego alone, un-warped, with the evaluation GT
        own = sample.agents[0]
        gt = sample.gt_boxes.astype(np.float64)
        gt = gt[np.hypot(gt[:, 0], gt[:, 1]) <= radius]
        for k, (dx, dy, yaw) in enumerate(poses):
            copy = virtual_input(dataset, frame, pose_matrix(dx, dy, yaw), np.linalg.inv(sample.T_ego_from_world))
            for rd in readings:
                if rd == "alone":
                    set_fusion(model, "none")
                    sample.agents = [copy]
                else:
                    set_fusion(model, "intermediate")
                    sample.agents = [own, copy]
                dets = model.predict(collate_samples([sample])).detections
                boxes, scores = dets[0].boxes.numpy(), dets[0].scores.numpy()
                inside = np.hypot(boxes[:, 0], boxes[:, 1]) <= radius
                acc[(k, rd)].add(boxes[inside], scores[inside], gt)
                loc[(k, rd)].add(None, boxes[inside], gt)
    res = {"frames": n, "radius_m": round(radius, 2), "fusion_op": type(model.fuse).__name__}
    for (k, rd), a in acc.items():
        dx, dy, yaw = poses[k]
        tag = f"{rd}_dx{dx:g}_dy{dy:g}_yaw{yaw:g}"
        ap = a.results()["global"].ap
        s = loc[(k, rd)].summary()["all"]
        res[tag] = (f"AP {ap[0.3]:.3f}/{ap[0.5]:.3f}/{ap[0.7]:.3f}  found {s['found']}/{s['gt']} "
                    f"meanIoU {s['mean_iou'] or 0:.3f} >=0.7 {s['share_iou_0.7'] or 0:.2f} "
                    f"centre {s['median_centre_m'] or 0:.2f} m yaw {s['median_yaw_deg'] or 0:.1f} deg")
    return res


if __name__ == "__main__":
    from opencood_ext.cli.errors import USER_ERRORS, report
    try:
        out = main(sys.argv[1:])
    except (*USER_ERRORS, ValueError) as exc:
        sys.exit(report(exc))
    for key, val in out.items():
        print(f"{key}  {val}")
