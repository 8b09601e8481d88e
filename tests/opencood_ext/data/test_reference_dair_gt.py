"""DAIR-V2X ground truth under protocol: reference: each side's own labels (vehicle-side/label/lidar,
infrastructure-side/label/virtuallidar), the ego's all, an infrastructure box only when it overlaps no
ego box by a BEV IoU above 0.05; checked against a restatement of GenComm's dairv2x branch
(``load_single_objects_dairv2x_hetero`` then the IoU merge) on a hand-built DAIR folder."""
import json
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.formats import DairV2XReader
from opencood_ext.data.formats.dairv2x import INFRA_LABEL_ID0
from opencood_ext.geometry import invert_transform

from test_dairv2x_reader import make_dair

RANGE = (-102.4, -51.2, -3.5, 102.4, 51.2, 1.5)
A = [105.0, 203.0, 5.8, 4.5, 1.9, 1.6, 0.3]


def _along(box, d):
    """``box`` moved ``d`` metres along its heading."""
    b = list(box)
    b[0] += d * np.cos(box[6])
    b[1] += d * np.sin(box[6])
    return b


# world boxes [x, y, z, l, w, h, yaw] and types, per side
VEHICLE = [("Car", A), ("Van", [95.0, 210.0, 6.0, 5.0, 2.0, 2.1, -1.2]),
           ("Car", [100.0, 195.0, 8.0, 4.0, 1.8, 1.6, 0.0]),  # top 2.3 m above the LiDAR: inside z + 1 only
           ("Pedestrian", [101.0, 199.0, 5.5, 0.6, 0.6, 1.7, 0.0])]
INFRA = [("Car", [105.3, 203.1, 5.8, 4.4, 1.9, 1.6, 0.35]),  # A again: dropped
         ("Truck", [120.0, 190.0, 6.5, 9.0, 2.6, 3.2, 2.5]),  # infrastructure only: kept
         ("Car", _along(A, 4.3)),  # IoU with A about 0.02: kept
         ("Car", _along(A, -3.9)),  # IoU with A about 0.07: dropped
         ("Car", [110.0, 200.0, 5.8, 4.0, 0.0, 1.5, 0.0]),  # zero width: skipped
         ("Bus", [300.0, 203.0, 5.8, 9.0, 2.5, 3.0, 0.0])]  # out of range


def _side_entry(t, box, T_world_from_lidar, as_strings=False):
    T = invert_transform(T_world_from_lidar)
    c = T[:3, :3] @ np.asarray(box[:3]) + T[:3, 3]
    yaw = box[6] - np.arctan2(T_world_from_lidar[1, 0], T_world_from_lidar[0, 0])
    loc = {k: (str(v) if as_strings else float(v)) for k, v in zip("xyz", c)}
    return {"type": t, "3d_location": loc, "3d_dimensions": {"l": box[3], "w": box[4], "h": box[5]},
            "rotation": float(yaw)}


def _write_sides(root):
    frame = DairV2XReader(root)[0]  # the poses, from the calibration make_dair wrote
    veh, inf = frame.agents
    (root / "vehicle-side/label/lidar").mkdir(parents=True)
    (root / "infrastructure-side/label/virtuallidar").mkdir(parents=True)
    (root / "vehicle-side/label/lidar/000010.json").write_text(json.dumps(
        [_side_entry(t, b, veh.T_world_from_lidar) for t, b in VEHICLE]))
    (root / "infrastructure-side/label/virtuallidar/001000.json").write_text(json.dumps(
        [_side_entry(t, b, inf.T_world_from_lidar, as_strings=True) for t, b in INFRA]))
    return veh.T_world_from_lidar, inf.T_world_from_lidar


def _corners(b):
    """(8, 3) corners of an [x, y, z, l, w, h, yaw] box, bottom face first."""
    x, y, z, l, w, h, yaw = b
    dx, dy = np.array([1, 1, -1, -1]) * l / 2, np.array([1, -1, -1, 1]) * w / 2
    c, s = np.cos(yaw), np.sin(yaw)
    xy = np.c_[x + c * dx - s * dy, y + s * dx + c * dy]
    return np.r_[np.c_[xy, np.full(4, z - h / 2)], np.c_[xy, np.full(4, z + h / 2)]]


