"""V2X-Real under ``protocol: reference``: anchors, targets, loss, head maps and decoding against
independent restatements of the GenComm reference's V2X-Real code, read from its public source
(``VoxelPostprocessor.generate_anchor_box_v2xreal`` and ``generate_label_v2xreal``,
``post_process_v2xreal``'s anchor stacking, ``point_pillar_v2xreal_gencomm_loss``, the
``cls_head`` / ``reg_head`` / ``dir_head`` of ``heter_model_baseline_w_gencomm_stage1``).

The reference's numbers (ranges, voxel size, anchor table, thresholds, loss weights) are read from
its own stage-1 yaml (tests/assets/hypes/GenComm/...), not from configs/v2xreal, so a drift of
our config from the reference's fails here as well as in tests/configs/test_protocol.py. The reference's
box order is ``[x, y, z, h, w, l, yaw]``; ours ``[x, y, z, l, w, h, yaw]``.
"""
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import test_reference_e2e as e2e
import test_reference_eval as ref_eval
from opencood_ext.experiment import build_model, load_experiment
from opencood_ext.models.anchors import AnchorGenerator, assign_targets, assign_targets_reference
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.models.head import HeadOutput
from test_reference_e2e import no_noise  # noqa: F401  (the fixture the end-to-end test uses)

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[3]
REF_YAML = ROOT / "tests/assets/hypes/GenComm/opencood/hypes_yaml/v2xreal/GenComm_yamls/gencomm/stage1/m1_att.yaml"
CONFIG = ROOT / "configs/v2xreal/gencomm_stage1_m1.yaml"
HWL = [0, 1, 2, 5, 4, 3, 6]  # ours <-> the reference's box order (its own inverse)


def _hypes():
    return yaml.safe_load(REF_YAML.read_text())


@pytest.fixture(scope="module")
def model():
    return build_model(load_experiment(CONFIG)).eval()


# ----------------------------------------------------------------------------- the restatement
def reference_anchors(hypes):
    """generate_anchor_box_v2xreal: per class (in the table's order) anchors (ny, nx, R, 7) in hwl
    order, x and y the aligned cell centres; post_process_v2xreal stacks the classes (C, ny, nx, R, 7)
    and permutes to (ny, nx, C, R, 7) before flattening. -> list per class, and the flat (N, 7)."""
    rng = hypes["cav_lidar_range"]
    voxel = hypes["preprocess"]["args"]["voxel_size"]
    grid = np.array([int(np.ceil((rng[3] - rng[0]) / voxel[0])), int(np.ceil((rng[4] - rng[1]) / voxel[1]))])
    per_class = []
    for c in hypes["postprocess"]["anchor_args"]["anchor_generator_config"]:
        nx, ny = grid // c["feature_map_stride"]
        assert c["align_center"]
        sx, sy = (rng[3] - rng[0]) / nx, (rng[4] - rng[1]) / ny
        xs = np.arange(rng[0] + sx / 2, rng[3] + 1e-5, sx)
        ys = np.arange(rng[1] + sy / 2, rng[4] + 1e-5, sy)
        X, Y, Z = np.meshgrid(xs, ys, np.array(c["anchor_bottom_heights"]))  # (ny, nx, 1) each
        centre = np.concatenate([X, Y, Z], axis=-1)  # (ny, nx, 3)
        l, w, h = c["anchor_sizes"][0]
        rots = np.array(c["anchor_rotations"], dtype=np.float64)
        a = np.zeros((ny, nx, len(rots), 7))
        a[..., :3] = centre[:, :, None, :]
        a[..., 3:6] = (h, w, l)
        a[..., 6] = rots
        per_class.append(a)
    flat = torch.from_numpy(np.stack(per_class)).permute(1, 2, 0, 3, 4).reshape(-1, 7).float()
    return per_class, flat


