"""Small synthetic Frames for pipeline and model tests (no files, no simulator).

Each frame has ``num_agents`` vehicles on a line along x and ``num_objects``
boxes whose surfaces carry LiDAR points, so a detector has something to see.
Camera agents get four small random images with OPV2V-like intrinsics.
"""
from __future__ import annotations

import numpy as np

from opencood_ext.data.frame import AgentObs, CameraObs, Frame, ObjectLabel
from opencood_ext.geometry import invert_transform, pose_to_matrix, transform_points


def _box_points(rng, centre, extent, yaw, n=80):
    local = rng.uniform(-1, 1, size=(n, 3)) * extent
    local[:, 0] = np.sign(local[:, 0]) * extent[0]  # on the front/back faces
    c, s = np.cos(yaw), np.sin(yaw)
    R = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])
    return local @ R.T + centre


def make_frame(seed=0, num_agents=3, num_objects=8, types=("m1", "m1", "m1"), image_hw=(48, 64),
               scenario="synthetic", timestamp="000000"):
    rng = np.random.default_rng(seed)
    objects = {}
    world_pts = [np.c_[rng.uniform(-40, 40, 3000), rng.uniform(-40, 40, 3000), np.zeros(3000)]]
    for k in range(num_objects):
        loc = np.array([rng.uniform(-25, 25), rng.uniform(-20, 20), 0.0])
        yaw = rng.uniform(-180, 180)
        extent = np.array([2.0, 0.9, 0.75])
        obj = ObjectLabel(object_id=100 + k, location=loc, center=[0, 0, 0.75], angle=[0, yaw, 0], extent=extent)
        objects[obj.object_id] = obj
        world_pts.append(_box_points(rng, loc + [0, 0, 0.75], extent, np.radians(yaw)))
    world = np.concatenate(world_pts)
    agents = []
    for i in range(num_agents):
        pose = [-10.0 + 10.0 * i, rng.uniform(-2, 2), 1.9, 0.0, rng.uniform(-20, 20), 0.0]
        T = pose_to_matrix(pose)
        local = transform_points(invert_transform(T), world)
        lidar = np.c_[local, rng.uniform(0, 1, len(local))].astype(np.float32)
        cams = []
        t = types[i % len(types)]
        if t in ("m2", "m4"):
            K = np.array([[335.64, 0, 400], [0, 335.64, 300], [0, 0, 1.0]])
            for c, yaw in enumerate([0, 100, -100, 180]):
                Tc = pose_to_matrix([0, 0, 0, 0, yaw, 0])
                img = rng.integers(0, 255, size=(600 // 4, 800 // 4, 3), dtype=np.uint8)
                Kc = K.copy()
                Kc[:2] /= 4
                depth = rng.uniform(1, 40, size=img.shape[:2]).astype(np.float32)
                cams.append(CameraObs(f"camera{c}", img, Kc, Tc, depth=depth))
        beams = {32: lidar[::2].copy(), 16: lidar[::4].copy()}
        agents.append(AgentObs(agent_id=10 * (i + 1), agent_type=t, T_world_from_lidar=T, lidar=lidar,
                               cameras=cams, lidar_beams=beams, visible_ids=list(objects), lidar_pose=np.array(pose)))
    return Frame(scenario=scenario, timestamp=timestamp, agents=agents, objects=objects)


class SyntheticReader:
    """A list-like reader of synthetic frames."""

    def __init__(self, n=4, **kw):
        self.frames = [make_frame(seed=i, timestamp=f"{i:06d}", **kw) for i in range(n)]

    def __len__(self):
        return len(self.frames)

    def __getitem__(self, i):
        return self.frames[i]
