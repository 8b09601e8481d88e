"""The built-in world end to end: protocol, poses, agents, labels agreeing
with the LiDAR and the cameras, and BEV / camera artifacts to look at."""
from dataclasses import replace

import numpy as np
import pytest

from opencood_ext.sim.builtin import AgentParams, BuiltinWorld
from opencood_ext.sim.camera import CameraModel
from opencood_ext.sim.world import CameraSpec, World, project_points
from opencood_ext.geometry import (boxes_to_corners, invert_transform, objects_to_boxes, pose_to_matrix,
                                   points_in_boxes)

from sim_common import ARTIFACTS, small_config


@pytest.fixture(scope="module")
def run():
    world = BuiltinWorld(small_config(cameras=True, rsu_probability=1.0))
    world.reset(3)
    frames, scans, ids = [], [], []
    for _ in range(2):
        frames.append(world.tick())
        scans.append(dict(world.last_scans))
        ids.append(dict(world.last_camera_ids))
    yield world, frames, scans, ids
    world.close()


def test_world_protocol_agents_and_poses(run):
    world, frames, _, _ = run
    assert isinstance(world, World)
    f0, f1 = frames
    assert int(f1.timestamp) - int(f0.timestamp) == 2 and len(f0.timestamp) == 6   # 10 Hz of 0.05 s ticks
    cavs = [a for a in f0.agents if not a.is_rsu]
    rsus = [a for a in f0.agents if a.is_rsu]
    assert 2 <= len(cavs) <= 5 and len(rsus) == 1 and f0.agents[-1].is_rsu
    assert [a.agent_id for a in cavs] == sorted(a.agent_id for a in cavs)
    assert [a.agent_type for a in f0.agents] == [["m1", "m2", "m3", "m4"][k % 4] for k in range(len(f0.agents))]
    for a in f0.agents:
        assert np.allclose(a.T_world_from_lidar, pose_to_matrix(a.lidar_pose), atol=1e-12)
        assert a.lidar.dtype == np.float32 and a.lidar.shape[1] == 4 and len(a.lidar) > 5000
        assert set(a.lidar_beams) == {32, 16}
        assert len(a.cameras) == 4 and a.cameras[0].image.shape == (120, 160, 3)
        assert a.cameras[0].depth.shape == (120, 160)
    for a in cavs:
        assert a.lidar_pose[2] == pytest.approx(1.9)
        for b in cavs:
            assert np.linalg.norm(a.T_world_from_lidar[:3, 3] - b.T_world_from_lidar[:3, 3]) < 70.0
    rsu = rsus[0]
    assert 4.0 <= rsu.lidar_pose[2] - 0.15 <= 6.0 and rsu.meta["ego_speed"] == 0.0
    protocol = world.protocol()
    assert protocol["sensing"]["lidar"]["channels"] == 64 and protocol["world"]["fixed_delta_seconds"] == 0.05
    assert protocol["scenario"]["rsu_list"] == [-1]


def test_labels_follow_opv2v_semantics(run):
    _, frames, _, _ = run
    f = frames[0]
    union = set()
    for a in f.agents:
        union |= set(a.visible_ids)
        assert a.agent_id not in a.visible_ids
    assert union == set(f.objects) and len(union) >= 3
    for oid, o in f.objects.items():
        assert o.object_id == oid and o.obj_type in ("Car", "Van", "Truck", "Bus")
        assert (o.extent > 0.5).all() and o.extent[0] >= o.extent[1]           # half sizes, length first
        assert o.center[2] == pytest.approx(o.extent[2]) and o.location[2] == 0.0  # box sits on the road
        assert o.angle[0] == 0.0 and o.angle[2] == 0.0 and -180.0 <= o.angle[1] <= 180.0


def test_labels_agree_with_lidar_hits(run):
    _, frames, scans, _ = run
    checked = 0
    for f, sc in zip(frames, scans):
        for a in f.agents:
            scan = sc[a.agent_id]
            assert np.array_equal(scan.points, a.lidar)
            objs = [f.objects[i] for i in a.visible_ids]
            boxes = objects_to_boxes(objs, invert_transform(a.T_world_from_lidar))
            for o, box in zip(objs, boxes):
                mine = scan.object_id == o.object_id
                assert mine.any()                           # listed => at least one return
                if mine.sum() >= 20:
                    inside = points_in_boxes(scan.points[mine], box[None])[:, 0].mean()
                    assert inside >= 0.9, (a.agent_id, o.object_id, inside)
                    checked += 1
            # nothing hit is left unlabelled
            hit = {int(i) for i in np.unique(scan.object_id) if i >= 0}
            assert hit <= set(a.visible_ids) | {-1001}
    assert checked >= 5


def test_beam_variants_are_every_other_ring(run):
    _, frames, scans, _ = run
    a = frames[0].agents[0]
    scan = scans[0][a.agent_id]
    assert len(np.unique(scan.ring)) > 56
    for beams, keep in ((32, 2), (16, 4)):
        sub = scan.keep_rings(keep)
        assert np.array_equal(sub.points, a.lidar_beams[beams])
        assert (sub.ring % keep == 0).all() and len(np.unique(sub.ring)) <= beams