def _standup(boxes_hwl):
    """(N, 7) float64 hwl -> (N, 4) float32 [x1, y1, x2, y2]: boxes_to_corners_3d (offsets and the
    rotation matrix cast to float32, rotate_points_along_z's float32 matmul, the float64 centre added
    in place) then corner2d_to_standup_box over the 8 corners."""
    b = torch.from_numpy(boxes_hwl)[:, HWL]  # its corner template reads [x, y, z, l, w, h, yaw]
    template = b.new_tensor([[1, -1, -1], [1, 1, -1], [-1, 1, -1], [-1, -1, -1],
                             [1, -1, 1], [1, 1, 1], [-1, 1, 1], [-1, -1, 1]]) / 2
    pts = b[:, None, 3:6].repeat(1, 8, 1) * template[None, :, :]
    cos, sin = torch.cos(b[:, 6]), torch.sin(b[:, 6])
    zeros, ones = b.new_zeros(len(b)), b.new_ones(len(b))
    rot = torch.stack((cos, sin, zeros, -sin, cos, zeros, zeros, zeros, ones), dim=1).view(-1, 3, 3).float()
    corners = torch.matmul(pts.float(), rot)
    corners += b[:, None, 0:3]
    c = corners.numpy()
    out = np.zeros((len(c), 4))
    out[:, 0], out[:, 1] = c[:, :, 0].min(axis=1), c[:, :, 1].min(axis=1)
    out[:, 2], out[:, 3] = c[:, :, 0].max(axis=1), c[:, :, 1].max(axis=1)
    return out.astype(np.float32)


def _bbox_overlaps(b, q):
    """Fast R-CNN's bbox_overlaps in float32: every side and overlap one unit longer (+1)."""
    iw = np.minimum(b[:, None, 2], q[None, :, 2]) - np.maximum(b[:, None, 0], q[None, :, 0]) + np.float32(1)
    ih = np.minimum(b[:, None, 3], q[None, :, 3]) - np.maximum(b[:, None, 1], q[None, :, 1]) + np.float32(1)
    area_b = (b[:, 2] - b[:, 0] + np.float32(1)) * (b[:, 3] - b[:, 1] + np.float32(1))
    area_q = (q[:, 2] - q[:, 0] + np.float32(1)) * (q[:, 3] - q[:, 1] + np.float32(1))
    ua = area_b[:, None] + area_q[None, :] - iw * ih
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((iw > 0) & (ih > 0), iw * ih / ua, np.float32(0)).astype(np.float32)


def reference_labels(per_class, gt_hwl, gt_class1, hypes):
    """generate_label_v2xreal for one frame: per class its anchors against its own boxes (class column
    1-based); positive above matched_threshold (lowest box index) or the box's first best anchor;
    negative when every IoU is below unmatched_threshold; labels class+1 / 0 / -1, regression
    targets (hwl deltas). -> labels (N,), targets (N, 7), flattened as (ny, nx, class, rotation)."""
    table = hypes["postprocess"]["anchor_args"]["anchor_generator_config"]
    labels_all, targets_all = [], []
    for i, (anchors, c) in enumerate(zip(per_class, table)):
        gt = gt_hwl[gt_class1 - 1 == i]
        shape = anchors.shape[:3]
        a = anchors.reshape(-1, 7)
        d = np.sqrt(a[:, 4] ** 2 + a[:, 5] ** 2)
        iou = _bbox_overlaps(_standup(a), _standup(gt)) if len(gt) else np.zeros((len(a), 0), np.float32)
        best = np.argmax(iou.T, axis=1) if len(gt) else np.zeros(0, np.int64)
        ok = iou.T[np.arange(len(gt)), best] > 0 if len(gt) else np.zeros(0, bool)
        best, best_gt = best[ok], np.arange(len(gt))[ok]
        pos, pos_gt = np.where(iou > c["matched_threshold"])
        neg = np.where(np.sum(iou < c["unmatched_threshold"], axis=1) == iou.shape[1])[0]
        pos, first = np.unique(np.concatenate([pos, best]), return_index=True)
        pos_gt = np.concatenate([pos_gt, best_gt])[first]
        labels = -np.ones(len(a))
        labels[pos] = i + 1
        labels[neg] = 0
        labels[pos] = i + 1
        t = np.zeros((len(a), 7))
        g, an = gt[pos_gt], a[pos]
        t[pos, 0] = (g[:, 0] - an[:, 0]) / d[pos]
        t[pos, 1] = (g[:, 1] - an[:, 1]) / d[pos]
        t[pos, 2] = (g[:, 2] - an[:, 2]) / an[:, 3]
        t[pos, 3:6] = np.log(g[:, 3:6] / an[:, 3:6])
        t[pos, 6] = g[:, 6] - an[:, 6]
        labels_all.append(labels.reshape(shape))
        targets_all.append(t.reshape(*shape, 7))
    return np.concatenate(labels_all, axis=-1).reshape(-1), np.concatenate(targets_all, axis=-2).reshape(-1, 7)


