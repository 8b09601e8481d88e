"""Voxelisation, pure PyTorch vs spconv: ``python tools/bench.py voxelize [--repeat 15] [--threads 1]``.

Times :class:`~opencood_ext.data.voxelize.Voxelizer` with ``backend="torch"`` and
``backend="spconv"`` (spconv 2.x's CPU ``PointToVoxel``), interleaved, median ms per cloud,
and checks that both return identical tensors. Settings (range 281.6 x 80 m,
``[-140.8, -40, -3, 140.8, 40, 1]``): PointPillars 0.4 m pillars (32 points each) and
SECOND 0.1 m cubes (5 points each), ``--max_voxels`` (default 32000; the shipped configs use
25600-131072: spconv clears its whole ``max_voxels x P`` buffer on every call, so a larger
cap costs it more).

Clouds: the real V2XSet scan of the shared fixtures (39.7k points, scan order kept) when the
checkout has it, else a synthetic 64-beam scan of flat ground and walls; ``30k`` is an
order-preserving subset, ``120k`` three copies turned and shifted as an early-fusion
receiver merges three agents. Without spconv only the torch figures are printed.
"""
from __future__ import annotations

import argparse
import math
from typing import Dict

import numpy as np
import torch

from experiments.bench.pcd_parse import FIXTURE, round_robin
from opencood_ext.data.voxelize import Voxelizer
from opencood_ext.deps import MissingDependency

RANGE = (-140.8, -40.0, -3.0, 140.8, 40.0, 1.0)
SETTINGS = {"pointpillars": ((0.4, 0.4, 4.0), 32), "second": ((0.1, 0.1, 0.1), 5)}


def synthetic_scan(seed: int = 0) -> np.ndarray:
    """(N, 4) x, y, z, intensity of a 64-beam sweep (2048 azimuths, beam-major like a real
    scan): ground at z = -1.7 m within 120 m, otherwise a wall 5-80 m away; ~60% of rays hit."""
    rng = np.random.default_rng(seed)
    az = np.repeat(np.linspace(-np.pi, np.pi, 2048, endpoint=False), 64)
    el = np.tile(np.radians(np.linspace(-25.0, 2.0, 64)), 2048)
    ground = np.where(el < 0, 1.7 / np.tan(-np.minimum(el, -1e-3)), np.inf)
    wall = rng.uniform(5.0, 80.0, az.size)
    r = np.minimum(ground, wall)
    hit = (r < 120.0) & (rng.random(az.size) < 0.6)
    r, az, el = r[hit], az[hit], el[hit]
    xyz = np.column_stack([r * np.cos(el) * np.cos(az), r * np.cos(el) * np.sin(az), r * np.sin(el)])
    return np.column_stack([xyz, rng.random(len(r))]).astype(np.float32)


def clouds() -> Dict[str, torch.Tensor]:
    """Named (N, 4) float32 clouds: the fixture scan (or :func:`synthetic_scan`), 30k, 120k."""
    if FIXTURE.exists():
        from opencood_ext.data.formats.pcd import read_pcd
        base, name = torch.from_numpy(read_pcd(FIXTURE)), "fixture"
    else:
        base, name = torch.from_numpy(synthetic_scan()), "synthetic"
    keep = torch.sort(torch.randperm(len(base), generator=torch.Generator().manual_seed(0))[:30000]).values
    turned = []
    for angle, shift in ((0.0, 0.0), (2.1, 30.0), (4.2, -25.0)):
        c, s = math.cos(angle), math.sin(angle)
        t = base.clone()
        t[:, 0], t[:, 1] = c * base[:, 0] - s * base[:, 1] + shift, s * base[:, 0] + c * base[:, 1]
        turned.append(t)
    return {"30k": base[keep], f"{len(base) // 1000}k_{name}": base, "120k": torch.cat(turned)[:120000]}


def _equal(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("voxels", "coords", "num_points"))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="bench voxelize", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=15, help="timed calls per backend and cloud")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (data-loader workers use 1)")
    p.add_argument("--max_voxels", type=int, default=32000)
    args = p.parse_args(argv)
    if args.repeat < 1 or args.threads < 1 or args.max_voxels < 1:
        raise ValueError(f"bench voxelize: --repeat, --threads and --max_voxels must be >= 1, got "
                         f"{args.repeat}, {args.threads}, {args.max_voxels}")
    torch.set_num_threads(args.threads)
    out: dict = {"max_voxels": args.max_voxels, "threads": args.threads}
    for setting, (size, per_voxel) in SETTINGS.items():
        vox = {"torch": Voxelizer(size, RANGE, per_voxel, args.max_voxels, backend="torch")}
        try:
            vox["spconv"] = Voxelizer(size, RANGE, per_voxel, args.max_voxels, backend="spconv")
        except MissingDependency:
            out["spconv"] = "not installed"
        for name, pts in clouds().items():
            key = f"{setting}_{name}"
            res = {b: v(pts) for b, v in vox.items()}
            out[f"{key}_voxels"] = int(res["torch"].coords.shape[0])
            ms = round_robin({b: (lambda v=v: v(pts)) for b, v in vox.items()}, args.repeat)
            for b, t in ms.items():
                out[f"{key}_{b}_ms"] = round(1e3 * t, 3)
            if "spconv" in res:
                out[f"{key}_equal"] = _equal(res["torch"], res["spconv"])
                out[f"{key}_torch_over_spconv"] = round(ms["torch"] / ms["spconv"], 3)
    return out
