"""OPV2V / OPV2V-H / V2XSet reader and writer, ground-truth extraction."""
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.data.errors import DataFormatError, SkippedFrame
from opencood_ext.data.formats import (OPV2VReader, get_reader, write_data_protocol, write_modality_json,
                                       write_opv2v_frame)
from opencood_ext.data.frame import AgentObs, CameraObs, Frame, ObjectLabel
from opencood_ext.data.ground_truth import frame_ground_truth
from opencood_ext.geometry import (boxes_to_corners, invert_transform, matrix_to_pose, points_in_boxes,
                                   pose_to_matrix)

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures"
SCEN = "2021_08_21_17_30_41"


def _fixture_root():
    root = FIXTURES / "v2xset_real"
    if not root.exists():
        pytest.skip("../shared/fixtures is not present (a user's clone)")
    return root


def make_frame(seed=0, scenario="2021_01_01_00_00_00", ts="000007", n=400):
    """Vehicles 0 and 3 and RSU -1, with beams, a camera with depth, and 3 objects."""
    rng = np.random.default_rng(seed)
    objects = {oid: ObjectLabel(oid, location=rng.normal(0, 20, 3), center=[0.01, -0.02, 0.7],
                                angle=[0.1, rng.uniform(-180, 180), -0.2], extent=[2.2, 1.0, 0.75],
                                obj_type=t, speed=float(rng.uniform(0, 30)))
               for oid, t in ((10, "Car"), (11, "Truck"), (12, "Car"))}
    agents = []
    for aid, visible in ((3, [10, 11]), (-1, [11, 12]), (0, [12])):
        pose = np.array([*rng.normal(0, 30, 3), rng.uniform(-2, 2), rng.uniform(-180, 180), rng.uniform(-2, 2)])
        pts = np.empty((n, 4), np.float32)
        pts[:, :3] = rng.normal(0, 20, (n, 3))
        pts[:, 3] = rng.integers(0, 256, n) / np.float32(255)
        T_l_c = pose_to_matrix([1.5, 0.3, -0.5, 0.0, 100.0, -3.0])
        T_w_c = pose_to_matrix(pose) @ T_l_c
        cam = CameraObs("camera1", image=rng.integers(0, 256, (6, 8, 3), dtype=np.uint8),
                        K=np.array([[335.6, 0, 4], [0, 335.6, 3], [0, 0, 1.0]]), T_lidar_from_camera=T_l_c,
                        depth=(rng.integers(0, 20000, (6, 8)) / 256.0).astype(np.float32),
                        T_world_from_camera=T_w_c, cords=matrix_to_pose(T_w_c))
        agents.append(AgentObs(aid, "", pose_to_matrix(pose), pts, cameras=[cam],
                               lidar_beams={32: pts[::2].copy(), 16: pts[::4].copy()}, visible_ids=visible,
                               lidar_pose=pose, meta={"ego_speed": 12.5, "true_ego_pos": [1.0, 2.0, 0.0, 0, 90.0, 0],
                                                      "predicted_ego_pos": [1.1, 2.1, 0.0, 0, 90.5, 0],
                                                      "RSU": aid < 0}))
    return Frame(scenario, ts, agents, objects, split="train")


def assert_frames_equal(a: Frame, b: Frame, depth=True):
    assert (a.scenario, a.timestamp) == (b.scenario, b.timestamp)
    assert [x.agent_id for x in a.agents] == [x.agent_id for x in b.agents]
    assert sorted(a.objects) == sorted(b.objects)
    for oid, o in a.objects.items():
        p = b.objects[oid]
        for f in ("location", "center", "angle", "extent"):
            np.testing.assert_allclose(getattr(o, f), getattr(p, f), atol=1e-9)
        assert (o.obj_type, o.speed) == (p.obj_type, p.speed)
    for x, y in zip(a.agents, b.agents):
        np.testing.assert_array_equal(x.lidar[:, :3], y.lidar[:, :3])
        np.testing.assert_allclose(x.lidar[:, 3], y.lidar[:, 3], atol=0.5 / 255)
        np.testing.assert_allclose(x.T_world_from_lidar, y.T_world_from_lidar, atol=1e-6)
        assert sorted(x.lidar_beams) == sorted(y.lidar_beams)
        for k in x.lidar_beams:
            np.testing.assert_allclose(x.lidar_beams[k], y.lidar_beams[k], atol=0.5 / 255)
        assert x.visible_ids == y.visible_ids and x.agent_type == y.agent_type
        assert x.meta == y.meta
        assert [c.name for c in x.cameras] == [c.name for c in y.cameras]
        for c, d in zip(x.cameras, y.cameras):
            np.testing.assert_array_equal(c.image, d.image)
            np.testing.assert_allclose(c.K, d.K, atol=1e-9)
            np.testing.assert_allclose(c.T_lidar_from_camera, d.T_lidar_from_camera, atol=1e-6)
            np.testing.assert_allclose(c.T_world_from_camera, d.T_world_from_camera, atol=1e-6)
            assert (c.depth is None) == (d.depth is None)
            if depth and c.depth is not None:   # 8-bit metres, OPV2V-H's encoding
                np.testing.assert_array_equal(np.clip(np.rint(c.depth), 0, 255), d.depth)