def reference_loss(cls_map, reg_map_hwl, labels, targets_hwl, hypes):
    """point_pillar_v2xreal_gencomm_loss without its generation term: sigmoid focal loss (alpha 0.25,
    gamma 2) on the one-hot of the 1-based labels without the background column, positives and
    negatives weighted 1 over the frame's positive count; smooth-L1 (beta 1/9) of the deltas, yaw by
    sin(a)cos(b) - cos(a)sin(b), positives only; both summed and divided by the batch size; no
    direction term. -> (cls, reg) after their weights."""
    args = hypes["loss"]["args"]
    b, ncls = cls_map.shape[0], args["num_class"]
    pred = cls_map.permute(0, 2, 3, 1).reshape(b, -1, ncls).double()
    lab = labels.view(b, -1)
    pos, neg = lab > 0, lab == 0
    norm = pos.sum(1, keepdim=True).double().clamp(min=1.0)
    cls_w, reg_w = (pos.double() + neg.double()) / norm, pos.double() / norm
    onehot = torch.zeros(*lab.shape, ncls + 1, dtype=torch.float64)
    onehot.scatter_(-1, (lab * (lab >= 0)).long()[..., None], 1.0)
    onehot = onehot[..., 1:]
    p = torch.sigmoid(pred)
    focal = (onehot * 0.25 + (1 - onehot) * 0.75) * (onehot * (1 - p) + (1 - onehot) * p) ** 2
    bce = pred.clamp(min=0) - pred * onehot + torch.log1p(torch.exp(-pred.abs()))
    cls = (focal * bce * cls_w[..., None]).sum() / b * args["cls_weight"]
    rm = reg_map_hwl.permute(0, 2, 3, 1).reshape(b, -1, 7).double()
    t = targets_hwl.view(b, -1, 7).double()
    rm6 = torch.sin(rm[..., 6:]) * torch.cos(t[..., 6:])
    t6 = torch.cos(rm[..., 6:]) * torch.sin(t[..., 6:])
    diff = torch.cat([rm[..., :6], rm6], -1) - torch.cat([t[..., :6], t6], -1)
    n = diff.abs()
    sl1 = torch.where(n < 1 / 9, 0.5 * n ** 2 * 9, n - 0.5 / 9)
    reg = (sl1 * reg_w[..., None]).sum() / b * args["reg"]
    return float(cls), float(reg)


# ----------------------------------------------------------------------------- hand-placed boxes
def _boxes():
    """Frame 0: every class, overlapping boxes of a class, one box exactly on an anchor, one at the
    range's corner; frame 1: trucks only (the other classes' anchors all negative). Ours
    [x, y, z, l, w, h, yaw] and 0-based classes."""
    f0 = torch.tensor([
        [10.31, 5.13, -1.0, 4.5, 1.9, 1.6, 0.3],   # vehicle
        [12.07, 7.21, -1.1, 4.2, 1.8, 1.5, 1.2],   # vehicle, overlapping the first's anchors
        [10.4, -0.8, -1.78, 3.9, 1.6, 1.56, 0.0],  # vehicle exactly on an anchor
        [-100.93, 50.37, -0.9, 4.7, 2.0, 1.7, -0.4],  # vehicle at the range's corner
        [3.31, -2.07, -0.8, 0.7, 0.6, 1.7, 0.1],   # pedestrians, close together
        [3.93, -2.49, -0.8, 0.8, 0.7, 1.8, 2.0],
        [-20.47, 15.23, -1.2, 9.1, 3.1, 3.2, 0.7],  # truck
        [26.55, 13.71, -1.0, 4.1, 1.7, 1.5, 0.05],  # two cars annotated on one spot (both above the
        [26.21, 13.45, -1.0, 3.8, 1.6, 1.5, -0.1],  # threshold on one anchor: the lower index wins)
        [-60.05, -31.18, -1.0, 12.3, 2.9, 3.3, 0.02],  # a bus: several truck anchors above the threshold
    ])
    c0 = torch.tensor([0, 0, 0, 0, 1, 1, 2, 0, 0, 2])
    f1 = torch.tensor([[30.11, -12.29, -1.0, 7.6, 2.9, 3.1, -1.1], [33.7, -9.6, -1.0, 10.2, 2.6, 3.5, 0.2]])
    return [f0, f1], [c0, torch.tensor([2, 2])]


