"""Post-processing end to end: head maps that encode known boxes decode back to them."""
import math

import numpy as np
import pytest
import torch

from opencood_ext.geometry.iou import bev_iou
from opencood_ext.models.anchors import AnchorGenerator, BoxCoder
from opencood_ext.models.head import HeadOutput
from opencood_ext.postprocess import Detections, decode_detections

RANGE = [-8.0, -4.0, -3.0, 8.0, 4.0, 1.0]
H, W = 8, 16


def _encode_scene(gen, boxes, logits, classes=None, num_classes=1, flip_dir=False, batch=1):
    """Write each box into the head maps at its best anchor with the given class logit."""
    coder = BoxCoder()
    K = gen.num_per_loc
    cls = torch.full((batch, K * num_classes, H, W), -10.0)
    reg = torch.zeros(batch, K * 7, H, W)
    dirs = torch.zeros(batch, K * 2, H, W)
    anchors = gen.flat()
    for i, (box, logit) in enumerate(zip(boxes, logits)):
        a = int(bev_iou(anchors, box[None])[:, 0].argmax())
        r, rem = divmod(a, W * K)
        c, k = divmod(rem, K)
        cl = 0 if classes is None else classes[i]
        cls[0, k * num_classes + cl, r, c] = logit
        reg[0, k * 7:(k + 1) * 7, r, c] = coder.encode(box[None], anchors[a:a + 1])[0]
        b = int(coder.dir_target(box[None, 6])[0])
        dirs[0, k * 2 + (1 - b if flip_dir else b), r, c] = 5.0
    return HeadOutput(cls=cls, reg=reg, dir=dirs)


def _same_box(a, b, atol=1e-4):
    np.testing.assert_allclose(a[:6].numpy(), b[:6].numpy(), atol=atol)
    assert math.cos(float(a[6] - b[6])) > 1 - 1e-6


def test_known_boxes_decode_back():
    gen = AnchorGenerator(RANGE, (H, W))
    boxes = torch.tensor([[1.2, -0.7, -0.9, 4.1, 1.7, 1.5, 2.8],     # yaw in the second half-turn
                          [-5.5, 2.3, -1.1, 3.8, 1.6, 1.4, -1.2]])
    out = _encode_scene(gen, boxes, [4.0, 2.0], batch=2)
    dets = decode_detections(out, gen.anchors)
    assert len(dets) == 2 and isinstance(dets[0], Detections) and len(dets[1]) == 0
    d = dets[0]
    assert len(d) == 2 and d.labels.tolist() == [0, 0]
    np.testing.assert_allclose(d.scores.numpy(), torch.sigmoid(torch.tensor([4.0, 2.0])).numpy(), rtol=1e-6)
    _same_box(d.boxes[0], boxes[0])
    _same_box(d.boxes[1], boxes[1])
    # a wrong direction bin turns the box around: proves the bin is applied
    flipped = decode_detections(_encode_scene(gen, boxes, [4.0, 2.0], flip_dir=True), gen.anchors)[0]
    assert math.cos(float(flipped.boxes[0, 6] - boxes[0, 6])) < -1 + 1e-6


def test_nms_threshold_range_and_cap():
    gen = AnchorGenerator(RANGE, (H, W))
    main = torch.tensor([1.2, -0.7, -0.9, 4.1, 1.7, 1.5, 0.2])
    echo = main.clone()
    echo[0] += 1.0  # best anchor one cell over, overlapping the main box a lot
    far = torch.tensor([-5.5, 2.3, -1.1, 3.8, 1.6, 1.4, -1.2])
    weak = torch.tensor([5.5, 2.5, -1.0, 3.9, 1.6, 1.5, 1.5])
    out = _encode_scene(gen, torch.stack([main, echo, far, weak]), [3.0, 2.5, 1.0, -2.0])
    d = decode_detections(out, gen.anchors)[0]
    assert len(d) == 2  # echo suppressed by NMS, weak below 0.2
    _same_box(d.boxes[0], main)
    _same_box(d.boxes[1], far)
    loose = decode_detections(out, gen.anchors, nms_iou=0.99)[0]
    assert len(loose) == 3
    in_range = decode_detections(out, gen.anchors, gt_range=[-4.0, -4.0, -3.0, 8.0, 4.0, 1.0])[0]
    assert len(in_range) == 1
    _same_box(in_range.boxes[0], main)
    # the field's rule: all 8 corners inside, z included; the main box's centre (1.2, -0.7, -0.9)
    # stays inside both ranges below, but its front (x 3.25) or its roof (z -0.15) does not
    for cut in ([-4.0, -4.0, -3.0, 2.5, 4.0, 1.0], [-4.0, -4.0, -3.0, 8.0, 4.0, -0.5]):
        assert len(decode_detections(out, gen.anchors, gt_range=cut)[0]) == 0
    capped = decode_detections(out, gen.anchors, max_boxes=1, nms_iou=0.99)[0]
    assert len(capped) == 1 and capped.scores[0] == d.scores[0]


def test_multiclass_labels():
    gen = AnchorGenerator(RANGE, (H, W), sizes=[(3.9, 1.6, 1.56), (0.8, 0.6, 1.7)], rotations=(0.0, math.pi / 2),
                          size_classes=[0, 1])
    boxes = torch.tensor([[1.2, -0.7, -0.9, 4.1, 1.7, 1.5, 0.2], [-3.0, 2.0, -0.8, 0.7, 0.6, 1.7, 1.0]])
    out = _encode_scene(gen, boxes, [3.0, 2.0], classes=[0, 1], num_classes=2)
    d = decode_detections(out, gen.anchors)[0]
    assert d.labels.tolist() == [0, 1]
    _same_box(d.boxes[1], boxes[1])


def test_untrained_like_output_is_bounded():
    gen = AnchorGenerator(RANGE, (H, W))
    out = HeadOutput(cls=torch.full((1, 2, H, W), 3.0), reg=torch.zeros(1, 14, H, W), dir=None)
    d = decode_detections(out, gen.anchors, max_boxes=150, pre_nms_max=50)[0]
    assert 0 < len(d) <= 50 and torch.all(d.boxes[:, 6] >= -math.pi) and torch.all(d.boxes[:, 6] < math.pi)


def test_anchor_count_mismatch_is_named_in_both_protocols():
    """Anchors from another grid (a config's range or resolution changed) must fail loudly, not
    decode against the wrong anchors, in the native decoder and in the reference's."""
    gen = AnchorGenerator(RANGE, (H, W))
    other = AnchorGenerator(RANGE, (H, W // 2))
    out = _encode_scene(gen, torch.tensor([[1.2, -0.7, -0.9, 4.1, 1.7, 1.5, 0.2]]), [4.0])
    for protocol in ("native", "reference"):
        with pytest.raises(ValueError, match=rf"{other.flat().shape[0]} anchors for {gen.flat().shape[0]} head"):
            decode_detections(out, other.anchors, nms_iou=0.15, protocol=protocol)
