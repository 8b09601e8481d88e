"""CARLA bridge: conversions checked against the ``carla`` client library (which
builds Transforms and BoundingBoxes offline), the sensor plans, the frame-keyed
sensor queue, the connection error, and one live test that needs a server."""
from __future__ import annotations

import os
import socket
import time
from types import SimpleNamespace

import numpy as np
import pytest

from opencood_ext.sim import carla_convert as cc
from opencood_ext.sim.world import AgentInfo, CameraSpec, LidarSpec
from opencood_ext.geometry.boxes import object_corners_world
from opencood_ext.geometry.transforms import invert_transform, pose_to_matrix

carla = pytest.importorskip("carla", reason="the carla client package (pip install carla==0.9.16)")

POSES = [
    (0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
    (12.5, -40.25, 1.9, 0.0, 90.0, 0.0),
    (-3.0, 7.0, 0.3, 4.0, -135.0, 7.5),
    (100.0, 250.0, -2.0, -12.0, 179.0, -20.0),
    (1.0, 2.0, 3.0, 33.0, 61.0, -44.0),
]


def _tf(x, y, z, roll, yaw, pitch):
    return carla.Transform(carla.Location(x=x, y=y, z=z), carla.Rotation(pitch=pitch, yaw=yaw, roll=roll))


def _xyz(loc):
    return np.array([loc.x, loc.y, loc.z], dtype=np.float64)


# ----------------------------------------------------------------------------- poses

@pytest.mark.parametrize("pose", POSES)
def test_transform_pose_matrix_matches_carla(pose):
    t = _tf(*pose)
    p = cc.transform_to_pose(t)
    np.testing.assert_allclose(p, pose, atol=1e-5)  # carla stores float32
    np.testing.assert_allclose(pose_to_matrix(p), np.array(t.get_matrix()), atol=2e-5)
    # round trip through carla.Transform
    back = cc.pose_to_transform(p)
    np.testing.assert_allclose(np.array(back.get_matrix()), np.array(t.get_matrix()), atol=1e-6)


@pytest.mark.parametrize("pose", POSES[1:])
def test_points_transform_like_carla(pose):
    t = _tf(*pose)
    T = cc.transform_to_matrix(t)
    rng = np.random.default_rng(0)
    for p in rng.uniform(-20, 20, size=(6, 3)):
        want = _xyz(t.transform(carla.Location(x=p[0], y=p[1], z=p[2])))
        np.testing.assert_allclose(T[:3, :3] @ p + T[:3, 3], want, atol=1e-3)
    # and back with carla's inverse matrix
    np.testing.assert_allclose(invert_transform(T), np.array(t.get_inverse_matrix()), atol=2e-5)


def test_camera_extrinsics_compose_mounts():
    lidar_mount, cam_mount = (-0.5, 0.0, 1.9, 0.0, 0.0, 0.0), (2.5, 0.3, 1.0, 0.0, 100.0, -5.0)
    vehicle = _tf(30.0, -12.0, 0.2, 1.0, 37.0, 2.0)
    T_lc = cc.camera_extrinsics(lidar_mount, cam_mount)
    T_wl = np.array(vehicle.get_matrix()) @ pose_to_matrix(lidar_mount)
    cam_tf = cc.pose_to_transform(cam_mount)
    # camera-frame points -> world through CARLA's own attach chain (mount, then vehicle)
    for p in ([10.0, 0.0, 0.0], [4.0, -2.0, 1.5], [0.0, 0.0, 0.0]):
        via_carla = _xyz(vehicle.transform(cam_tf.transform(carla.Location(*p))))
        ours = T_wl @ T_lc @ np.append(p, 1.0)
        np.testing.assert_allclose(ours[:3], via_carla, atol=1e-3)


# ----------------------------------------------------------------------------- labels

@pytest.mark.parametrize("pose", POSES)
def test_vehicle_label_corners_equal_carla_world_vertices(pose):
    t = _tf(*pose)
    bb = carla.BoundingBox(carla.Location(x=0.35, y=-0.05, z=0.72), carla.Vector3D(x=2.4, y=1.05, z=0.75))
    label = cc.vehicle_label(17, t, bb, obj_type="Van", speed_kmh=30.0)
    ours = object_corners_world(label.location, label.center, label.angle, label.extent)
    theirs = np.array([_xyz(v) for v in bb.get_world_vertices(t)])
    # same set of 8 corners (the corner order differs between the conventions)
    d = np.linalg.norm(ours[:, None] - theirs[None], axis=-1)
    assert np.all(d.min(axis=1) < 1e-3) and np.all(d.min(axis=0) < 1e-3)
    np.testing.assert_allclose(label.location, pose[:3], atol=1e-5)
    np.testing.assert_allclose(label.angle, [pose[3], pose[4], pose[5]], atol=1e-4)
    np.testing.assert_allclose(label.extent, [2.4, 1.05, 0.75], atol=1e-6)
    assert label.object_id == 17 and label.obj_type == "Van" and label.speed == 30.0
    if pose[4] not in (0.0,):
        # the centre offset is in world axes: NOT the raw actor-frame bbox location
        assert not np.allclose(label.center, [0.35, -0.05, 0.72], atol=1e-3)


def test_vehicle_label_with_rotated_box():
    t = _tf(5.0, 6.0, 0.0, 0.0, 30.0, 0.0)
    bb = carla.BoundingBox(carla.Location(x=1.0, y=0.0, z=0.8), carla.Vector3D(x=2.0, y=1.0, z=0.8))
    bb.rotation = carla.Rotation(pitch=0.0, yaw=15.0, roll=0.0)
    label = cc.vehicle_label(3, t, bb)
    np.testing.assert_allclose(label.angle, [0.0, 45.0, 0.0], atol=1e-4)
    ours = object_corners_world(label.location, label.center, label.angle, label.extent)
    theirs = np.array([_xyz(v) for v in bb.get_world_vertices(t)])
    d = np.linalg.norm(ours[:, None] - theirs[None], axis=-1)
    assert np.all(d.min(axis=1) < 1e-3)


def test_obj_type_and_speed():
    assert cc.obj_type_of("truck") == "Truck" and cc.obj_type_of("Bus") == "Bus"
    assert cc.obj_type_of("") == "Car"
    assert cc.speed_kmh(carla.Vector3D(x=3.0, y=4.0, z=0.0)) == pytest.approx(18.0)


# ----------------------------------------------------------------------------- LiDAR

def test_lidar_buffer_layout():
    pts = np.array([[1.5, -2.0, 0.25, 0.9], [10.0, 3.0, -1.5, 0.1], [0.0, 0.0, 0.0, 1.0]], np.float32)
    raw = bytearray(pts.tobytes())
    out = cc.lidar_buffer_to_points(raw)
    assert out.dtype == np.float32 and out.shape == (3, 4)
    np.testing.assert_array_equal(out, pts)
    raw[0:4] = np.float32(7.0).tobytes()  # the returned array is a copy
    assert out[0, 0] == 1.5
    assert cc.lidar_buffer_to_points(b"").shape == (0, 4)
    with pytest.raises(ValueError, match="16-byte"):
        cc.lidar_buffer_to_points(b"\x00" * 20, source="agent 3 lidar")


def test_semantic_buffer_layout():
    rec = np.zeros(2, dtype=cc.SEMANTIC_DTYPE)
    rec["x"], rec["object_idx"], rec["object_tag"] = [1.0, 2.0], [42, 7], [14, 1]
    out = cc.semantic_buffer_to_points(rec.tobytes())
    assert out["object_idx"].tolist() == [42, 7] and out["x"].tolist() == [1.0, 2.0]
    assert cc.SEMANTIC_DTYPE.itemsize == 24
    with pytest.raises(ValueError, match="24-byte"):
        cc.semantic_buffer_to_points(b"\x00" * 25)


def test_ring_reduction_keeps_every_nth_channel():
    counts = [3, 1, 0, 2, 4, 1, 2, 2]  # 8 channels, channel-major order
    ch = cc.point_channels(counts)
    assert ch.tolist() == [0, 0, 0, 1, 3, 3, 4, 4, 4, 4, 5, 6, 6, 7, 7]
    pts = np.c_[np.arange(len(ch), dtype=np.float32), ch.astype(np.float32), np.zeros((len(ch), 2), np.float32)]
    half = cc.reduce_rings(pts, counts, 2)
    assert sorted(set(half[:, 1].tolist())) == [0.0, 4.0, 6.0]
    assert len(half) == 3 + 4 + 2
    quarter = cc.reduce_rings(pts, counts, 4)
    assert set(quarter[:, 1].tolist()) == {0.0, 4.0}
    with pytest.raises(ValueError, match="sum to"):
        cc.reduce_rings(pts[:-1], counts, 2)


# ----------------------------------------------------------------------------- cameras

def test_bgra_to_rgb_and_depth_decode():
    # one hand-made 2x1 BGRA image: pixel 0 = (B=3, G=2, R=1), pixel 1 = (B=0, G=1, R=0)
    raw = bytes([3, 2, 1, 255, 0, 1, 0, 255])
    rgb = cc.bgra_to_rgb(raw, width=2, height=1)
    assert rgb.shape == (1, 2, 3) and rgb.dtype == np.uint8
    assert rgb[0, 0].tolist() == [1, 2, 3] and rgb[0, 1].tolist() == [0, 1, 0]
    depth = cc.decode_depth(raw, width=2, height=1)
    scale = 1000.0 / (256 ** 3 - 1)
    assert depth.dtype == np.float32 and depth.shape == (1, 2)
    assert depth[0, 0] == pytest.approx((1 + 2 * 256 + 3 * 65536) * scale, rel=1e-6)
    assert depth[0, 1] == pytest.approx(256 * scale, rel=1e-6)
    # the far plane: white = 1000 m
    assert cc.decode_depth(bytes([255, 255, 255, 255]), 1, 1)[0, 0] == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="2x2 BGRA"):
        cc.bgra_to_rgb(raw, width=2, height=2)


