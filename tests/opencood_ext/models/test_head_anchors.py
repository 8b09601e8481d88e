"""Anchors, box coder, target assignment, anchor head layout and detection losses."""
import math

import numpy as np
import pytest
import torch

from opencood_ext.models.anchors import AnchorGenerator, BoxCoder, Targets, assign_targets
from opencood_ext.models.head import AnchorHead, HeadOutput
from opencood_ext.models.losses import DetectionLoss, sigmoid_focal_loss

RANGE = [-8.0, -4.0, -3.0, 8.0, 4.0, 1.0]


def test_anchor_grid_layout():
    gen = AnchorGenerator(RANGE, (4, 8), sizes=[(3.9, 1.6, 1.56), (0.8, 0.6, 1.7)],
                          rotations=(0.0, math.pi / 2), z_center=[-1.0, -0.9], size_classes=[0, 1])
    a = gen.anchors
    assert a.shape == (4, 8, 4, 7) and gen.num_per_loc == 4 and gen.num_classes == 2
    # cell (row 1, col 2): x = -8 + 2.5 * 2 = -3, y = -4 + 1.5 * 2 = -1
    np.testing.assert_allclose(a[1, 2, 3].numpy(), [-3.0, -1.0, -0.9, 0.8, 0.6, 1.7, math.pi / 2], atol=1e-6)
    np.testing.assert_allclose(a[1, 2, 0].numpy(), [-3.0, -1.0, -1.0, 3.9, 1.6, 1.56, 0.0], atol=1e-6)
    assert gen.anchor_classes.tolist() == [0, 0, 1, 1]
    flat = gen.flat()
    assert torch.equal(flat[(1 * 8 + 2) * 4 + 3], a[1, 2, 3])
    assert gen.flat_classes()[(1 * 8 + 2) * 4 + 3] == 1
    with pytest.raises(ValueError, match="one value per size"):
        AnchorGenerator(RANGE, (4, 8), sizes=[(3.9, 1.6, 1.56)], z_center=[-1.0, -0.9])


def test_encode_decode_round_trip_and_hand_values():
    g = torch.Generator().manual_seed(0)
    anchors = torch.cat([torch.randn(50, 3, generator=g) * 5, 0.5 + torch.rand(50, 3, generator=g) * 4,
                         torch.rand(50, 1, generator=g) * 6 - 3], dim=1)
    boxes = torch.cat([torch.randn(50, 3, generator=g) * 5, 0.5 + torch.rand(50, 3, generator=g) * 4,
                       torch.rand(50, 1, generator=g) * 6 - 3], dim=1)
    coder = BoxCoder()
    assert torch.allclose(coder.decode(coder.encode(boxes, anchors), anchors), boxes, atol=1e-5)
    d = coder.encode(torch.tensor([[3.0, 4.0, 1.0, 6.0, 4.0, 3.0, 0.5]]),
                     torch.tensor([[0.0, 0.0, -0.5, 3.0, 4.0, 1.5, 0.2]]))
    np.testing.assert_allclose(d[0].numpy(), [0.6, 0.8, 1.0, math.log(2), 0.0, math.log(2), 0.3], atol=1e-6)


def test_direction_bins_resolve_half_turns():
    coder = BoxCoder(dir_offset=math.pi / 4, num_dir_bins=2)
    yaw = torch.linspace(-math.pi + 0.01, math.pi - 0.01, 101)
    bins = coder.dir_target(yaw)
    # bin 0 covers [pi/4, 5 pi/4) (mod 2 pi)
    expected = (((yaw - math.pi / 4) % (2 * math.pi)) >= math.pi).long()
    assert torch.equal(bins, expected)
    for turned in (yaw + math.pi, yaw - math.pi, yaw + 2 * math.pi):
        fixed = coder.apply_direction(turned, bins)
        assert torch.allclose(torch.cos(fixed), torch.cos(yaw), atol=1e-5)
        assert torch.allclose(torch.sin(fixed), torch.sin(yaw), atol=1e-5)
        assert fixed.min() >= -math.pi and fixed.max() < math.pi


def test_assignment_on_constructed_gt():
    gen = AnchorGenerator(RANGE, (8, 16))  # 1 m cells, 2 rotations
    anchors = gen.flat()
    k = (3 * 16 + 5) * 2 + 1  # row 3, col 5, yaw pi/2
    gt = torch.stack([anchors[k].clone(),
                      torch.tensor([5.3, 2.2, -1.0, 4.4, 1.8, 1.5, 0.5])])  # off-grid: best IoU 0.52
    t = assign_targets(anchors, gt)
    assert t.labels[k] == 1 and t.matched_gt[k] == 0
    assert torch.allclose(t.reg_targets[k], torch.zeros(7), atol=1e-6)
    assert t.dir_targets[k] == BoxCoder().dir_target(gt[:1, 6])[0]
    from opencood_ext.geometry.iou import bev_iou
    iou = bev_iou(anchors, gt)
    best = int(iou[:, 1].argmax())
    assert iou[best, 1] < 0.6 and t.labels[best] == 1 and t.matched_gt[best] == 1  # forced positive
    ignore = (iou.max(1).values >= 0.45) & (iou.max(1).values < 0.6)
    ignore[best] = False
    assert ignore.any() and torch.all(t.labels[ignore] == -1)
    far = (anchors[:, :2] - gt[0, :2]).norm(dim=1).gt(6) & (anchors[:, :2] - gt[1, :2]).norm(dim=1).gt(6)
    assert far.any() and torch.all(t.labels[far] == 0) and torch.all(t.reg_targets[far] == 0)
    assert torch.equal(t.reg_weights, (t.labels == 1).float())
    assert torch.equal(t.cls_weights, (t.labels >= 0).float())
    empty = assign_targets(anchors, torch.zeros(0, 7))
    assert torch.all(empty.labels == 0) and torch.all(empty.matched_gt == -1)
    stacked = Targets.stack([t, empty])
    assert stacked.labels.shape == (2, anchors.shape[0]) and stacked.reg_targets.shape == (2, anchors.shape[0], 7)


