"""protocol: reference post-processing against an independent numpy restatement of the reference
code's order of operations (GenComm / HEAL ``VoxelPostprocessor.post_process`` and
``post_process_v2xreal``), on hand-built head maps; native post-processing unchanged."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from opencood_ext.models.anchors import BoxCoder
from opencood_ext.models.head import HeadOutput
from opencood_ext.postprocess import (REFERENCE_MULTI_CLASS, REFERENCE_ONE_CLASS, decode_detections,
                                      decode_reference)

RANGE = (-102.4, -51.2, -3.0, 102.4, 51.2, 1.0)
H, W, K = 24, 48, 2
THRESHOLD, NMS = 0.2, 0.15


# ----------------------------------------------------------------------------- the restatement
def _limit_period(v, offset, period):
    return v - np.floor(v / period + offset) * period


def _corners_hwl(b):
    """(N, 7) boxes [x, y, z, h, w, l, yaw] (the reference's order) -> (N, 8, 3) corners, bottom face
    first, as the reference's template: (+l/2, -w/2), (+l/2, +w/2), (-l/2, +w/2), (-l/2, -w/2)."""
    t = np.array([[1, -1, -1], [1, 1, -1], [-1, 1, -1], [-1, -1, -1],
                  [1, -1, 1], [1, 1, 1], [-1, 1, 1], [-1, -1, 1]], dtype=np.float64) / 2
    local = t[None] * np.stack([b[:, 5], b[:, 4], b[:, 3]], axis=1)[:, None, :]
    c, s = np.cos(b[:, 6])[:, None], np.sin(b[:, 6])[:, None]
    x = local[..., 0] * c - local[..., 1] * s
    y = local[..., 0] * s + local[..., 1] * c
    return np.stack([x, y, local[..., 2]], axis=-1) + b[:, None, :3]


def _clip(subject, a, b):
    """Sutherland-Hodgman: the part of polygon ``subject`` left of the edge a -> b."""
    def side(p):
        return (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])
    out = []
    for i in range(len(subject)):
        p, q = subject[i], subject[(i + 1) % len(subject)]
        sp, sq = side(p), side(q)
        if sp >= 0:
            out.append(p)
        if (sp >= 0) != (sq >= 0):
            t = sp / (sp - sq)
            out.append(p + t * (q - p))
    return out


def _area(poly):
    if len(poly) < 3:
        return 0.0
    x, y = np.array(poly)[:, 0], np.array(poly)[:, 1]
    return 0.5 * abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def _ccw(quad):
    return quad if _area_signed(quad) > 0 else quad[::-1]