def test_depth_encode_round_trip():
    d = np.array([[0.0, 0.5, 12.345], [80.0, 999.9, 1000.0]])
    back = cc.decode_depth(cc.encode_depth(d).tobytes(), 3, 2)
    np.testing.assert_allclose(back, d, atol=1000.0 / (256 ** 3 - 1))


# ----------------------------------------------------------------------------- sensor plans

def _opv2v_cameras():
    yaws = {"camera0": 0.0, "camera1": 100.0, "camera2": -100.0, "camera3": 180.0}
    return [CameraSpec(name=n, mount=(0.0, 0.0, 1.8, 0.0, y, 0.0)) for n, y in yaws.items()]


def test_sensor_plans_lidar_and_cameras():
    m1 = AgentInfo(0, "m1", LidarSpec(), lidar_variants={32: 2, 16: 4})
    plans = cc.sensor_plans(m1)
    assert [p.blueprint for p in plans] == ["sensor.lidar.ray_cast"]  # variants: same sweep
    a = plans[0].attributes
    assert a["channels"] == "64" and a["range"] == "120.0" and a["points_per_second"] == "1300000"
    assert a["rotation_frequency"] == "20.0" and a["upper_fov"] == "2.0" and a["lower_fov"] == "-25.0"
    assert a["noise_stddev"] == "0.02" and a["dropoff_general_rate"] == "0.1"
    m3 = AgentInfo(1, "m3", LidarSpec(channels=32))
    assert cc.sensor_plans(m3)[0].attributes["channels"] == "32"
    sem = cc.lidar_attributes(LidarSpec(channels=16), semantic=True)
    assert sem["channels"] == "16" and "noise_stddev" not in sem

    cam_agent = AgentInfo(2, "m2", None, cameras=_opv2v_cameras())
    plans = cc.sensor_plans(cam_agent)
    rgb = [p for p in plans if p.blueprint == "sensor.camera.rgb"]
    dep = [p for p in plans if p.blueprint == "sensor.camera.depth"]
    assert len(rgb) == 4 and len(dep) == 4 and len({p.key for p in plans}) == 8
    for p in rgb + dep:
        assert p.attributes == {"image_size_x": "800", "image_size_y": "600", "fov": "100.0"}
    np.testing.assert_allclose(cc.camera_of(rgb[0]).K[0, 0], 335.64, atol=0.01)
    assert [p.blueprint for p in cc.sensor_plans(cam_agent, depth=False)] == ["sensor.camera.rgb"] * 4
    with pytest.raises(ValueError, match="no LiDAR and no cameras"):
        cc.sensor_plans(cam_agent, record_cameras=False)
    mount = cc.pose_to_transform(rgb[1].mount)
    assert mount.rotation.yaw == pytest.approx(100.0) and mount.location.z == pytest.approx(1.8)


