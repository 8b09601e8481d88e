"""Pose/box math against CARLA and hand cases; rotated IoU and NMS against an
independent plain-Python polygon clipper and hand-computed areas."""
import math

import numpy as np
import pytest
import torch

from opencood_ext.data.frame import ObjectLabel
from opencood_ext.geometry import (bev_corners, bev_iou, bev_iou_aligned, boxes_inside_range, boxes_to_corners,
                                   corners_to_boxes, invert_transform, matrix_to_pose,
                                   objects_to_boxes, points_in_boxes, pose_to_matrix,
                                   relative_transform, rotated_nms, transform_points)


def _random_poses(rng, n):
    return np.column_stack([rng.uniform(-500, 500, (n, 3)), rng.uniform(-180, 180, n),
                            rng.uniform(-180, 180, n), rng.uniform(-89, 89, n)])


# ---------------------------------------------------------------- poses

def test_pose_to_matrix_matches_carla():
    carla = pytest.importorskip(
        "carla", reason="carla client package not installed (pip install -e .[test])")
    rng = np.random.default_rng(0)
    poses = _random_poses(rng, 1000)
    ours = pose_to_matrix(poses)
    for pose, T in zip(poses, ours):
        x, y, z, roll, yaw, pitch = (float(v) for v in pose)
        tf = carla.Transform(carla.Location(x=x, y=y, z=z),
                             carla.Rotation(pitch=pitch, yaw=yaw, roll=roll))
        ref = np.array(tf.get_matrix())
        # CARLA computes in float32: rotation to ~1e-6, translation to float32 resolution.
        np.testing.assert_allclose(T[:3, :3], ref[:3, :3], atol=2e-6)
        np.testing.assert_allclose(T[:3, 3], ref[:3, 3], rtol=1e-6, atol=1e-4)
        np.testing.assert_array_equal(ref[3], [0, 0, 0, 1])
        np.testing.assert_array_equal(T[3], [0, 0, 0, 1])


def test_matrix_to_pose_round_trip():
    rng = np.random.default_rng(1)
    poses = _random_poses(rng, 200)
    back = matrix_to_pose(pose_to_matrix(poses))
    np.testing.assert_allclose(back[:, :3], poses[:, :3], atol=1e-9)
    ang = (back[:, 3:] - poses[:, 3:] + 180.0) % 360.0 - 180.0
    np.testing.assert_allclose(ang, 0.0, atol=1e-7)
    T = pose_to_matrix(poses)
    np.testing.assert_allclose(pose_to_matrix(matrix_to_pose(T)), T, atol=1e-12)


def test_invert_and_relative_transform():
    rng = np.random.default_rng(2)
    Ta, Tb = pose_to_matrix(_random_poses(rng, 2))
    np.testing.assert_allclose(invert_transform(Ta) @ Ta, np.eye(4), atol=1e-12)
    np.testing.assert_allclose(invert_transform(Ta), np.linalg.inv(Ta), atol=1e-10)
    T_a_from_b = relative_transform(Ta, Tb)
    np.testing.assert_allclose(T_a_from_b, np.linalg.inv(Ta) @ Tb, atol=1e-10)
    pts = np.column_stack([rng.normal(size=(5, 3)) * 20, np.arange(5)]).astype(np.float64)
    via_world = transform_points(invert_transform(Ta), transform_points(Tb, pts))
    np.testing.assert_allclose(transform_points(T_a_from_b, pts), via_world, atol=1e-9)
    np.testing.assert_array_equal(transform_points(T_a_from_b, pts)[:, 3], np.arange(5))


def test_yaw_90_turns_x_towards_y():
    T = pose_to_matrix([0, 0, 0, 0, 90, 0])
    np.testing.assert_allclose(T[:3, :3] @ [1, 0, 0], [0, 1, 0], atol=1e-12)


# ---------------------------------------------------------------- boxes

def test_boxes_corners_round_trip():
    rng = np.random.default_rng(3)
    boxes = np.column_stack([rng.uniform(-50, 50, (50, 3)), rng.uniform(0.5, 6, (50, 3)),
                             rng.uniform(-np.pi, np.pi, 50)])
    back = corners_to_boxes(boxes_to_corners(boxes))
    np.testing.assert_allclose(back[:, :6], boxes[:, :6], atol=1e-9)
    dyaw = (back[:, 6] - boxes[:, 6] + np.pi) % (2 * np.pi) - np.pi
    np.testing.assert_allclose(dyaw, 0.0, atol=1e-9)