# ----------------------------------------------------------------------------- tests
def test_anchors_are_the_reference_anchors(model):
    hypes = _hypes()
    _, want = reference_anchors(hypes)
    assert torch.equal(model.anchors[:, HWL], want)  # every value to the bit
    assert model.anchor_gen.num_per_loc == 6 and model.grid.shape == (64, 128)
    # the native formula (float32 centres) is off by a float32 step in about half the cells
    native = AnchorGenerator(model.lidar_range, model.grid.shape, **load_experiment(CONFIG).model["anchors"])
    assert not torch.equal(native.flat()[:, HWL], want)
    assert torch.allclose(native.flat()[:, HWL], want, atol=1e-5)


def test_targets_are_generate_label_v2xreal(model):
    hypes = _hypes()
    per_class, _ = reference_anchors(hypes)
    gts, classes = _boxes()
    got = model.targets(gts, classes)
    for b, (g, c) in enumerate(zip(gts, classes)):
        labels, targets = reference_labels(per_class, g[:, HWL].double().numpy(), c.numpy() + 1, hypes)
        ours = torch.where(got.labels[b] == 1, got.gt_class[b] + 1, got.labels[b]).numpy()
        np.testing.assert_array_equal(ours, labels)
        pos = labels > 0
        np.testing.assert_allclose(got.reg_targets[b][:, HWL].numpy()[pos], targets[pos], atol=2e-5)
        assert not got.reg_targets[b][~torch.from_numpy(pos)].any()
        for k in {int(v) for v in c}:  # every class present has its positives
            assert (labels[(model.anchor_gen.flat_classes() == k).numpy()] == k + 1).sum() >= 1
        assert (labels == -1).any() and (labels == 0).sum() > 40000
    # threshold positives: the bus's anchors, and the anchor both cars of one spot exceed 0.6 on,
    # matched to the first of them (box 7)
    assert int((got.matched_gt[0] == 9).sum()) >= 3
    assert int((got.matched_gt[0] == 7).sum()) >= 1 and int((got.matched_gt[0] == 8).sum()) == 0
    # the truck of frame 0 contains two neighbouring truck anchors (rotated 1.57) whole: their IoUs
    # tie in exact arithmetic (0.3923, below the matched 0.6), and the reference's float64 anchors
    # break the tie for the second; the same anchors rounded to float32 would tie and give the first
    twins = [31787, 31793]
    assert got.labels[0][twins].tolist() == [0, 1] and int(got.gt_class[0][31793]) == 2
    f32 = assign_targets_reference(model.anchors, gts[0], model.pos_iou, model.neg_iou, model.coder, classes[0],
                                   model.anchor_gen.flat_classes())
    assert f32.labels[twins].tolist() == [1, 0]
    # the native rule (rotated IoU) gives other labels on the same boxes
    native = assign_targets(model.anchors, gts[0], model.pos_iou, model.neg_iou, model.coder, classes[0],
                            model.anchor_gen.flat_classes())
    assert not torch.equal(native.labels, got.labels[0])


def test_loss_is_the_reference_v2xreal_loss(model):
    hypes = _hypes()
    per_class, _ = reference_anchors(hypes)
    gts, classes = _boxes()
    g = torch.Generator().manual_seed(0)
    h, w = model.grid.shape
    cls_map = torch.randn(2, 18, h, w, generator=g) - 2.0
    reg_map = torch.randn(2, 42, h, w, generator=g) * 0.3
    dir_map = torch.randn(2, 4, h, w, generator=g)
    head = HeadOutput(cls=cls_map, reg=reg_map, dir=dir_map, dir_slots=2)
    terms = model.criterion(head, model.targets(gts, classes))
    ref = [reference_labels(per_class, gg[:, HWL].double().numpy(), c.numpy() + 1, hypes)
           for gg, c in zip(gts, classes)]
    labels = torch.from_numpy(np.stack([r[0] for r in ref]))
    targets = torch.from_numpy(np.stack([r[1] for r in ref]))
    hwl = torch.tensor([a * 7 + j for a in range(6) for j in HWL])
    want_cls, want_reg = reference_loss(cls_map, reg_map[:, hwl], labels, targets, hypes)
    assert float(terms.cls) == pytest.approx(want_cls, rel=1e-6)
    assert float(terms.box) == pytest.approx(want_reg, rel=1e-6)
    assert float(terms.dir) == 0.0 and float(terms.total) == pytest.approx(want_cls + want_reg, rel=1e-6)
    assert "dir" not in hypes["loss"]["args"] and model.criterion.pos_cls_weight == 1.0


