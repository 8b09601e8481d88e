"""DAIR-V2X-C reader on a tiny dataset written in DAIR's layout."""
import json
import logging

import numpy as np
import pytest

from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.formats import DairV2XReader, get_reader, write_pcd
from opencood_ext.data.formats.dairv2x import corners_to_label
from opencood_ext.data.ground_truth import frame_ground_truth
from opencood_ext.geometry import boxes_to_corners, invert_transform, object_corners_world


def rot_z(deg):
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1.0]])


def T_of(R, t):
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = R, t
    return T


# world boxes [x, y, z, l, w, h, yaw]
BOXES = {"Car": [105.0, 203.0, 5.8, 4.5, 1.9, 1.6, 0.3], "Pedestrian": [101.0, 199.0, 5.5, 0.6, 0.6, 1.7, 0.0],
         "van": [95.0, 210.0, 6.0, 5.0, 2.0, 2.1, -1.2], "Truck": [120.0, 190.0, 6.5, 9.0, 2.6, 3.2, 2.5]}
L2N = (rot_z(30), [1.0, 0.2, 1.5])
N2W = (rot_z(10), [100.0, 200.0, 5.0])
V2W = (rot_z(-45), [110.0, 190.0, 6.0])
DELTA = {"delta_x": 0.5, "delta_y": -0.25}