def test_objects_to_boxes_center_offset_in_world_axes():
    # Yaw 90 deg: the centre offset (1, 0, 0.5) is added in WORLD axes (not rotated),
    # extents are half sizes, so the box is 4 x 2 x 1.6 at (11, 5, 0.5), yaw pi/2.
    obj = ObjectLabel(object_id=7, location=[10, 5, 0], center=[1, 0, 0.5], angle=[0, 90, 0],
                      extent=[2, 1, 0.8])
    box = objects_to_boxes([obj], np.eye(4))[0]
    np.testing.assert_allclose(box[:6], [11, 5, 0.5, 4, 2, 1.6], atol=1e-9)
    assert abs(math.remainder(box[6] - math.pi / 2, 2 * math.pi)) < 1e-9
    # Same object seen from a sensor at world (11, 0, 0) facing +y (yaw 90):
    # the object is 5 m straight ahead and points along the sensor's x axis.
    T_sensor_from_world = invert_transform(pose_to_matrix([11, 0, 0, 0, 90, 0]))
    box = objects_to_boxes([obj], T_sensor_from_world)[0]
    np.testing.assert_allclose(box[:6], [5, 0, 0.5, 4, 2, 1.6], atol=1e-9)
    assert abs(math.remainder(box[6], 2 * math.pi)) < 1e-9
    assert objects_to_boxes([], np.eye(4)).shape == (0, 7)


def test_points_in_boxes():
    boxes = np.array([[0, 0, 0, 4, 2, 2, 0], [10, 0, 0, 4, 2, 2, np.pi / 2]])
    pts = np.array([[1.9, 0.9, 0.9], [2.1, 0, 0], [0, 1.1, 0], [10, 1.9, 0], [11.5, 0, 0],
                    [0, 0, 1.1]])
    expect = np.array([[1, 0], [0, 0], [0, 0], [0, 1], [0, 0], [0, 0]], dtype=bool)
    np.testing.assert_array_equal(points_in_boxes(pts, boxes), expect)
    assert points_in_boxes(np.zeros((0, 3)), boxes).shape == (0, 2)



def test_boxes_inside_range_corners_z_and_inclusive_bounds():
    """The field's rule (OpenCOOD/HEAL mask_boxes_outside_range_numpy): all 8 corners inside,
    bounds inclusive, z checked too; the centre alone decides nothing."""
    r = [-10.0, -5.0, -3.0, 10.0, 5.0, 1.0]
    boxes = np.array([
        [0, 0, -1, 4, 2, 1.5, 0],            # well inside
        [9.0, 0, -1, 4, 2, 1.5, 0],          # centre inside, front corners at x = 11
        [0, 0, 0.5, 4, 2, 1.5, 0],           # centre inside, roof at z = 1.25
        [8.0, 4.0, -2.25, 4, 2, 1.5, 0],     # touches x = 10, y = 5 and z = -3 exactly: kept
        [0, 4.5, -1, 4, 2, 1.5, np.pi / 2],  # turned 90 deg: its length now runs along y, out at 6.5
        [13.0, 0, -1, 4, 2, 1.5, 0],         # centre outside, back corners at x = 11
    ])
    np.testing.assert_array_equal(boxes_inside_range(boxes, r), [True, False, False, True, False, False])
    # min_corners: 4 of the 8 corners of box 1 (the back face) are inside
    np.testing.assert_array_equal(boxes_inside_range(boxes, r, min_corners=4)[:3], [True, True, True])
    assert not boxes_inside_range(boxes, r, min_corners=1)[5]
    assert boxes_inside_range(torch.tensor(boxes, dtype=torch.float32), r).tolist() == \
        [True, False, False, True, False, False]
    assert boxes_inside_range(np.zeros((0, 7)), r).shape == (0,)
    with pytest.raises(ValueError, match="min_corners"):
        boxes_inside_range(boxes, r, min_corners=9)
    with pytest.raises(ValueError, match="max > min"):
        boxes_inside_range(boxes, [1, 1, 1, 0, 0, 0])


