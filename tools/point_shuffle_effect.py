"""What the reference's per-scan point shuffle (``shuffle_points``) changes, on the shared V2XSet
fixture frame (docs/protocol.md, "What stays different under protocol: reference"):

1. the scan at the reference's caps (PointPillars 0.4 x 0.4 x 4 m pillars, 32 points per voxel,
   70,000 voxels; OPV2V's range; own-vehicle points removed as under ``protocol: reference``): how
   many voxels it fills, how many hold more than 32 points (the only ones whose kept points depend
   on the order) and how many points those drop;
2. the maps of the hand-built reference-protocol GenComm stage-1 model of
   tests/opencood_ext/models/test_reference_e2e.py (random weights imported from the reference's layout, diffusion
   noise zero), its frame voxelised with ``data.shuffle_points`` for seeds 1..N against the
   file's order and against the previous seed's shuffle (what the reference's unseeded shuffle
   does from run to run): max |change| / max |map| of the classification and regression maps.

    OMP_NUM_THREADS=1 .venv/bin/python tools/point_shuffle_effect.py [--seeds 5]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

OPV2V_RANGE = (-102.4, -51.2, -3.0, 102.4, 51.2, 1.0)


def scan_stats(points: np.ndarray, cap_points: int = 32, cap_voxels: int = 70000):
    from opencood_ext.data.reference import remove_own_points

    pts = remove_own_points(points)
    r = np.asarray(OPV2V_RANGE)
    size = np.array([0.4, 0.4, 4.0])
    idx = np.floor((pts[:, :3].astype(np.float32) - r[:3]) / size).astype(np.int64)
    n = np.round((r[3:] - r[:3]) / size).astype(np.int64)
    inside = ((idx >= 0) & (idx < n)).all(1)
    _, counts = np.unique(idx[inside] @ np.array([n[1] * n[2], n[2], 1]), return_counts=True)
    full = counts > cap_points
    return {"points": int(inside.sum()), "voxels": int(len(counts)), "voxel_cap": cap_voxels,
            "over_32": int(full.sum()), "points_dropped": int((counts[full] - cap_points).sum())}


def map_change(seeds: int):
    import gencomm  # noqa: F401  (registers the GenComm link)
    from gencomm.generator import SpatialAwareFeatureGenerator
    from opencood_ext.data.augment import AugmentConfig
    from opencood_ext.data.batch import collate_samples
    from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
    import test_reference_e2e as e2e

    SpatialAwareFeatureGenerator._noise = staticmethod(lambda like, g: torch.zeros_like(like))
    frame = e2e._frame()

    def batch(shuffle: bool, seed: int):
        cfg = DataConfig(lidar_range=tuple(e2e.RANGE), augment=AugmentConfig(enabled=False), modality="all:m1",
                         agent_types={"m1": AgentTypeData(max_points_per_voxel=32, max_voxels=70000)},
                         max_agents=3, shuffle_points=shuffle)
        ds = CooperativeDataset(e2e._Reader([frame]), cfg, {"m1": e2e.VOXEL}, train=False, seed=seed,
                                protocol="reference")
        return collate_samples([ds[0]])

    model = e2e._model(["m1"], e2e.GENCOMM_LINK)
    e2e._load(model, e2e._checkpoint(e2e._shapes(["m1"], True), seed=0))
    with torch.no_grad():
        base = model(batch(False, 0)).head
        rows, prev = [], None
        for s in range(1, seeds + 1):
            b = batch(True, s)
            out = model(b).head
            full = int((b.inputs["m1"].num_points == 32).sum())
            change = lambda ref: (float((out.cls - ref.cls).abs().max() / ref.cls.abs().max()),  # noqa: E731
                                  float((out.reg - ref.reg).abs().max() / ref.reg.abs().max()))
            rows.append((s, full, *change(base), *(change(prev) if prev is not None else (None, None))))
            prev = out
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    import test_reference_e2e as e2e

    frame = e2e._frame()
    st = scan_stats(frame.agents[0].lidar)
    print(f"fixture scan, OPV2V range, reference caps: {st['points']} points in {st['voxels']} voxels "
          f"(cap {st['voxel_cap']}); {st['over_32']} voxels hold more than 32 points, "
          f"dropping {st['points_dropped']} points")
    print("against the file's order, and against the previous seed's shuffle (run to run):")
    print("seed  full voxels (3 agents, test crop)  max|d cls|/max|cls|  max|d reg|/max|reg|  "
          "vs previous: cls  reg")
    fmt = lambda v: f"{'-':>9}" if v is None else f"{v:>9.3e}"  # noqa: E731
    for s, full, dcls, dreg, pcls, preg in map_change(args.seeds):
        print(f"{s:>4}  {full:>33}  {dcls:>19.3e}  {dreg:>19.3e}  {fmt(pcls)} {fmt(preg)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