def test_box_centres_project_onto_their_pixels(run):
    world, frames, _, ids = run
    f = frames[1]
    checked = 0
    for a in f.agents:
        for cam in a.cameras:
            T_wc = a.T_world_from_lidar @ cam.T_lidar_from_camera
            assert np.allclose(T_wc, cam.T_world_from_camera, atol=1e-9)
            buf = ids[1][(a.agent_id, cam.name)]
            for oid, o in f.objects.items():
                centre = o.location + o.center
                p = (invert_transform(T_wc) @ np.r_[centre, 1.0])[:3]
                uv, front = project_points(cam.K, p[None])
                col, row = np.floor(uv[0]).astype(int)
                if not front[0] or not (0 <= col < buf.shape[1] and 0 <= row < buf.shape[0]):
                    continue
                if (buf == oid).sum() < 50:
                    continue
                ray = (centre - T_wc[:3, 3]) / np.linalg.norm(centre - T_wc[:3, 3])
                first = world.scene.object_ids(world.scene.cast(T_wc[:3, 3].astype(np.float32),
                                                                ray[None].astype(np.float32)))[0]
                if first != oid:
                    continue          # the centre is hidden behind something else
                assert buf[row, col] == oid, (a.agent_id, cam.name, oid)
                checked += 1
    assert checked >= 3


def test_write_bev_and_camera_artifacts(run):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    world, frames, _, _ = run
    f = frames[-1]
    ego = f.agents[0]
    T_ego = invert_transform(ego.T_world_from_lidar)
    fig, ax = plt.subplots(figsize=(9, 9))
    for a in f.agents:
        pts = a.lidar[:, :3] @ (T_ego @ a.T_world_from_lidar)[:3, :3].T + (T_ego @ a.T_world_from_lidar)[:3, 3]
        ax.scatter(pts[:, 0], -pts[:, 1], s=0.2, label=f"agent {a.agent_id} ({a.agent_type})")
    for c in boxes_to_corners(objects_to_boxes(f.objects.values(), T_ego)):
        ax.plot(c[[0, 1, 2, 3, 0], 0], -c[[0, 1, 2, 3, 0], 1], "r-", lw=1)
    ax.set_xlim(-80, 80)
    ax.set_ylim(-80, 80)
    ax.set_aspect("equal")
    ax.legend(loc="upper right", markerscale=20)
    ax.set_title(f"{f.scenario} {f.timestamp}: ego LiDAR frame (y flipped), {len(f.objects)} boxes")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    bev = ARTIFACTS / "sim_bev.png"
    fig.savefig(bev, dpi=90)
    plt.close(fig)
    spec = CameraSpec("camera0", 480, 360, 100.0, (2.5, 0.0, 1.0, 0.0, 0.0, 0.0))
    agent = world._agents[0]
    T_wc = world._base_pose(agent) @ pose_to_matrix(spec.mount)
    r = CameraModel(spec).render(world.scene, T_wc, world.sun, True, exclude_ids=agent.exclude)
    Image.fromarray(r.image).save(ARTIFACTS / "sim_camera0.png")
    Image.fromarray(f.agents[0].cameras[0].image).save(ARTIFACTS / "sim_camera0_small.png")
    assert bev.stat().st_size > 10000
    # a street scene, not noise: sky above the street ahead (the sides may be facades or tree crowns),
    # darker road at the bottom, neighbouring pixels mostly alike
    img = r.image.astype(float)
    w = img.shape[1]
    sky = img[:20, w // 3: 2 * w // 3].mean(axis=(0, 1))
    assert sky[2] > 150 and sky[2] > sky[0] and img[-20:].mean() < img[:20].mean()
    assert np.abs(np.diff(img, axis=1)).mean() < 12.0


def _bearing_and_distance(v, centre):
    return np.arctan2(v.y - centre[1], v.x - centre[0]), np.hypot(v.x - centre[0], v.y - centre[1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_junction_layout_puts_collaborators_on_other_arms(seed):
    """The default layout: the ego (lowest id, first agent) approaches a junction and every
    collaborator sits on another arm of it, so buildings can hide from the ego what they see."""
    cfg = replace(small_config(), warmup_ticks=0)
    world = BuiltinWorld(cfg)
    world.reset(seed)
    p = cfg.agents
    cavs = [a.vehicle for a in world._agents if a.vehicle is not None]
    assert p.layout == "junction" and p.count[0] <= len(cavs) <= p.count[1]
    assert cavs[0].vid == min(v.vid for v in cavs)          # the first agent is the evaluation ego

    def fits(centre):
        b0, d0 = _bearing_and_distance(cavs[0], centre)
        if not p.junction_distance[0] <= d0 <= p.junction_distance[1]:
            return False
        for v in cavs[1:]:
            b, d = _bearing_and_distance(v, centre)
            off = abs((b - b0 + np.pi) % (2 * np.pi) - np.pi)
            if d > p.spawn_radius or d < p.junction_distance[0] or off < np.radians(p.min_arm_angle):
                return False
        return True

    assert any(fits(j.center) for j in world.traffic.net.junctions)
    world.close()


def test_free_layout_and_bad_layout():
    cfg = replace(small_config(), warmup_ticks=0)
    world = BuiltinWorld(replace(cfg, agents=replace(cfg.agents, layout="free")))
    world.reset(0)
    cavs = [a.vehicle for a in world._agents if a.vehicle is not None]
    assert len(cavs) >= 2
    assert all(np.hypot(v.x - cavs[0].x, v.y - cavs[0].y) <= cfg.agents.spawn_radius for v in cavs[1:])
    assert world.protocol()["scenario"]["layout"] == "free"
    with pytest.raises(ValueError, match="agents.layout must be one of"):
        AgentParams(layout="ring")