# ---------------------------------------------------------------- rotated IoU

def _ref_corners(box):
    x, y, l, w, yaw = box
    c, s = math.cos(yaw), math.sin(yaw)
    return [(x + c * u - s * v, y + s * u + c * v)
            for u, v in ((l / 2, w / 2), (-l / 2, w / 2), (-l / 2, -w / 2), (l / 2, -w / 2))]


def _ref_area(poly):
    return abs(sum(p[0] * q[1] - q[0] * p[1] for p, q in zip(poly, poly[1:] + poly[:1]))) / 2


def _ref_iou(a, b):
    """Independent reference: clip a's polygon by each edge line of b, in world coordinates."""
    subject, clip = _ref_corners(a), _ref_corners(b)  # both counter-clockwise
    for (ex, ey), (fx, fy) in zip(clip, clip[1:] + clip[:1]):
        side = [(fx - ex) * (py - ey) - (fy - ey) * (px - ex) for px, py in subject]
        out = []
        for i, p in enumerate(subject):
            j = (i + 1) % len(subject)
            if side[i] >= 0:
                out.append(p)
            if (side[i] >= 0) != (side[j] >= 0):
                t = side[i] / (side[i] - side[j])
                q = subject[j]
                out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
        subject = out
        if not subject:
            return 0.0
    inter = _ref_area(subject)
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union if union > 0 else 0.0


def _random_bev(rng, n, spread=4.0):
    return np.column_stack([rng.uniform(-spread, spread, (n, 2)), rng.uniform(0.3, 5, (n, 2)),
                            rng.uniform(-np.pi, np.pi, n)])


def test_iou_hand_cases():
    sq = [0, 0, 0, 2, 2, 1, 0]
    cases = [
        (sq, sq, 1.0),                                   # identical
        (sq, [5, 0, 0, 2, 2, 1, 0], 0.0),                # disjoint
        (sq, [2, 0, 0, 2, 2, 1, 0], 0.0),                # touching edges
        (sq, [2, 2, 0, 2, 2, 1, 0], 0.0),                # touching corners
        (sq, [0, 0, 5, 1, 1, 1, 0.3], 0.25),             # contained (z ignored), area 1/4
        (sq, [1, 0, 0, 2, 2, 1, 0], 2 / 6),              # half overlap: 2 / (4 + 4 - 2)
        (sq, [0, 0, 0, 2, 2, 1, np.pi / 2], 1.0),        # square turned 90 deg
        (sq, [0, 0, 0, 2, 2, 1, np.pi], 1.0),
        ([0, 0, 0, 4, 2, 1, 0], [0, 0, 0, 4, 2, 1, np.pi / 2], 4 / 12),  # cross: 2x2 / (8+8-4)
    ]
    # 45-degree square vs axis-aligned square, both side 2, same centre: a regular
    # octagon with apothem 1, area 8 * tan(pi/8) = 8 (sqrt 2 - 1).
    octagon = 8 * (math.sqrt(2) - 1)
    cases.append((sq, [0, 0, 0, 2, 2, 1, np.pi / 4], octagon / (8 - octagon)))
    a = np.array([c[0] for c in cases], dtype=np.float64)
    b = np.array([c[1] for c in cases], dtype=np.float64)
    expect = np.array([c[2] for c in cases])
    np.testing.assert_allclose(bev_iou_aligned(a, b), expect, atol=1e-12)
    np.testing.assert_allclose(np.diag(bev_iou(a, b)), expect, atol=1e-12)
    np.testing.assert_allclose(bev_iou_aligned(a.astype(np.float32), b.astype(np.float32)),
                               expect, atol=1e-6)
    assert abs(octagon / (8 - octagon) - 1 / math.sqrt(2)) < 1e-12