def _dump(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _calib(R, t):
    return {"rotation": np.asarray(R).tolist(), "translation": [[v] for v in t]}


def make_dair(root, ids=(("000010", "001000"), ("000011", "001001"))):
    info = []
    rng = np.random.default_rng(0)
    for veh, inf in ids:
        info.append({"vehicle_image_path": f"vehicle-side/image/{veh}.jpg",
                     "vehicle_pointcloud_path": f"vehicle-side/velodyne/{veh}.pcd",
                     "infrastructure_image_path": f"infrastructure-side/image/{inf}.jpg",
                     "infrastructure_pointcloud_path": f"infrastructure-side/velodyne/{inf}.pcd",
                     "cooperative_label_path": f"cooperative/label_world/{veh}.json",
                     "system_error_offset": DELTA})
        _dump(root / f"vehicle-side/calib/lidar_to_novatel/{veh}.json", {"transform": _calib(*L2N)})
        _dump(root / f"vehicle-side/calib/novatel_to_world/{veh}.json", _calib(*N2W))
        _dump(root / f"infrastructure-side/calib/virtuallidar_to_world/{inf}.json", _calib(*V2W))
        labels = [{"type": t, "world_8_points": boxes_to_corners(np.array([b]))[0].tolist()}
                  for t, b in BOXES.items()]
        _dump(root / f"cooperative/label_world/{veh}.json", labels)
        for side, fid in (("vehicle-side", veh), ("infrastructure-side", inf)):
            pts = np.column_stack([rng.normal(0, 10, (50, 3)), rng.integers(0, 256, 50)]).astype(np.float32)
            pts[3, 0] = np.nan
            write_pcd(root / side / "velodyne" / f"{fid}.pcd", pts, data="binary", fourth="intensity")
    _dump(root / "cooperative/data_info.json", info)
    return root


def test_calibration_composition(tmp_path):
    frame = DairV2XReader(make_dair(tmp_path))[0]
    veh, inf = frame.agents
    assert (veh.agent_id, inf.agent_id) == (0, -1) and inf.is_rsu
    assert (veh.agent_type, inf.agent_type) == ("m1", "m1")
    np.testing.assert_allclose(veh.T_world_from_lidar, T_of(*N2W) @ T_of(*L2N), atol=1e-12)
    expected_inf = T_of(V2W[0], np.add(V2W[1], [0.5, -0.25, 0.0]))
    np.testing.assert_allclose(inf.T_world_from_lidar, expected_inf, atol=1e-12)
    assert frame.timestamp == "000010" and inf.meta["frame_id"] == "001000"


def test_points_intensity_and_nan(tmp_path):
    frame = DairV2XReader(make_dair(tmp_path), vehicle_type="m2", infra_type="m3")[0]
    veh = frame.agents[0]
    assert veh.lidar.shape == (49, 4) and veh.lidar.dtype == np.float32
    raw_max = veh.lidar[:, 3].max() * 256
    assert veh.lidar[:, 3].max() < 1.0 and np.allclose(raw_max, np.round(raw_max))
    assert [a.agent_type for a in frame.agents] == ["m2", "m3"]


def test_label_conversion(tmp_path):
    frame = DairV2XReader(make_dair(tmp_path))[0]
    assert sorted(o.obj_type for o in frame.objects.values()) == ["Car", "Truck", "Van"]
    assert sorted(frame.objects) == [0, 2, 3]  # ids are positions in the label file
    car = frame.objects[0]
    np.testing.assert_allclose(car.location, BOXES["Car"][:3], atol=1e-9)
    np.testing.assert_allclose(car.center, 0)
    np.testing.assert_allclose(car.extent, np.array(BOXES["Car"][3:6]) / 2, atol=1e-9)
    np.testing.assert_allclose(car.angle, [0, np.degrees(0.3), 0], atol=1e-9)
    corners = object_corners_world(car.location, car.center, car.angle, car.extent)
    np.testing.assert_allclose(corners, boxes_to_corners(np.array([BOXES["Car"]]))[0], atol=1e-9)
    # boxes in the vehicle LiDAR frame
    veh = frame.agents[0]
    gt = frame_ground_truth(frame, veh.T_world_from_lidar)
    T = invert_transform(veh.T_world_from_lidar)
    truck = np.array(BOXES["Truck"])
    np.testing.assert_allclose(gt.boxes[2, :3], (T @ np.append(truck[:3], 1))[:3], atol=1e-4)
    np.testing.assert_allclose(gt.boxes[2, 3:6], truck[3:6], atol=1e-4)
    yaw = np.arctan2(np.sin(truck[6] - np.radians(40)), np.cos(truck[6] - np.radians(40)))
    np.testing.assert_allclose(gt.boxes[2, 6], yaw, atol=1e-5)
    assert veh.visible_ids == [0, 2, 3] == frame.agents[1].visible_ids


def test_corner_order_fallback():
    box = np.array([3.0, 4.0, 1.0, 4.0, 1.8, 1.5, 0.7])
    corners = boxes_to_corners(box[None])[0]
    shuffled = corners[[5, 2, 7, 0, 3, 6, 1, 4]]
    lab = corners_to_label(shuffled, 1, "Car", "f.json", "[1]")
    np.testing.assert_allclose(lab.location, box[:3], atol=1e-9)
    np.testing.assert_allclose(lab.extent * 2, box[3:6], atol=1e-9)
    assert np.isclose(np.sin(np.radians(lab.angle[1]) - box[6]), 0, atol=1e-9)  # yaw modulo pi
    with pytest.raises(DataFormatError, match=r"f\.json \[\[1\]\]: world_8_points must be 8 x 3"):
        corners_to_label(corners[:7], 1, "Car", "f.json", "[1]")


def test_split_ids(tmp_path, caplog):
    root = make_dair(tmp_path)
    assert len(DairV2XReader(root)) == 2
    r = DairV2XReader(root, split_ids=["000011"])
    assert len(r) == 1 and r[0].timestamp == "000011" and r.samples == [("cooperative", "000011")]
    split = tmp_path / "val.json"
    split.write_text(json.dumps(["000010", "999999"]))
    with caplog.at_level(logging.WARNING):
        r = get_reader("dairv2x", root, str(split))
    assert len(r) == 1 and r.split == "val" and "1 split ids are not in" in caplog.text
    with pytest.raises(DataFormatError, match="no cooperative pairs selected"):
        DairV2XReader(root, split_ids=["424242"])


def test_bad_files(tmp_path, caplog):
    root = make_dair(tmp_path)
    calib = root / "vehicle-side/calib/novatel_to_world/000010.json"
    calib.write_text(json.dumps({"translation": [[0], [0], [0]]}))
    with pytest.raises(DataFormatError) as ei:
        DairV2XReader(root)[0]
    assert str(calib) in str(ei.value) and "[rotation]" in str(ei.value)
    lab = root / "cooperative/label_world/000011.json"
    lab.write_text(json.dumps([{"type": "Car"}]))
    with pytest.raises(DataFormatError, match=r"000011\.json \[\[0\]\.world_8_points\]: missing key"):
        DairV2XReader(root)[1]
    reader = DairV2XReader(root, skip_bad=True)
    with caplog.at_level(logging.WARNING):
        assert list(reader) == []
    assert reader.skipped == 2 and "000010.json" in caplog.text
    (root / "cooperative/data_info.json").write_text("[{\"vehicle_pointcloud_path\": 3,")
    with pytest.raises(DataFormatError, match=r"data_info\.json: not valid JSON"):
        DairV2XReader(root)
    with pytest.raises(DataFormatError, match="does not exist"):
        DairV2XReader(tmp_path / "nowhere")