# --------------------------------------------------------------------------- the real V2XSet frame

def test_fixture_frame():
    reader = OPV2VReader(_fixture_root(), "validate")
    assert len(reader) == 1 and reader.scenarios == [SCEN] and reader.samples == [(SCEN, "000069")]
    frame = reader[0]
    (agent,) = frame.agents
    assert agent.agent_id == 4279 and not agent.is_rsu
    assert 39000 < len(agent.lidar) < 40000 and agent.lidar.dtype == np.float32
    assert agent.lidar[:, 3].max() > 0.5
    assert len(frame.objects) == 21 and agent.visible_ids == sorted(frame.objects)
    assert {"ego_speed", "true_ego_pos", "predicted_ego_pos"} <= set(agent.meta)
    assert [c.name for c in agent.cameras] == ["camera0", "camera1", "camera2", "camera3"]
    for cam in agent.cameras:
        assert cam.image.shape == (600, 800, 3) and cam.image.dtype == np.uint8
        np.testing.assert_allclose(cam.K, [[335.639852470912, 0, 400], [0, 335.639852470912, 300], [0, 0, 1]])
        # extrinsic convention: T_lidar_from_camera agrees with the world poses
        rel = invert_transform(agent.T_world_from_lidar) @ cam.T_world_from_camera
        np.testing.assert_allclose(cam.T_lidar_from_camera, rel, atol=1e-9)
    np.testing.assert_allclose(agent.cameras[0].T_lidar_from_camera[:3, 3], [3.0, 0.0, -0.9], atol=1e-3)


def test_fixture_boxes_contain_own_points():
    frame = OPV2VReader(_fixture_root(), "validate", load_cameras=False)[0]
    agent = frame.agents[0]
    gt = frame_ground_truth(frame, agent.T_world_from_lidar)
    assert len(gt) == 21 and gt.boxes.dtype == np.float32
    counts = points_in_boxes(agent.lidar, gt.boxes).sum(axis=0)
    assert (counts >= 5).sum() >= 15, counts
    assert ((gt.boxes[:, 3] > 3) & (gt.boxes[:, 3] < 6) & (gt.boxes[:, 4] > 1.5) & (gt.boxes[:, 4] < 2.5)).all()
    assert ((gt.boxes[:, 2] > -1.5) & (gt.boxes[:, 2] < -0.7)).all()  # ground ~1.9 m below the LiDAR


def test_fixture_round_trip(tmp_path):
    frame = OPV2VReader(_fixture_root(), "validate")[0]
    write_opv2v_frame(tmp_path, "validate", frame, pcd_data="binary_compressed")
    back = OPV2VReader(tmp_path, "validate")[0]
    assert_frames_equal(frame, back)
    np.testing.assert_array_equal(back.agents[0].lidar, frame.agents[0].lidar)
    assert back.agents[0].lidar_pose.tolist() == frame.agents[0].lidar_pose.tolist()


# --------------------------------------------------------------------------- writer / reader on synthetic data

def test_synthetic_round_trip_with_modality(tmp_path):
    frame = make_frame()
    write_opv2v_frame(tmp_path, "train", frame)
    jpath = write_modality_json(tmp_path / "assign.json", {frame.scenario: {"0": "m1", "3": "m3", "-1": "m2"}})
    reader = OPV2VReader(tmp_path, "train", modality=jpath)
    back = reader[0]
    assert [a.agent_id for a in back.agents] == [0, 3, -1]
    assert [a.agent_type for a in back.agents] == ["m1", "m3", "m2"]
    for a in frame.agents:
        a.agent_type = {0: "m1", 3: "m3", -1: "m2"}[a.agent_id]
    frame.agents.sort(key=lambda a: [0, 3, -1].index(a.agent_id))
    assert_frames_equal(frame, back)
    assert back.agent(-1).is_rsu and sorted(back.agent(3).lidar_beams) == [16, 32]