def test_iou_matches_reference_on_random_boxes():
    rng = np.random.default_rng(4)
    a, b = _random_bev(rng, 40), _random_bev(rng, 30)
    ref = np.array([[_ref_iou(p, q) for q in b] for p in a])
    assert (ref > 0.05).sum() > 100  # the case is not mostly disjoint
    got = bev_iou(a, b)
    np.testing.assert_allclose(got, ref, atol=1e-10)
    np.testing.assert_allclose(bev_iou(b, a), ref.T, atol=1e-10)  # symmetry
    # float32 torch gives the same to float32 accuracy; chunking changes nothing
    t32 = bev_iou(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32))
    assert isinstance(t32, torch.Tensor) and t32.dtype == torch.float32
    np.testing.assert_allclose(t32.numpy(), ref, atol=2e-5)
    np.testing.assert_array_equal(bev_iou(a, b, chunk_pairs=7), got)


def test_iou_near_degenerate_configurations():
    """Shared edges, near-identical boxes, tiny rotations, far from the origin, float32."""
    rng = np.random.default_rng(5)
    base = _random_bev(rng, 60, spread=2.0)
    base[:, :2] += 1000.0  # far from the origin
    other = base.copy()
    kind = np.arange(60) % 4
    other[kind == 0, 4] += rng.normal(0, 1e-6, (kind == 0).sum())     # nearly identical
    other[kind == 1, 4] += np.pi                                       # reversed heading
    heading = np.column_stack([np.cos(base[:, 4]), np.sin(base[:, 4])])
    k2, k3 = kind == 2, kind == 3
    other[k2, :2] += base[k2, 2:3] * heading[k2]                       # edge to edge
    other[k3, 2] = base[k3, 2] / 2                                     # front half: shares 3 edges
    other[k3, :2] += 0.25 * base[k3, 2:3] * heading[k3]
    ref = np.array([_ref_iou(p, q) for p, q in zip(base, other)])
    np.testing.assert_allclose(ref, np.select([kind < 2, kind == 2], [1.0, 0.0], 0.5), atol=1e-5)
    for dtype, tol in ((np.float64, 1e-7), (np.float32, 2e-4)):
        got = bev_iou_aligned(base.astype(dtype), other.astype(dtype))
        assert np.all((got >= 0) & (got <= 1))
        np.testing.assert_allclose(got, ref, atol=tol)
        np.testing.assert_allclose(np.diag(bev_iou(base.astype(dtype), base.astype(dtype))), 1.0,
                                   atol=tol)


def test_iou_against_grid_sampling():
    """A second, cruder reference: area by counting grid points inside both boxes."""
    a = np.array([0.3, -0.2, 4.0, 1.8, 0.4])
    b = np.array([1.1, 0.5, 3.5, 2.0, -0.9])
    g = np.linspace(-4, 4, 1001)
    X, Y = np.meshgrid(g, g)
    pts = np.column_stack([X.ravel(), Y.ravel(), np.zeros(X.size)])
    boxes7 = np.array([[*box[:2], 0, *box[2:4], 1, box[4]] for box in (a, b)])
    inside = points_in_boxes(pts, boxes7)
    cell = (g[1] - g[0]) ** 2
    inter = (inside[:, 0] & inside[:, 1]).sum() * cell
    iou_grid = inter / (a[2] * a[3] + b[2] * b[3] - inter)
    assert abs(bev_iou(a[None], b[None])[0, 0] - iou_grid) < 1e-3


def test_iou_shapes_types_and_errors():
    a7 = np.array([[0, 0, 0, 2, 2, 1, 0.2], [1, 0, 0, 2, 1, 1, 0.0]])
    a5 = a7[:, [0, 1, 3, 4, 6]]
    np.testing.assert_array_equal(bev_iou(a7, a7), bev_iou(a5, a5))
    assert bev_iou(np.zeros((0, 7)), a7).shape == (0, 2)
    assert bev_iou(a7, np.zeros((0, 7))).shape == (2, 0)
    assert bev_iou_aligned(np.zeros((0, 7)), np.zeros((0, 7))).shape == (0,)
    t = bev_iou(torch.as_tensor(a7), torch.as_tensor(a7))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64
    np.testing.assert_array_equal(t.numpy(), bev_iou(a7, a7))
    # zero-size boxes: IoU 0, never nan
    z = np.array([[0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 2, 0, 1, 0]])
    assert np.all(bev_iou(z, np.vstack([z, a7])) == 0)
    with pytest.raises(ValueError, match="boxes_a"):
        bev_iou(np.zeros((3, 6)), a7)
    with pytest.raises(ValueError, match="NaN"):
        bev_iou(a7, np.full((1, 7), np.nan))
    with pytest.raises(ValueError, match=">= 0"):
        bev_iou(np.array([[0, 0, 0, -1, 1, 1, 0]]), a7)
    with pytest.raises(ValueError, match="as many"):
        bev_iou_aligned(a7, a7[:1])