def _clip(poly, a, b):
    """The part of convex polygon ``poly`` left of the directed edge a -> b (Sutherland-Hodgman)."""
    out = []
    side = lambda p: (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])  # noqa: E731
    for p, q in zip(poly, poly[1:] + poly[:1]):
        sp, sq = side(p), side(q)
        if sp >= 0:
            out.append(p)
        if sp * sq < 0:
            t = sp / (sp - sq)
            out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
    return out


def _area(poly):
    return 0.5 * abs(sum(p[0] * q[1] - q[0] * p[1] for p, q in zip(poly, poly[1:] + poly[:1]))) if poly else 0.0


def _iou(ca, cb):
    pa, pb = [tuple(p) for p in ca[:4, :2]], [tuple(p) for p in cb[:4, :2]]
    ccw = lambda p: p if sum(a[0] * b[1] - b[0] * a[1] for a, b in zip(p, p[1:] + p[:1])) > 0 else p[::-1]  # noqa
    pa, pb = ccw(pa), ccw(pb)
    inter = pa
    for a, b in zip(pb, pb[1:] + pb[:1]):
        inter = _clip(inter, a, b)
        if not inter:
            break
    i = _area(inter)
    return i / (_area(pa) + _area(pb) - i)


def _corner_to_center(c):
    """GenComm box_utils.corner_to_center restated for one (8, 3) corner set: centre from corners
    0, 3, 5, 6; l, w from x-y edge lengths; h from the z spans; yaw the mean of four edge headings."""
    d = lambda i, j: np.hypot(*(c[i, :2] - c[j, :2]))  # noqa: E731
    a = lambda i, j: np.arctan2(c[i, 1] - c[j, 1], c[i, 0] - c[j, 0])  # noqa: E731
    return np.r_[c[[0, 3, 5, 6]].mean(0), (d(0, 3) + d(2, 1) + d(4, 7) + d(5, 6)) / 4,
                 (d(0, 1) + d(2, 3) + d(4, 5) + d(6, 7)) / 4, abs((c[4:, 2] - c[:4, 2]).mean()),
                 (a(1, 2) + a(0, 3) + a(5, 6) + a(4, 7)) / 4]


def _reference_gt(T_ego, T_inf):
    """GenComm: each side's labels as corners projected to the ego and fitted back to a box, kept when
    the box's 8 corners lie inside the range with z widened by 1 m, vehicle classes; then the ego's
    boxes plus the infrastructure's that overlap none by more than 0.05. -> list of (side, k, box)."""
    lo, hi = np.array(RANGE[:3]) - [0, 0, 1], np.array(RANGE[3:]) + [0, 0, 1]
    sides = []
    for labels, T_side in ((VEHICLE, T_ego), (INFRA, T_inf)):
        T_ego_side = invert_transform(T_ego) @ T_side
        kept = []
        for k, (t, b) in enumerate(labels):
            e = _side_entry(t, b, T_side)
            box = [*(float(e["3d_location"][a]) for a in "xyz"), b[3], b[4], b[5], e["rotation"]]
            if min(box[3:6]) == 0 or t not in ("Car", "Van", "Truck", "Bus"):
                continue
            fit = _corner_to_center(_corners(box) @ T_ego_side[:3, :3].T + T_ego_side[:3, 3])
            c = _corners(fit)
            if ((c >= lo) & (c <= hi)).all():
                kept.append((k, fit))
        sides.append(kept)
    ego, inf = sides
    return ([(0, k, b) for k, b in ego] +
            [(1, k, b) for k, b in inf if all(_iou(_corners(b), _corners(e)) <= 0.05 for _, e in ego)])