def test_writer_is_deterministic(tmp_path):
    for name in ("a", "b"):
        write_opv2v_frame(tmp_path / name, "train", make_frame(seed=3), pcd_data="binary_compressed")
        write_data_protocol(tmp_path / name, "train", make_frame().scenario, {"lidar": {"channels": 64}})
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    # per agent: pcd, yaml, _32, _16, camera, depth, bev_visibility; plus data_protocol.yaml
    assert files_a == files_b and len(files_a) == 3 * 7 + 1
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_written_yaml_keys(tmp_path):
    import yaml
    frame = make_frame()
    write_opv2v_frame(tmp_path, "train", frame, write_cameras=False)
    d = yaml.safe_load((tmp_path / "train" / frame.scenario / "3" / "000007.yaml").read_text())
    assert {"lidar_pose", "true_ego_pos", "predicted_ego_pos", "ego_speed", "vehicles", "camera1"} <= set(d)
    assert sorted(d["vehicles"]) == [10, 11] and d["vehicles"][11]["obj_type"] == "Truck"
    assert "obj_type" not in d["vehicles"][10]
    assert set(d["camera1"]) == {"cords", "extrinsic", "intrinsic"}
    pngs = sorted(p.name for p in (tmp_path / "train").rglob("*.png"))   # no camera or depth images
    assert pngs == ["000007_bev_visibility.png"] * 3


def test_hetero_root_lookup(tmp_path):
    frame = make_frame()
    main, het = tmp_path / "OPV2V", tmp_path / "OPV2V_Hetero"
    write_opv2v_frame(main, "train", frame)
    for p in sorted(main.rglob("*")):  # move the OPV2V-H extras into the parallel tree
        if p.is_file() and ("_32." in p.name or "_16." in p.name or "_depth" in p.name):
            dest = het / p.relative_to(main)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(p), dest)
    back = OPV2VReader(main, "train")[0]  # default: OPV2V -> OPV2V_Hetero
    assert sorted(back.agent(3).lidar_beams) == [16, 32] and back.agent(3).cameras[0].depth is not None
    explicit = OPV2VReader(tmp_path / "OPV2V", "train", hetero_root=het, load_depth=False, load_beams=False)[0]
    assert explicit.agent(3).lidar_beams == {} and explicit.agent(3).cameras[0].depth is None
    assert OPV2VReader(main, "train", load_cameras=False)[0].agent(3).cameras == []


def test_writer_puts_opv2v_h_files_in_the_hetero_tree(tmp_path):
    frame = make_frame()
    main, het = tmp_path / "data" / "OPV2V", tmp_path / "data" / "OPV2V_Hetero"
    written = write_opv2v_frame(main, "train", frame, hetero_root=het)
    extras = [p for p in written if "_32." in p.name or "_16." in p.name or "_depth" in p.name]
    assert len(extras) == 3 * 3 and all(het in p.parents for p in extras)
    assert not [p for p in main.rglob("*") if p in extras or "_depth" in p.name or "_32." in p.name]
    assert (main / "train" / frame.scenario / "3" / "000007_bev_visibility.png").is_file()
    back = OPV2VReader(main, "train")[0]   # finds OPV2V_Hetero by HEAL's path rule
    frame.agents.sort(key=lambda a: [0, 3, -1].index(a.agent_id))
    assert_frames_equal(frame, back)


def test_depth_png_encodings(tmp_path):
    from PIL import Image, PngImagePlugin

    from opencood_ext.data.formats.opv2v_io import read_depth_png, write_depth_png
    depth = np.array([[0.2, 0.6, 12.49, 12.51], [254.6, 1000.0, np.nan, np.inf]], np.float32)
    write_depth_png(tmp_path / "d.png", depth)
    img = Image.open(tmp_path / "d.png")
    assert img.mode == "L"   # HEAL: ToTensor(img) * 255 = the pixel value = metres
    expected = [[0, 1, 12, 13], [255, 255, 0, 255]]
    np.testing.assert_array_equal(np.asarray(img), expected)
    np.testing.assert_array_equal(read_depth_png(tmp_path / "d.png"), expected)
    # this project's older 16-bit files (depth x 256 with a depth_scale chunk) still read
    info = PngImagePlugin.PngInfo()
    info.add_text("depth_scale", "256")
    Image.fromarray(np.array([[256 * 3, 128]], np.uint16)).save(tmp_path / "old.png", pnginfo=info)
    np.testing.assert_allclose(read_depth_png(tmp_path / "old.png"), [[3.0, 0.5]])
    # a 16-bit PNG without the chunk has no known unit: refused, naming the file
    Image.fromarray(np.array([[768, 128]], np.uint16)).save(tmp_path / "unknown.png")
    with pytest.raises(DataFormatError, match=r"unknown\.png.*unknown encoding"):
        read_depth_png(tmp_path / "unknown.png")