def test_the_direction_head_is_the_reference_layout(model):
    """dir_head: num_bins x anchor_number (rotations) channels, shared by the classes; slot k of a
    location reads rotation k % 2's pair."""
    hypes = _hypes()
    want = hypes["postprocess"]["dir_args"]["num_bins"] * hypes["model"]["args"]["anchor_number"]
    assert model.head.dir.out_channels == want == 4
    assert model.head.cls.out_channels == 18 and model.head.reg.out_channels == 42
    d = torch.arange(4.0).view(1, 4, 1, 1).expand(1, 4, 2, 3)
    _, _, dirs = HeadOutput(cls=torch.zeros(1, 18, 2, 3), reg=torch.zeros(1, 42, 2, 3), dir=d, dir_slots=2).flat()
    assert dirs.shape == (1, 36, 2)
    assert dirs[0, :6].tolist() == [[0.0, 1.0], [2.0, 3.0]] * 3
    # native keeps a pair per anchor
    native = build_model(load_experiment(CONFIG, ["protocol=native"]))
    assert native.head.dir.out_channels == 12


# ---------------------------------------------------------------- end to end on the V2XSet scan
SIZES = [[3.9, 1.6, 1.56], [0.8, 0.6, 1.73], [8.0, 3.0, 3.0]]


def _v2xreal_model():
    anchors = {"sizes": SIZES, "size_classes": [0, 1, 2], "rotations": [0.0, 1.57], "z_center": [-1.78, -0.6, -1.78]}
    return CooperativeDetector({"m1": e2e._stack("m1")}, e2e.RANGE, fusion="intermediate", fusion_op="att",
                               link=e2e.GENCOMM_LINK, anchors=anchors, protocol="reference").eval()


def _v2xreal_shapes():
    """The stage-1 keys of test_reference_e2e with V2X-Real's heads: cls anchor_number x num_class^2,
    reg 7 x anchor_number x num_class, dir num_bins x anchor_number."""
    shapes = {k: v for k, v in e2e._shapes(["m1"], True).items() if not k.split(".")[0].endswith("_head")}
    for name, out in (("cls_head", 2 * 3 * 3), ("reg_head", 7 * 2 * 3), ("dir_head", 2 * 2)):
        shapes.update({f"{name}.weight": (out, e2e.C, 1, 1), f"{name}.bias": (out,)})
    return shapes


@pytest.mark.usefixtures("no_noise")
def test_a_v2xreal_stage1_checkpoint_gives_the_reference_maps_and_predictions(monkeypatch):
    batch = e2e._batch(["m1"], "all:m1")
    sd = e2e._checkpoint(_v2xreal_shapes(), seed=5)
    model = _v2xreal_model()
    e2e._load(model, sd)
    errors = e2e._compare(model, sd, batch, True)
    assert max(errors) < 1e-4, errors
    # decoding: post_process_v2xreal's restatement (tests/opencood_ext/test_reference_eval.py) on the same maps,
    # 6 anchors per location and this model's range
    monkeypatch.setattr(ref_eval, "K", 6)
    monkeypatch.setattr(ref_eval, "RANGE", tuple(e2e.RANGE))
    with torch.no_grad():
        head = model(batch).head
    ours = model.decode(head)[0]
    h, w = model.grid.shape
    corners, scores, labels = ref_eval.reference_post_process(head.cls, head.reg, head.dir,
                                                              model.anchors.view(h, w, 6, 7), multi_class=True)
    assert len(ours) == len(scores) > 20 and len(set(labels.tolist())) >= 2
    np.testing.assert_array_equal(ours.scores.numpy(), scores)
    np.testing.assert_array_equal(ours.labels.numpy(), labels)
    np.testing.assert_allclose(ref_eval._our_corners(ours.boxes), corners, atol=2e-4)