def _area_signed(poly):
    x, y = poly[:, 0], poly[:, 1]
    return 0.5 * (np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def _iou(qa, qb):
    qa, qb = _ccw(qa), _ccw(qb)
    inter = [p for p in qa]
    for i in range(4):
        if not inter:
            break
        inter = _clip(inter, qb[i], qb[(i + 1) % 4])
    i_area = _area(inter)
    union = _area(qa) + _area(qb) - i_area
    return i_area / union if union > 0 else 0.0


def reference_post_process(cls, reg, dirs, anchors, multi_class: bool):
    """What the reference computes for one frame. cls (1, K*C, H, W), reg (1, K*7, H, W) in OUR
    delta order [dx, dy, dz, dl, dw, dh, dyaw], dirs (1, K*2, H, W); anchors (H, W, K, 7) ours.
    -> corners (N, 8, 3), scores (N,), labels (N,)."""
    boxes, score, label = reference_candidates(cls, reg, dirs, anchors, multi_class)
    return reference_merge(_corners_hwl(boxes), score, label, multi_class)


def reference_candidates(cls, reg, dirs, anchors, multi_class: bool):
    """One agent's part (same arguments): threshold, decode, direction. -> boxes (N, 7) in the
    reference's order [x, y, z, h, w, l, yaw], scores (N,), labels (N,), in anchor order."""
    # the reference's box order is x, y, z, h, w, l, yaw: anchors and deltas with l and h swapped
    swap = [0, 1, 2, 5, 4, 3, 6]
    anchors_hwl = anchors.reshape(-1, 7)[:, swap].double()
    deltas = reg.permute(0, 2, 3, 1).reshape(1, -1, 7)[0][:, swap].double()
    ncls = cls.shape[1] // K
    prob = torch.sigmoid(cls.permute(0, 2, 3, 1)).reshape(-1, ncls)  # float32, as the reference
    if multi_class:
        score, label = prob.max(dim=1)
    else:
        score, label = prob[:, 0], torch.zeros(prob.shape[0], dtype=torch.long)
    d = torch.sqrt(anchors_hwl[:, 4] ** 2 + anchors_hwl[:, 5] ** 2)
    boxes = torch.empty_like(deltas)
    boxes[:, 0] = deltas[:, 0] * d + anchors_hwl[:, 0]
    boxes[:, 1] = deltas[:, 1] * d + anchors_hwl[:, 1]
    boxes[:, 2] = deltas[:, 2] * anchors_hwl[:, 3] + anchors_hwl[:, 2]
    boxes[:, 3:6] = torch.exp(deltas[:, 3:6]) * anchors_hwl[:, 3:6]
    boxes[:, 6] = deltas[:, 6] + anchors_hwl[:, 6]
    mask = (score > THRESHOLD).numpy()
    boxes, score, label = boxes.numpy()[mask], score.numpy()[mask], label.numpy()[mask]
    if not multi_class:
        dir_label = dirs.permute(0, 2, 3, 1).reshape(-1, 2).argmax(dim=1).numpy()[mask]
        offset, period = math.pi / 4, math.pi
        rot = _limit_period(boxes[:, 6] - offset, 0, period)
        boxes[:, 6] = _limit_period(rot + offset + period * dir_label, 0.5, 2 * np.pi)
    return boxes, score, label


def reference_merge(corners, score, label, multi_class: bool):
    """The rest, on corners (N, 8, 3) in the ego frame (late fusion: every agent's, projected):
    size and z filters, top 1000, NMS, range mask. -> corners, scores, labels."""
    xs, ys, zs = corners[..., 0], corners[..., 1], corners[..., 2]
    big, zlo, zhi = (100.0, -100.0, 100.0) if multi_class else (6.0, -3.0, 1.0)
    keep = (np.ptp(xs, axis=1) <= big) & (np.ptp(ys, axis=1) <= big) & (np.ptp(ys, axis=1) != 0) \
        & (zs.min(axis=1) >= zlo) & (zs.max(axis=1) <= zhi)
    corners, score, label = corners[keep], score[keep], label[keep]
    ixs = score.argsort()[::-1][:1000]
    quads = corners[:, :4, :2]
    centre = quads.mean(axis=1)
    radius = np.linalg.norm(quads - centre[:, None], axis=2).max(axis=1)
    pick = []
    while len(ixs):
        i = ixs[0]
        pick.append(i)
        rest = ixs[1:]
        # quads whose circumscribed circles do not meet have IoU 0 (only a shortcut in time)
        near = np.linalg.norm(centre[rest] - centre[i], axis=1) < radius[rest] + radius[i]
        ious = np.array([_iou(quads[i], quads[j]) if n else 0.0 for j, n in zip(rest, near)])
        ixs = np.delete(ixs, np.where(ious > NMS)[0] + 1)
        ixs = np.delete(ixs, 0)
    pick = np.array(pick, dtype=np.int64)
    corners, score, label = corners[pick], score[pick], label[pick]
    lo, hi = np.array(RANGE[:3]), np.array(RANGE[3:])
    axes = 2 if multi_class else 3
    inside = ((corners[..., :axes] >= lo[:axes]) & (corners[..., :axes] <= hi[:axes])).all(axis=(1, 2))
    return corners[inside], score[inside], label[inside]


# ----------------------------------------------------------------------------- hand-built maps
def _anchors(sizes):
    """(H, W, K, 7) ours [x, y, z, l, w, h, yaw]: cells 4.68 m apart in x, 4.78 m in y, over a
    slightly larger area than RANGE (boxes at its border), yaw 0 and 90 degrees."""
    xs = np.linspace(-110, 110, W)
    ys = np.linspace(-55, 55, H)
    a = np.zeros((H, W, K, 7), np.float32)
    a[..., 0] = xs[None, :, None]
    a[..., 1] = ys[:, None, None]
    a[..., 2] = -1.0
    for k in range(K):
        a[:, :, k, 3:6] = sizes[k % len(sizes)]
        a[:, :, k, 6] = 0.0 if k % 2 == 0 else math.pi / 2
    return torch.from_numpy(a)


def _maps(seed, ncls=1):
    g = np.random.default_rng(seed)
    # logits on a 0.25 grid: many equal scores (the reference's tie order matters)
    cls = np.round(g.normal(0.3, 1.5, (1, K * ncls, H, W)) / 0.25) * 0.25
    reg = np.zeros((1, K, 7, H, W))
    reg[:, :, :3] = g.normal(0, 0.08, (1, K, 3, H, W))
    reg[:, :, 3:6] = g.normal(0, 0.05, (1, K, 3, H, W))
    reg[:, :, 6] = g.normal(0, 0.3, (1, K, H, W))
    big = g.random((1, K, H, W)) < 0.06
    reg[:, :, 3][big] = math.log(2.2)  # longer than 6 m: the reference drops it
    high = g.random((1, K, H, W)) < 0.06
    reg[:, :, 2][high] = 1.6  # centre about 1.5 m: a corner above z 1
    dirs = g.normal(0, 1, (1, K * 2, H, W))
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))  # noqa: E731
    return t(cls), t(reg.reshape(1, K * 7, H, W)), t(dirs)