def test_multiclass_assignment_respects_classes():
    gen = AnchorGenerator(RANGE, (8, 16), sizes=[(3.9, 1.6, 1.56), (0.8, 0.6, 1.7)], rotations=(0.0,),
                          size_classes=[0, 1])
    anchors, a_cls = gen.flat(), gen.flat_classes()
    car = anchors[(2 * 16 + 3) * 2 + 0]
    ped = anchors[(6 * 16 + 12) * 2 + 1]
    t = assign_targets(anchors, torch.stack([car, ped]), pos_iou=[0.6, 0.5], neg_iou=[0.45, 0.35],
                       gt_classes=torch.tensor([0, 1]), anchor_classes=a_cls)
    pos = (t.labels == 1).nonzero().squeeze(1).tolist()
    assert pos == [(2 * 16 + 3) * 2 + 0, (6 * 16 + 12) * 2 + 1]
    assert t.gt_class[pos].tolist() == [0, 1]
    # the pedestrian anchor sitting inside the car box is not matched to the car
    assert t.labels[(2 * 16 + 3) * 2 + 1] == 0


def test_head_channel_layout_matches_anchor_order():
    head = AnchorHead(in_channels=4, num_anchors_per_loc=2, num_classes=3)
    out = head(torch.randn(2, 4, 5, 6))
    assert out.cls.shape == (2, 6, 5, 6) and out.reg.shape == (2, 14, 5, 6) and out.dir.shape == (2, 4, 5, 6)
    assert torch.allclose(torch.sigmoid(out.cls).mean(), torch.tensor(0.01), atol=0.01)
    cls, reg, dirs = out.flat()
    r, c, k = 3, 4, 1
    i = (r * 6 + c) * 2 + k
    assert torch.equal(cls[1, i], out.cls[1, k * 3:(k + 1) * 3, r, c])
    assert torch.equal(reg[1, i], out.reg[1, k * 7:(k + 1) * 7, r, c])
    assert torch.equal(dirs[1, i], out.dir[1, k * 2:(k + 1) * 2, r, c])
    assert AnchorHead(4, use_direction=False)(torch.randn(1, 4, 2, 2)).dir is None


def test_focal_loss_by_hand():
    logits = torch.tensor([0.0, 0.0, 2.0])
    target = torch.tensor([1.0, 0.0, 0.0])
    got = sigmoid_focal_loss(logits, target, alpha=0.25, gamma=2.0)
    p = 1 / (1 + math.exp(-2.0))
    expected = [0.25 * 0.25 * math.log(2), 0.75 * 0.25 * math.log(2), 0.75 * p ** 2 * -math.log(1 - p)]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5)


def test_detection_loss_by_hand():
    # one sample, 1 x 1 map, 2 anchors: anchor 0 positive, anchor 1 ignored
    reg = torch.zeros(1, 14, 1, 1)
    reg[0, 0] = 0.5            # x delta off by 0.5 -> smooth-L1 0.5 - beta / 2
    reg[0, 6] = math.pi        # yaw off by pi -> sin difference 0: free
    out = HeadOutput(cls=torch.zeros(1, 2, 1, 1), reg=reg, dir=torch.zeros(1, 4, 1, 1))
    t = Targets(labels=torch.tensor([[1, -1]]), gt_class=torch.tensor([[0, -1]]),
                matched_gt=torch.tensor([[0, -1]]), reg_targets=torch.zeros(1, 2, 7),
                dir_targets=torch.tensor([[1, 0]]))
    beta = 1 / 9
    terms = DetectionLoss(smooth_l1_beta=beta)(out, t)
    assert terms.cls.item() == pytest.approx(2.0 * 0.25 * 0.25 * math.log(2), rel=1e-5)
    assert terms.box.item() == pytest.approx(2.0 * (0.5 - beta / 2), rel=1e-5)
    assert terms.dir.item() == pytest.approx(0.2 * math.log(2), rel=1e-5)
    assert terms.total.item() == pytest.approx(terms.cls.item() + terms.box.item() + terms.dir.item())
    assert terms.num_positives == 1


def test_detection_loss_normalises_and_backpropagates():
    torch.manual_seed(0)
    gen = AnchorGenerator(RANGE, (8, 16))
    gt = torch.tensor([[0.5, 0.5, -1.0, 4.0, 1.7, 1.5, 0.1], [-4.5, 2.5, -1.0, 4.2, 1.8, 1.6, 2.0]])
    t = Targets.stack([assign_targets(gen.flat(), gt), assign_targets(gen.flat(), gt[:1])])
    head = AnchorHead(8, gen.num_per_loc)
    x = torch.randn(2, 8, 8, 16, requires_grad=True)
    terms = DetectionLoss()(head(x), t)
    assert terms.num_positives == int((t.labels == 1).sum())
    terms.total.backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="targets cover"):
        DetectionLoss()(head(torch.randn(2, 8, 4, 16)), t)
