"""CARLA bridge: conversions checked against the ``carla`` client library (which
builds Transforms and BoundingBoxes offline), the sensor plans, the frame-keyed
sensor queue (the connection and a live server: test_carla_connection.py)."""
from __future__ import annotations

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