# ----------------------------------------------------------------------------- visibility

def test_visible_ids_counts_points_inside_boxes():
    from opencood_ext.data.frame import ObjectLabel

    T_world_lidar = pose_to_matrix([100.0, 50.0, 1.9, 0.0, 90.0, 0.0])
    # a car 10 m ahead of the sensor (sensor yaw 90: ahead is world +y) and one 30 m behind
    ahead = ObjectLabel(5, [100.0, 60.0, 0.0], [0.0, 0.0, 0.8], [0, 90, 0], [2.2, 1.0, 0.8])
    behind = ObjectLabel(6, [100.0, 20.0, 0.0], [0.0, 0.0, 0.8], [0, 0, 0], [2.2, 1.0, 0.8])
    far = ObjectLabel(7, [100.0, 300.0, 0.0], [0.0, 0.0, 0.8], [0, 0, 0], [2.2, 1.0, 0.8])
    # LiDAR-frame points: two on the car ahead (x = 10 m, just above its floor), ground elsewhere
    pts = np.array([[10.0, 0.3, -1.5, 0.5], [9.0, -0.5, -1.0, 0.5], [5.0, 5.0, -1.9, 0.2],
                    [-30.0, 4.0, -1.9, 0.2]], np.float32)
    objs = [ahead, behind, far]
    assert cc.visible_ids([5, 6, 7], objs, pts, T_world_lidar, 120.0) == [5]
    assert cc.visible_ids([5, 6, 7], objs, pts, T_world_lidar, 120.0, min_points=3) == []
    assert cc.visible_ids([5, 6, 7], objs, pts, T_world_lidar, 5.0) == []  # out of range
    assert cc.visible_ids([], [], pts, T_world_lidar, 120.0) == []