def _our_corners(boxes):
    """Our boxes [x, y, z, l, w, h, yaw] through the restatement's corner rule."""
    b = boxes.numpy().astype(np.float64)
    return _corners_hwl(b[:, [0, 1, 2, 5, 4, 3, 6]])


@pytest.mark.parametrize("seed", [0, 1])
def test_one_class_equals_the_reference_restatement(seed):
    anchors = _anchors([(3.9, 1.6, 1.56)])
    cls, reg, dirs = _maps(seed)
    head = HeadOutput(cls=cls, reg=reg, dir=dirs)
    ours = decode_detections(head, anchors, THRESHOLD, NMS, gt_range=RANGE, coder=BoxCoder(),
                             protocol="reference")[0]
    corners, scores, _ = reference_post_process(cls, reg, dirs, anchors, multi_class=False)
    assert len(ours) == len(scores) > 150  # the reference has no cap; native stops at 150
    np.testing.assert_array_equal(ours.scores.numpy(), scores)  # same boxes, same order
    np.testing.assert_allclose(_our_corners(ours.boxes), corners, atol=2e-4)
    assert (ours.labels == 0).all()
    # every rule bites on these maps: more than 1000 candidates pass the threshold, boxes over 6 m
    # and above z 1 among them, ties in score, boxes poking out of the range after NMS
    prob = torch.sigmoid(cls).flatten()
    assert int((prob > THRESHOLD).sum()) > 1000 + 200 and len(torch.unique(prob)) <= 50
    native = decode_detections(head, anchors, THRESHOLD, NMS, gt_range=RANGE, coder=BoxCoder())[0]
    assert len(native) == 150
    assert float(native.boxes[:, 3].max()) > 6.0  # native keeps a long box the reference drops
    assert not ours.boxes[:, 3].gt(6.0).any()


@pytest.mark.parametrize("relaxed", [{"max_extent": 100.0}, {"z_bounds": (-100.0, 100.0)}, {"top_k": 10 ** 9},
                                     "no range"])