def test_bev_corners_matches_boxes_to_corners():
    rng = np.random.default_rng(6)
    boxes = np.column_stack([rng.normal(size=(5, 3)), rng.uniform(1, 4, (5, 3)),
                             rng.normal(size=5)])
    np.testing.assert_allclose(bev_corners(boxes), boxes_to_corners(boxes)[:, :4, :2], atol=1e-12)
    assert bev_corners(torch.as_tensor(boxes)).shape == (5, 4, 2)


# ---------------------------------------------------------------- NMS

def _greedy_reference(boxes, scores, thr):
    iou = np.array([[_ref_iou(p, q) for q in boxes] for p in boxes])
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    keep = []
    for i in order:
        if all(iou[i, k] <= thr for k in keep):
            keep.append(i)
    return keep


def test_nms_hand_cases():
    boxes = torch.tensor([[0, 0, 0, 4, 2, 1, 0], [0.5, 0, 0, 4, 2, 1, 0],   # IoU 3.5*2 / 9 = 0.778
                          [10, 0, 0, 4, 2, 1, 0], [1, 0, 0, 4, 2, 1, 0]], dtype=torch.float64)
    scores = torch.tensor([0.5, 0.9, 0.8, 0.1])
    keep = rotated_nms(boxes, scores, 0.15)
    assert keep.dtype == torch.long and keep.tolist() == [1, 2]
    assert rotated_nms(boxes, scores, 0.15, max_out=1).tolist() == [1]
    # strictly greater suppresses: IoU(1, 3) = 3.5 / 4.5 = 0.7778; threshold equal keeps both
    iou13 = float(bev_iou(boxes[1:2], boxes[3:4]))
    assert rotated_nms(boxes[[1, 3]], scores[[1, 3]], iou13).tolist() == [0, 1]
    assert rotated_nms(boxes[[1, 3]], scores[[1, 3]], iou13 - 1e-9).tolist() == [0]
    # equal scores keep input order
    assert rotated_nms(boxes[:2], torch.tensor([0.3, 0.3]), 0.5).tolist() == [0]
    assert rotated_nms(np.zeros((0, 7)), np.zeros(0), 0.5).tolist() == []
    with pytest.raises(ValueError, match="scores"):
        rotated_nms(boxes, scores[:2], 0.5)


def test_nms_matches_reference_greedy():
    rng = np.random.default_rng(7)
    boxes = _random_bev(rng, 50, spread=5.0)
    scores = rng.uniform(size=50)
    for thr in (0.0, 0.15, 0.5):
        assert rotated_nms(boxes, scores, thr).tolist() == _greedy_reference(boxes, scores, thr)
    assert rotated_nms(boxes, scores, 0.15, chunk_pairs=13).tolist() == \
        _greedy_reference(boxes, scores, 0.15)


def test_iou_overflow_fallback_keeps_exact_area(monkeypatch):
    """Pairs whose clipped polygon outgrows the vertex buffer are recomputed with big
    buffers: shrinking the buffers to 4 vertices forces that path on every octagon-like pair."""
    import opencood_ext.geometry.iou as iou_mod
    rng = np.random.default_rng(8)
    a, b = _random_bev(rng, 20, spread=1.0), _random_bev(rng, 20, spread=1.0)
    ref = np.array([[_ref_iou(p, q) for q in b] for p in a])
    monkeypatch.setattr(iou_mod, "_BUFFER_SIZES", (4, 4, 4, 4))
    calls = []
    real = iou_mod._intersection_in_a_frame
    monkeypatch.setattr(iou_mod, "_intersection_in_a_frame",
                        lambda *args: calls.append(args[-1]) or real(*args))
    np.testing.assert_allclose(bev_iou(a, b), ref, atol=1e-10)
    assert (iou_mod._FALLBACK_VERTICES,) * 4 in calls