# ----------------------------------------------------------------------------- the frame queue

def test_frame_queue_matches_frames_and_times_out():
    from opencood_ext.sim.carla_bridge import FrameQueue, SensorTimeout

    fq = FrameQueue()
    put_lidar, put_cam = fq.callback((1, "lidar")), fq.callback((1, "rgb:camera0"))
    with pytest.raises(ValueError, match="twice"):
        fq.callback((1, "lidar"))
    for f in (10, 11):  # two ticks per saved frame: the first is dropped
        put_lidar(SimpleNamespace(frame=f, tag=f"lidar{f}"))
        put_cam(SimpleNamespace(frame=f, tag=f"cam{f}"))
    got = fq.collect(11, timeout_s=1.0)
    assert {k: v.tag for k, v in got.items()} == {(1, "lidar"): "lidar11", (1, "rgb:camera0"): "cam11"}
    put_lidar(SimpleNamespace(frame=13, tag="x"))
    with pytest.raises(SensorTimeout, match=r"'rgb:camera0'\) delivered nothing for frame 13"):
        fq.collect(13, timeout_s=0.05)
    put_lidar(SimpleNamespace(frame=16, tag="y"))
    with pytest.raises(SensorTimeout, match="skipped frame 15"):
        fq.collect(15, timeout_s=0.05)


# ----------------------------------------------------------------------------- connection