def test_each_reference_rule_changes_the_result(relaxed):
    """Without any one of the reference's rules our result differs on these maps, so the equality
    above could not hold with that rule missing or wrong on our side. (The range mask's z test
    adds nothing to the z filter's -3..1 here; the multi-class test covers its x-y-only form.)"""
    anchors = _anchors([(3.9, 1.6, 1.56)])
    cls, reg, dirs = _maps(0)
    head = HeadOutput(cls=cls, reg=reg, dir=dirs)
    ours = decode_reference(head, anchors, THRESHOLD, NMS, RANGE, BoxCoder(), REFERENCE_ONE_CLASS)[0]
    if relaxed == "no range":
        other = decode_reference(head, anchors, THRESHOLD, NMS, None, BoxCoder(), REFERENCE_ONE_CLASS)[0]
    else:
        rules = dataclasses.replace(REFERENCE_ONE_CLASS, **relaxed)
        other = decode_reference(head, anchors, THRESHOLD, NMS, RANGE, BoxCoder(), rules)[0]
    assert len(other) != len(ours) or not torch.equal(other.scores, ours.scores)


def test_multi_class_equals_the_reference_restatement():
    """V2X-Real's post-processing: each anchor's best class, class-agnostic NMS, no direction
    bins, 100 m / +-100 m filters, and the final range mask on x and y only."""
    anchors = _anchors([(3.9, 1.6, 1.56), (0.8, 0.6, 1.73)])
    cls, reg, dirs = _maps(3, ncls=3)
    head = HeadOutput(cls=cls, reg=reg, dir=dirs)
    ours = decode_detections(head, anchors, THRESHOLD, NMS, gt_range=RANGE, coder=BoxCoder(),
                             protocol="reference")[0]
    corners, scores, labels = reference_post_process(cls, reg, dirs, anchors, multi_class=True)
    assert len(ours) == len(scores) > 150 and len(set(labels.tolist())) == 3
    np.testing.assert_array_equal(ours.scores.numpy(), scores)
    np.testing.assert_array_equal(ours.labels.numpy(), labels)
    np.testing.assert_allclose(_our_corners(ours.boxes), corners, atol=2e-4)
    assert float(ours.boxes[:, 2].max() + ours.boxes[:, 5].max() / 2) > 1.0  # z above 1 is kept here
    assert REFERENCE_MULTI_CLASS.range_z is False


def test_empty_and_all_below_threshold():
    anchors = _anchors([(3.9, 1.6, 1.56)])
    cls = torch.full((1, K, H, W), -5.0)
    head = HeadOutput(cls=cls, reg=torch.zeros(1, K * 7, H, W), dir=torch.zeros(1, K * 2, H, W))
    d = decode_detections(head, anchors, THRESHOLD, NMS, gt_range=RANGE, protocol="reference")[0]
    assert len(d) == 0 and d.boxes.shape == (0, 7)
    with pytest.raises(ValueError, match="protocol"):
        decode_detections(head, anchors, protocol="heal")


def test_the_model_decodes_by_its_protocol():
    """CooperativeDetector(protocol=...).decode, the path every evaluation takes, uses that
    protocol's post-processing."""
    from opencood_ext.models.detector import CooperativeDetector
    from tiny_runs import PP
    r = (-16.0, -8.0, -3.0, 16.0, 8.0, 1.0)
    ref = CooperativeDetector({"m1": PP}, r, fusion="none", protocol="reference")
    native = CooperativeDetector({"m1": PP}, r, fusion="none")
    h, w = ref.grid.shape
    g = torch.Generator().manual_seed(0)
    reg = torch.randn(1, 14, h, w, generator=g) * 0.1
    reg[:, 3] += 0.6  # anchor slot 0 about 7 m long: the reference drops it, native keeps it
    head = HeadOutput(cls=torch.randn(1, 2, h, w, generator=g) + 1.0, reg=reg, dir=torch.randn(1, 4, h, w, generator=g))
    got = ref.decode(head)[0]
    want = decode_detections(head, ref.anchors, THRESHOLD, NMS, gt_range=r, coder=ref.coder, protocol="reference")[0]
    assert len(got) == len(want) > 0 and torch.equal(got.boxes, want.boxes) and torch.equal(got.scores, want.scores)
    assert float(got.boxes[:, 3].max()) <= 6.0 < float(native.decode(head)[0].boxes[:, 3].max())
