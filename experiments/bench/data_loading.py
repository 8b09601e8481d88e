"""Data loading: PCD decoding (see ``experiments.bench.pcd_parse``) and dataset samples per second.

    python tools/bench.py loading [--frames 4] [--agents 3] [--epochs 3] [--repeat 7]

Builds an OPV2V-format split in a temporary folder from the real V2XSet
fixture (its 2.1 MB ascii scan and yaml copied to ``--agents`` agents x
``--frames`` timestamps, as OPV2V stores every agent's scan) and times
``CooperativeDataset[i]`` over all frames (read every agent's yaml and pcd,
select agents, ground truth, voxelise) for three loaders that differ only in
how they read files:

* ``ours``: the project's reader (``read_pcd``);
* ``ours_cache_warm``: the same with ``data.cache_dir`` after one epoch filled it;
* ``open3d``: points read with Open3D's legacy reader as OpenCOOD's
  ``pcd_to_np`` does (red colour channel as intensity).

Epochs run round-robin (one epoch of each loader, then the next) so they share
the machine's load; samples/s is the median over ``--epochs``. The PCD
decoding figures of ``experiments.bench.pcd_parse`` are printed in the same run.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from experiments.bench.pcd_parse import FIXTURE, fixture_or_synthetic, measure, open3d_pcd_to_np
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.formats import OPV2VReader
from opencood_ext.data.formats.opv2v_io import dump_yaml, load_yaml
from opencood_ext.data.formats.pcd import read_pcd

SCENARIO = "2021_08_21_17_30_41"
VOXEL = (0.4, 0.4, 4.0)


class Open3DReader(OPV2VReader):
    """The project's OPV2V reader with OpenCOOD's point reading (Open3D)."""

    def _read_points(self, path: Path, read=read_pcd, **kw) -> np.ndarray:
        return open3d_pcd_to_np(path)


def build_split(root: Path, frames: int, agents: int, pcd: Path) -> Path:
    """``root/validate/<scenario>/<agent>/<ts>.{pcd,yaml}`` from one real scan and yaml.

    Agents are the fixture's vehicle moved 3 m apart (all within comm range)."""
    src_yaml = load_yaml(pcd.with_suffix(".yaml")) if pcd.with_suffix(".yaml").exists() else \
        {"lidar_pose": [0.0] * 6, "vehicles": {}}
    for a in range(agents):
        d = root / "validate" / SCENARIO / str(100 + a)
        d.mkdir(parents=True, exist_ok=True)
        y = dict(src_yaml)
        pose = list(y["lidar_pose"])
        pose[0] += 3.0 * a
        y["lidar_pose"] = pose
        for f in range(frames):
            ts = f"{69 + 2 * f:06d}"
            shutil.copyfile(pcd, d / f"{ts}.pcd")
            dump_yaml(d / f"{ts}.yaml", y)
    return root


def _dataset(reader) -> CooperativeDataset:
    cfg = DataConfig(root=str(reader.root), modality="all:m1", agent_types={"m1": AgentTypeData()},
                     max_agents=8)
    return CooperativeDataset(reader, cfg, {"m1": VOXEL}, train=False)


def _epoch_seconds(ds: CooperativeDataset) -> float:
    t0 = time.perf_counter()
    for i in range(len(ds)):
        ds[i]
    return time.perf_counter() - t0


def samples_per_second(root: Path, cache: Path, epochs: int) -> dict:
    kw = dict(modality="in_order", load_cameras=False, load_depth=False, load_beams=False)
    loaders = {"ours": _dataset(OPV2VReader(root, "validate", **kw)),
               "ours_cache_warm": _dataset(OPV2VReader(root, "validate", cache_dir=cache, **kw)),
               "open3d": _dataset(Open3DReader(root, "validate", **kw))}
    first = {k: _epoch_seconds(ds) for k, ds in loaders.items()}  # warm-up; fills the cache
    times = {k: [] for k in loaders}
    for _ in range(epochs):
        for k, ds in loaders.items():
            times[k].append(_epoch_seconds(ds))
    n = len(loaders["ours"])
    sps = {k: n / statistics.median(v) for k, v in times.items()}
    a, b = loaders["ours"][0], loaders["ours_cache_warm"][0]
    same = all(torch.equal(x.voxels.voxels, y.voxels.voxels) and torch.equal(x.voxels.coords, y.voxels.coords)
               for x, y in zip(a.agents, b.agents))
    return {
        "dataset_frames": n, "dataset_agents_per_frame": len(a.agents),
        "dataset_same_samples_cached": bool(same),
        "samples_per_s_ours": sps["ours"], "samples_per_s_ours_cache_warm": sps["ours_cache_warm"],
        "samples_per_s_open3d": sps["open3d"],
        "samples_per_s_first_epoch_cache_cold": n / first["ours_cache_warm"],
        "dataset_speedup_vs_open3d": sps["ours"] / sps["open3d"],
        "dataset_cache_warm_speedup_vs_open3d": sps["ours_cache_warm"] / sps["open3d"],
        "dataset_cache_warm_speedup_vs_ours": sps["ours_cache_warm"] / sps["ours"],
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="bench.py loading")
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=7, help="PCD decoding repetitions")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pcd = fixture_or_synthetic(tmp)
        out = measure(pcd, args.repeat, tmp)
        root = build_split(tmp / "opv2v", args.frames, args.agents, pcd)
        out.update(samples_per_second(root, tmp / "cache", args.epochs))
        out["fixture_used"] = pcd == FIXTURE
    return out