def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # verify nothing listens there
        s.settimeout(0.5)
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return port


def test_connect_to_closed_port_raises_carla_unavailable():
    from opencood_ext.sim.carla_bridge import CarlaUnavailable, connect

    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(CarlaUnavailable) as err:
        connect("127.0.0.1", port, timeout_s=2.0)
    elapsed = time.monotonic() - t0
    msg = str(err.value)
    assert f"127.0.0.1:{port}" in msg and "within 2 s" in msg and "docker compose" in msg
    assert elapsed < 2.0 + 20.0, "connect() must give up after its timeout, not hang"


def test_world_validates_arguments_before_connecting():
    from opencood_ext.sim.carla_bridge import CarlaWorld

    with pytest.raises(ValueError, match="agent_types is empty"):
        CarlaWorld(agent_types={})
    with pytest.raises(ValueError, match="unknown agent types"):
        CarlaWorld(agent_types={"m1": SimpleNamespace(lidar=LidarSpec())}, assignment=["m1", "m9"])


def test_destroy_actors_stops_sensors_then_destroys_sensors_first():
    from opencood_ext.sim.carla_bridge import destroy_actors

    events = []

    class Sensor:
        def __init__(self, i, listening):
            self.id, self.listening = i, listening

        def is_listening(self):  # a method, as in carla 0.9.16
            return self.listening

        def stop(self):
            events.append(("stop", self.id))
            self.listening = False

    class Client:
        def apply_batch_sync(self, cmds, do_tick):
            events.append(("destroy", [c.actor_id for c in cmds], do_tick))
            return []

    destroy_actors(Client(), [Sensor(11, True), Sensor(12, False), Sensor(13, True)], [1, 2, 40])
    assert events == [("stop", 11), ("stop", 13), ("destroy", [11, 12, 13, 1, 2, 40], False)]

    class Broken(Client):
        def apply_batch_sync(self, cmds, do_tick):
            raise RuntimeError("time-out of 10000ms while waiting for the simulator")

    destroy_actors(Broken(), [], [3])  # logged, not raised: clean-up runs while unwinding errors
    events.clear()
    destroy_actors(Client(), [], [])
    assert events == []


# ----------------------------------------------------------------------------- bookkeeping (fake server)

def test_world_bookkeeping_on_a_fake_server(monkeypatch):
    from opencood_ext.sim.carla_bridge import CarlaWorld

    from carla_fake_server import FakeServer

    server = FakeServer()
    monkeypatch.setattr(carla, "Client", lambda host, port: server)
    cams = [CameraSpec(name=f"camera{i}", width=8, height=6, mount=(0.0, 0.0, 1.8, 0.0, yaw, 0.0))
            for i, yaw in enumerate((0.0, 100.0, -100.0, 180.0))]
    types = {"m1": SimpleNamespace(lidar=LidarSpec(), cameras=[], lidar_variants={32: 2, 16: 4}),
             "m2": SimpleNamespace(lidar=LidarSpec(channels=32), cameras=cams, lidar_variants={}),
             "m3": SimpleNamespace(lidar=LidarSpec(keep_every=2), cameras=[], lidar_variants={})}
    with CarlaWorld(agent_types=types, num_agents=3, num_background=0, seed=1,
                    assignment=["m1", "m2", "m3"]) as world:
        assert server.settings.synchronous_mode and server.settings.fixed_delta_seconds == 0.05
        assert [a.agent_type for a in world.agents] == ["m1", "m2", "m3"]
        assert len(server.sensors) == 1 + 9 + 1
        frames = [world.tick(), world.tick()]
    assert [f.timestamp for f in frames] == ["000002", "000004"]
    ids = [a.agent_id for a in frames[0].agents]
    f = frames[-1]
    assert sorted(f.objects) == ids
    for a in f.agents:
        assert a.visible_ids == [i for i in ids if i != a.agent_id]
        assert a.meta["carla_frame"] == 6  # reset ticks twice (settle, after spawning), then 2 + 2
    m1, m2 = f.agents[0], f.agents[1]
    assert m1.lidar.shape == (640, 4) and {b: len(p) for b, p in m1.lidar_beams.items()} == {32: 320, 16: 160}
    assert m2.lidar.shape == (320, 4) and m2.lidar_beams == {}
    assert f.agents[2].lidar.shape == (320, 4)  # a 64-channel sweep, every 2nd ring kept
    assert [c.image.shape for c in m2.cameras] == [(6, 8, 3)] * 4 and m2.cameras[0].depth.shape == (6, 8)
    for c in m2.cameras:
        np.testing.assert_allclose(m2.T_world_from_lidar @ c.T_lidar_from_camera, c.T_world_from_camera, atol=1e-4)
    # closed: sensors stopped, every actor destroyed (sensors first), settings restored
    assert server.sensors == [] and server.vehicles == [] and server.settings.synchronous_mode is False
    assert len(server.destroyed) == 11 + 3 and set(server.destroyed[:11]) == {s for s in range(101, 115)} - set(ids)