def test_in_order_modality_and_max_agents(tmp_path):
    write_opv2v_frame(tmp_path, "train", make_frame())
    back = OPV2VReader(tmp_path, "train", modality="in_order")[0]
    assert [(a.agent_id, a.agent_type) for a in back.agents] == [(0, "m1"), (3, "m2"), (-1, "m3")]
    two = OPV2VReader(tmp_path, "train", max_agents=2)[0]
    assert [a.agent_id for a in two.agents] == [0, 3]


def test_modality_errors(tmp_path):
    frame = make_frame()
    write_opv2v_frame(tmp_path, "train", frame)
    unknown = write_modality_json(tmp_path / "u.json", {frame.scenario: {"0": "m1", "3": "m9", "-1": "m2"}})
    with pytest.raises(DataFormatError) as ei:
        OPV2VReader(tmp_path, "train", modality=unknown, allowed_types=["m1", "m2", "m3", "m4"])
    assert "u.json" in str(ei.value) and frame.scenario in str(ei.value) and "agent 3" in str(ei.value)
    assert "m9" in str(ei.value)
    missing = write_modality_json(tmp_path / "m.json", {frame.scenario: {"0": "m1", "3": "m2"}})
    with pytest.raises(DataFormatError, match=r"m\.json.*no modality for agent -1"):
        OPV2VReader(tmp_path, "train", modality=missing)
    with pytest.raises(DataFormatError, match="no modality assignment for scenario"):
        OPV2VReader(tmp_path, "train", modality={"other": {}})
    with pytest.raises(DataFormatError, match="m3"):
        OPV2VReader(tmp_path, "train", modality="in_order", allowed_types=["m1", "m2"])


def test_missing_split_lists_existing(tmp_path):
    write_opv2v_frame(tmp_path, "train", make_frame())
    (tmp_path / "validate").mkdir()
    with pytest.raises(DataFormatError) as ei:
        OPV2VReader(tmp_path, "test")
    assert "'test' not found" in str(ei.value) and "['train', 'validate']" in str(ei.value)
    with pytest.raises(DataFormatError, match="no frames found"):
        OPV2VReader(tmp_path, "validate")
    with pytest.raises(ValueError, match="unknown dataset format 'kitti'"):
        get_reader("kitti", tmp_path, "train")


def _two_timestamps(tmp_path):
    write_opv2v_frame(tmp_path, "train", make_frame(ts="000001"))
    write_opv2v_frame(tmp_path, "train", make_frame(ts="000002", seed=1))
    return tmp_path / "train" / make_frame().scenario


def test_missing_yaml_key_and_skip_bad(tmp_path, caplog):
    scen = _two_timestamps(tmp_path)
    bad_yaml = scen / "3" / "000001.yaml"
    bad_yaml.write_text(bad_yaml.read_text().replace("lidar_pose:", "lidar_pos:"))
    reader = OPV2VReader(tmp_path, "train")
    with pytest.raises(DataFormatError) as ei:
        reader[0]
    assert str(bad_yaml) in str(ei.value) and "[lidar_pose]" in str(ei.value)
    skipping = OPV2VReader(tmp_path, "train", skip_bad=True)
    with caplog.at_level(logging.WARNING):
        with pytest.raises(SkippedFrame, match="lidar_pose"):  # no other frame stands in for it
            skipping[0]
        frame = skipping[1]
    assert frame.timestamp == "000002" and skipping.skipped == 1
    assert "000001.yaml" in caplog.text and "lidar_pose" in caplog.text
    assert [f.timestamp for f in skipping] == ["000002"] and skipping.skipped == 1


def test_bad_object_and_truncated_pcd(tmp_path, caplog):
    scen = _two_timestamps(tmp_path)
    y = scen / "0" / "000002.yaml"
    y.write_text(y.read_text().replace("extent:", "extnt:", 1))
    with pytest.raises(DataFormatError, match=r"\[vehicles\.12\.extent\]"):
        OPV2VReader(tmp_path, "train")[1]
    pcd = scen / "-1" / "000001.pcd"
    pcd.write_bytes(pcd.read_bytes()[:-10])
    reader = OPV2VReader(tmp_path, "train", skip_bad=True)
    with caplog.at_level(logging.WARNING):
        assert list(reader) == []
        with pytest.raises(SkippedFrame, match="truncated"):
            reader[0]
    assert reader.skipped == 2 and "truncated" in caplog.text