def _tilt(root, deg):
    """Tilt the infrastructure's virtual LiDAR by ``deg`` about its x axis (its calibration file)."""
    if not deg:
        return
    path = root / "infrastructure-side/calib/virtuallidar_to_world/001000.json"
    d = json.loads(path.read_text())
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    d["rotation"] = (np.asarray(d["rotation"]) @ np.array([[1, 0, 0], [0, c, -s], [0, s, c]])).tolist()
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("tilt", [0.0, 2.0])
def test_reference_ground_truth_merges_the_sides(tmp_path, tilt):
    root = make_dair(tmp_path)
    _tilt(root, tilt)
    T_veh, T_inf = _write_sides(root)
    frame = DairV2XReader(root, labels="sides")[0]
    assert frame.side_labels
    cfg = DataConfig(format="dairv2x", lidar_range=RANGE, agent_types={"m1": AgentTypeData()})
    sample = CooperativeDataset([frame], cfg, {"m1": (0.4, 0.4, 5.0)}, train=False, protocol="reference")[0]
    assert sample.ego_id == 0
    expected = _reference_gt(T_veh, T_inf)
    assert sample.gt_ids.tolist() == [k + side * INFRA_LABEL_ID0 for side, k, _ in expected]
    np.testing.assert_allclose(sample.gt_boxes, np.stack([b for _, _, b in expected]), atol=1e-4)
    if tilt:  # the fit measures lengths in x-y: a tilted box is shorter than its labelled size
        truck = sample.gt_boxes[sample.gt_ids.tolist().index(INFRA_LABEL_ID0 + 1)]
        assert truck[3] < INFRA[1][1][3] - 1e-4 or truck[4] < INFRA[1][1][4] - 1e-4
        return
    # A, the van, the high car; the truck, the barely touching car
    assert sample.gt_ids.tolist() == [0, 1, 2, INFRA_LABEL_ID0 + 1, INFRA_LABEL_ID0 + 2]
    # the two borderline infrastructure boxes sit on either side of the 0.05 threshold
    a = _corners(sample.gt_boxes[0].astype(np.float64))
    inf_local = invert_transform(T_veh) @ T_inf
    for (_, b), lo, hi in ((INFRA[2], 0.0, 0.05), (INFRA[3], 0.05, 0.2)):
        e = _side_entry("Car", b, T_inf)
        box = [*(float(e["3d_location"][k]) for k in "xyz"), *b[3:6], e["rotation"]]
        c = _corners(box) @ inf_local[:3, :3].T + inf_local[:3, 3]
        assert lo < _iou(c, a) <= hi


def test_side_labels_reader(tmp_path):
    root = make_dair(tmp_path)
    T_veh, T_inf = _write_sides(root)
    frame = DairV2XReader(root, labels="sides")[0]
    veh, inf = frame.agents
    assert veh.visible_ids == [0, 1, 2] and inf.visible_ids == [INFRA_LABEL_ID0 + k for k in (0, 1, 2, 3, 5)]
    car = frame.objects[0]  # A, read back in the world
    np.testing.assert_allclose(car.location, A[:3], atol=1e-9)
    np.testing.assert_allclose(car.extent * 2, A[3:6], atol=1e-12)
    np.testing.assert_allclose(car.angle, [0.0, np.degrees(A[6]), 0.0], atol=1e-9)
    cooperative = DairV2XReader(root)[0]
    assert not cooperative.side_labels and cooperative.agents[0].visible_ids == cooperative.agents[1].visible_ids


def test_side_labels_errors(tmp_path):
    root = make_dair(tmp_path)
    _write_sides(root)
    with pytest.raises(ValueError, match="labels must be one of"):
        DairV2XReader(root, labels="world")
    path = root / "infrastructure-side/label/virtuallidar/001000.json"
    items = json.loads(path.read_text())
    del items[1]["rotation"]
    path.write_text(json.dumps(items))
    with pytest.raises(DataFormatError, match=r"001000\.json.*\[1\]\.rotation"):
        DairV2XReader(root, labels="sides")[0]
    items[1]["rotation"] = "north"
    path.write_text(json.dumps(items))
    with pytest.raises(DataFormatError, match=r"001000\.json.*\[1\]\.rotation.*expected a number"):
        DairV2XReader(root, labels="sides")[0]


def test_build_dataset_reads_the_sides_under_reference_only(tmp_path):
    from opencood_ext.experiment import build_dataset, load_experiment

    root = make_dair(tmp_path / "dair")
    _write_sides(root)
    split = tmp_path / "val.json"
    split.write_text(json.dumps(["000010"]))
    config = Path(__file__).resolve().parents[3] / "configs" / "dairv2x" / "m1_none.yaml"
    sets = [f"data.root={root}", f"data.test_split={split}"]
    ref = build_dataset(load_experiment(config, sets), str(split), train=False)
    assert ref.protocol == "reference" and ref.reader.labels == "sides" and ref.read_frame(0).side_labels
    native = build_dataset(load_experiment(config, sets + ["protocol=native"]), str(split), train=False)
    assert native.reader.labels == "cooperative" and not native.read_frame(0).side_labels