# ----------------------------------------------------------------------------- a real server

@pytest.mark.carla_server
def test_live_server_few_ticks():
    from opencood_ext.sim.carla_bridge import CarlaUnavailable, CarlaWorld, connect

    host, port = os.environ.get("CARLA_HOST", "127.0.0.1"), int(os.environ.get("CARLA_PORT", "2000"))
    reason = f"no CARLA server at {host}:{port} (start one with docker compose, see README)"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        if s.connect_ex((host, port)) != 0:
            pytest.skip(reason)
    try:
        client, _ = connect(host, port, timeout_s=5.0)
    except CarlaUnavailable:
        pytest.skip(reason)
    was_sync = client.get_world().get_settings().synchronous_mode
    types = {"m1": SimpleNamespace(lidar=LidarSpec(), cameras=[], lidar_variants={32: 2, 16: 4}),
             "m2": SimpleNamespace(lidar=LidarSpec(), cameras=_opv2v_cameras(), lidar_variants={})}
    with CarlaWorld(host, port, timeout_s=20.0, agent_types=types, num_agents=2, num_background=10,
                    seed=3) as world:
        settings = client.get_world().get_settings()
        assert settings.synchronous_mode and settings.fixed_delta_seconds == pytest.approx(0.05)
        assert [a.agent_type for a in world.agents] == ["m1", "m2"]
        frames = [world.tick() for _ in range(3)]
        assert [int(f.timestamp) for f in frames] == [2, 4, 6]  # two 0.05 s ticks per frame
        for f in frames:
            assert len(f.agents) == 2
            for a in f.agents:
                assert a.lidar.dtype == np.float32 and a.lidar.shape[1] == 4 and len(a.lidar) > 1000
                np.testing.assert_allclose(a.T_world_from_lidar, pose_to_matrix(a.lidar_pose))
                assert set(a.visible_ids) <= set(f.objects) and a.agent_id not in a.visible_ids
            m1, m2 = f.agents
            assert set(m1.lidar_beams) == {32, 16} and len(m1.lidar_beams[16]) < len(m1.lidar_beams[32]) < len(m1.lidar)
            assert [c.name for c in m2.cameras] == ["camera0", "camera1", "camera2", "camera3"]
            for c in m2.cameras:
                assert c.image.shape == (600, 800, 3) and c.depth.shape == (600, 800)
                assert 0 < float(c.depth.min()) and float(c.depth.max()) <= 1000.0
                np.testing.assert_allclose(m2.T_world_from_lidar @ c.T_lidar_from_camera,
                                           c.T_world_from_camera, atol=0.05)
        assert world.protocol()["fixed_delta_seconds"] == 0.05
        ours = {s.id for s in world._sensors} | {a.agent_id for a in world.agents} | set(world._background_ids)
        assert len(ours) == 2 + 8 + 2 + 10 or len(world._background_ids) < 10
    # clean-up: no actor of ours is left and the server's settings are back
    assert not ours & {a.id for a in client.get_world().get_actors()}
    assert client.get_world().get_settings().synchronous_mode == was_sync
