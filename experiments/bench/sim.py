"""Built-in simulator throughput: ``python tools/bench.py sim [--frames N] [--agents K]``.

Figures (default town and traffic, K agents with the 64-beam OPV2V LiDAR):

* LiDAR-only frames/s and agent-scans/s (traffic, mesh update and sweeps),
  with the split per part;
* rays/s of a sweep against the bare Embree cast rate of the same rays on
  one scene holding everything (what ray casting alone would allow);
* dynamic-scene rebuild per tick vs rebuilding the whole scene;
* camera cost at the default 800 x 600: one render with and without
  shadows, and the per-frame total for K agents x 4 cameras.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
import open3d as o3d

from opencood_ext.sim.builtin import AgentParams, BuiltinWorld, SimConfig
from opencood_ext.sim.camera import CameraModel
from opencood_ext.geometry import pose_to_matrix


def _timed(fn, repeat: int) -> float:
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="bench sim")
    ap.add_argument("--frames", type=int, default=10)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--camera_repeats", type=int, default=2)
    args = ap.parse_args(argv)
    agents = AgentParams(count=(args.agents, args.agents), rsu_probability=0.0)
    out = {}

    t = time.perf_counter()
    world = BuiltinWorld(SimConfig(cameras=False, agents=agents))
    world.reset(args.seed)
    out["reset_s (town, traffic, scene)"] = time.perf_counter() - t
    out["vehicles moving / parked"] = (f"{len(world.traffic.moving())} / "
                                       f"{len(world.traffic.vehicles) - len(world.traffic.moving())}")
    out["static triangles"] = int(len(world.scene._static_mesh[1]))
    world.tick()
    t = time.perf_counter()
    for _ in range(args.frames):
        world.tick()
    frame_s = (time.perf_counter() - t) / args.frames
    out["lidar_only_frames_per_s"] = 1.0 / frame_s
    out["agent_scans_per_s (incl. traffic)"] = args.agents / frame_s

    out["traffic_ms_per_frame (2 ticks)"] = 1e3 * _timed(lambda: world.traffic.step(0.05), 10) * 2
    ag = world._agents[0]
    T = pose_to_matrix(world._agents[0].info.lidar.mount)
    T = world._base_pose(ag) @ T
    rng = np.random.default_rng(0)
    scan_s = _timed(lambda: world.lidar_model.scan(world.scene, T, rng, exclude_ids=ag.exclude), 5)
    rays = world.lidar_model.rays
    out["rays_per_sweep"] = rays
    out["scan_ms (cast + post-processing)"] = 1e3 * scan_s
    out["sweep_rays_per_s"] = rays / scan_s
    # the bare Embree rate: the same rays, one scene with everything, cast only
    dirs = (world.lidar_model.directions @ T[:3, :3].T).astype(np.float32)
    rays_t = o3d.core.Tensor.from_numpy(np.c_[np.broadcast_to(T[:3, 3], dirs.shape), dirs].astype(np.float32))
    single = BuiltinWorld(SimConfig(cameras=False, agents=agents, single_scene=True))
    single.reset(args.seed)
    cast_s = _timed(lambda: single.scene._dynamic.cast_rays(rays_t), 5)
    out["bare_embree_rays_per_s (one scene)"] = rays / cast_s
    out["sweep_vs_bare_embree"] = cast_s / scan_s
    origin = T[:3, 3].astype(np.float32)
    # per-tick rebuild cost: new scene + Embree's lazy BVH build on the first cast
    for name, w in (("dynamic_only", world), ("whole_scene", single)):
        cast = _timed(lambda: w.scene.cast(origin, dirs), 5)
        rebuilt = _timed(lambda: (w._update_dynamic(), w.scene.cast(origin, dirs)), 5)
        out[f"rebuild_ms_per_tick ({name})"] = 1e3 * (rebuilt - cast)
        out[f"sweep_cast_ms ({name})"] = 1e3 * cast
    single.close()

    spec = replace(world.cfg.sensors.cameras.specs()[0])
    model = CameraModel(spec)
    T_wc = world._base_pose(ag) @ pose_to_matrix(spec.mount)
    plain = _timed(lambda: model.render(world.scene, T_wc, world.sun, False, ag.exclude), args.camera_repeats)
    shadow = _timed(lambda: model.render(world.scene, T_wc, world.sun, True, ag.exclude), args.camera_repeats)
    out[f"camera_render_ms {spec.width}x{spec.height}"] = 1e3 * plain
    out[f"camera_render_ms {spec.width}x{spec.height} + shadows"] = 1e3 * shadow
    n_cam = len(world.cfg.sensors.cameras.mounts)
    out[f"camera_s_per_frame ({args.agents} agents x {n_cam} cams, shadows)"] = shadow * n_cam * args.agents
    world.close()
    return out