def test_camera_png_without_yaml_key(tmp_path):
    frame = make_frame()
    write_opv2v_frame(tmp_path, "train", frame)
    shutil.copy(tmp_path / "train" / frame.scenario / "3" / "000007_camera1.png",
                tmp_path / "train" / frame.scenario / "3" / "000007_camera2.png")
    with pytest.raises(DataFormatError, match=r"000007\.yaml \[camera2\]: missing key"):
        OPV2VReader(tmp_path, "train")[0]


# --------------------------------------------------------------------------- ground truth


def test_ground_truth_range_rule_on_real_fixture():
    """V2XSet frame 000069 at +-40 m: the field keeps a box only with all 8 corners inside the
    range, z included. Car 4328 (centre x 39.90, front at x 42.59) has its centre inside but is
    dropped; 4327 (centre x 47.79) is outside either way. A roof below z -0.2 drops 4311 and 4313
    (tops at -0.06 and -0.08 m), whose centres (about -1.0 m) are inside."""
    frame = OPV2VReader(_fixture_root(), "validate")[0]
    T = frame.agents[0].T_world_from_lidar
    kept = [4306, 4309, 4310, 4311, 4312, 4313, 4314, 4316, 4317, 4318, 4321, 4323, 4326, 4329, 4330,
            4331, 4332, 4333, 4335]
    everything = frame_ground_truth(frame, T)
    assert sorted(everything.ids.tolist()) == sorted(kept + [4327, 4328])
    centres = everything.boxes[:, :3]
    r40 = (-40.0, -40.0, -3.0, 40.0, 40.0, 1.0)
    centre_inside = ((centres >= r40[:3]) & (centres <= r40[3:])).all(axis=1)
    assert sorted(everything.ids[centre_inside].tolist()) == sorted(kept + [4328])  # the old centre rule
    assert frame_ground_truth(frame, T, lidar_range=r40).ids.tolist() == kept
    low_roof = (-40.0, -40.0, -3.0, 40.0, 40.0, -0.2)
    assert frame_ground_truth(frame, T, lidar_range=low_roof).ids.tolist() == [i for i in kept if i not in (4311, 4313)]

def test_ground_truth_filters(tmp_path):
    frame = make_frame()
    ego = frame.agent(3)
    gt = frame_ground_truth(frame, ego.T_world_from_lidar)
    assert gt.ids.tolist() == [10, 11, 12] and gt.types == ["Car", "Truck", "Car"]
    assert gt.boxes.shape == (3, 7) and gt.boxes.dtype == np.float32
    np.testing.assert_allclose(gt.boxes[:, 3:6], [[4.4, 2.0, 1.5]] * 3, atol=1e-4)
    centre_world = frame.objects[11].location + frame.objects[11].center
    centre_ego = invert_transform(ego.T_world_from_lidar) @ np.append(centre_world, 1.0)
    np.testing.assert_allclose(gt.boxes[1, :3], centre_ego[:3], atol=1e-4)
    assert frame_ground_truth(frame, ego.T_world_from_lidar, visible_to=[3]).ids.tolist() == [10, 11]
    assert frame_ground_truth(frame, ego.T_world_from_lidar, visible_to=[0, -1]).ids.tolist() == [11, 12]
    assert frame_ground_truth(frame, ego.T_world_from_lidar, classes=["Truck"]).ids.tolist() == [11]
    corners = boxes_to_corners(gt.boxes[1:2])[0]
    tight = (*(corners.min(axis=0) - 0.05), *(corners.max(axis=0) + 0.05))
    assert frame_ground_truth(frame, ego.T_world_from_lidar, lidar_range=tight).ids.tolist() == [11]
    # the centre alone inside is not enough: a box is kept only with all 8 corners inside (the field's rule)
    c = gt.boxes[1, :3]
    around_centre = (c[0] - 0.1, c[1] - 0.1, c[2] - 0.1, c[0] + 0.1, c[1] + 0.1, c[2] + 0.1)
    assert frame_ground_truth(frame, ego.T_world_from_lidar, lidar_range=around_centre).ids.tolist() == []
    empty = frame_ground_truth(frame, ego.T_world_from_lidar, lidar_range=(1e6, 1e6, 1e6, 2e6, 2e6, 2e6))
    assert len(empty) == 0 and empty.boxes.shape == (0, 7)
