"""``protocol: reference`` on the model side: the reference's anchor target assignment (restated
here from GenComm/HEAL ``voxel_postprocessor.py`` ``generate_label`` in numpy), its anchor
placement and ``pos_cls_weight``, the protocol reaching the model from the experiment, and the
shipped dataset configs building the reference architecture, parameter for parameter (counts
derived here from the reference's module definitions: ``pillar_vfe.py``, ``base_bev_backbone.py``,
``downsample_conv.py``, ``sparse_backbone_3d.py`` VoxelBackBone8x, ``message_extractor_v2.py``,
``unet.py``, ``enhancer.py`` and the heads of ``heter_model_baseline*.py``)."""
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import gencomm  # noqa: F401  (registers the GenComm link)
from opencood_ext.config import ConfigError
from opencood_ext.experiment import build_model, load_experiment
from opencood_ext.models.anchors import AnchorGenerator, BoxCoder, assign_targets_reference
from opencood_ext.models.head import HeadOutput
from opencood_ext.models.losses import DetectionLoss

ROOT = Path(__file__).resolve().parents[3]
torch.set_num_threads(1)


# ---------------------------------------------------------------- target assignment
def _generate_label(anchors, gt, pos_t, neg_t):
    """generate_label in numpy: standup boxes of the corners, Fast R-CNN IoU with +1, the
    threshold pairs then each box's argmax anchor, np.unique keeping the first occurrence."""
    def standup(b):
        out = []
        for x, y, _, l, w, _, yaw in b:
            c, s = math.cos(yaw), math.sin(yaw)
            corners = [(x + c * dx - s * dy, y + s * dx + c * dy) for dx in (l / 2, -l / 2) for dy in (w / 2, -w / 2)]
            xs, ys = [p[0] for p in corners], [p[1] for p in corners]
            out.append([min(xs), min(ys), max(xs), max(ys)])
        return np.asarray(out, np.float32).reshape(-1, 4)

    a, g = standup(anchors), standup(gt)
    iou = np.zeros((len(a), len(g)), np.float32)
    for k in range(len(g)):
        area = (g[k, 2] - g[k, 0] + 1) * (g[k, 3] - g[k, 1] + 1)
        for n in range(len(a)):
            iw = min(a[n, 2], g[k, 2]) - max(a[n, 0], g[k, 0]) + 1
            if iw > 0:
                ih = min(a[n, 3], g[k, 3]) - max(a[n, 1], g[k, 1]) + 1
                if ih > 0:
                    iou[n, k] = iw * ih / ((a[n, 2] - a[n, 0] + 1) * (a[n, 3] - a[n, 1] + 1) + area - iw * ih)
    hi = np.argmax(iou.T, axis=1) if len(g) else np.zeros(0, int)
    hi_gt = np.arange(len(g))
    keep = iou.T[hi_gt, hi] > 0 if len(g) else np.zeros(0, bool)
    hi, hi_gt = hi[keep], hi_gt[keep]
    pos, pos_gt = np.where(iou > pos_t)
    neg = np.where(np.sum(iou < neg_t, axis=1) == iou.shape[1])[0]
    pos, idx = np.unique(np.concatenate([pos, hi]), return_index=True)
    pos_gt = np.concatenate([pos_gt, hi_gt])[idx]
    labels = np.full(len(a), -1)
    labels[neg] = 0
    labels[hi] = -1
    labels[pos] = 1
    matched = np.full(len(a), -1)
    matched[pos] = pos_gt
    # a box whose best IoU is shared (to float rounding) by several anchors: which one the reference
    # takes depends on the last bit of its corner arithmetic; those anchors are not compared
    tied = np.zeros(len(a), bool)
    for k in range(len(g)):
        near = np.abs(iou[:, k] - iou[:, k].max()) <= 1e-6 * max(iou[:, k].max(), 1e-12)
        if iou[:, k].max() > 0 and near.sum() > 1:
            tied |= near
    return labels, matched, tied


def test_reference_targets_follow_generate_label():
    anchors = AnchorGenerator([-12.8, -6.4, -3, 12.8, 6.4, 1], (8, 16), margin=(0.4, 0.4)).flat()
    rng = np.random.default_rng(0)
    gt = np.c_[rng.uniform(-12, 12, 9), rng.uniform(-6, 6, 9), rng.uniform(-1.5, -0.5, 9),
               rng.uniform(3.5, 5, 9), rng.uniform(1.5, 2.2, 9), np.full(9, 1.5), rng.uniform(-3.1, 3.1, 9)]
    gt[8] = gt[7]  # two boxes on the same spot: the lower index wins the shared anchors
    gt[6, :2] = anchors[40, :2].numpy()  # a box centred on an anchor
    t = assign_targets_reference(anchors, torch.tensor(gt, dtype=torch.float32), 0.6, 0.45)
    labels, matched, tied = _generate_label(anchors.double().numpy(), gt, 0.6, 0.45)
    same = (t.labels.numpy() == labels) & (t.matched_gt.numpy() == matched)
    assert same[~tied].all() and tied.sum() < 0.05 * len(tied), (np.where(~same & ~tied), tied.sum())
    assert (labels == 1).sum() >= 8 and (labels == -1).any()  # boxes 7 and 8 share their best anchor
    pos = t.labels == 1
    torch.testing.assert_close(t.reg_targets[pos], BoxCoder.encode(torch.tensor(gt, dtype=torch.float32)[
        t.matched_gt[pos]], anchors[pos]))
    empty = assign_targets_reference(anchors, torch.zeros(0, 7))
    assert (empty.labels == 0).all()  # no box: every anchor negative, as the reference


def test_the_plus_one_iou_reaches_across_a_gap():
    """Rectangles 0.5 m apart overlap in the reference's IoU (each side counts one unit more)."""
    a = torch.tensor([[0.0, 0.0, 0.0, 2.0, 2.0, 1.0, 0.0]])
    b = torch.tensor([[2.5, 0.0, 0.0, 2.0, 2.0, 1.0, 0.0]])
    from opencood_ext.models.anchors import standup_iou_reference

    assert float(standup_iou_reference(a, b)) == pytest.approx(0.5 * 3 / (9 + 9 - 0.5 * 3))


def test_reference_anchor_placement_is_linspace_from_the_voxel_margin():
    gen = AnchorGenerator([-102.4, -51.2, -3, 102.4, 51.2, 1], (64, 128), margin=(0.4, 0.4))
    np.testing.assert_allclose(gen.anchors[0, :, 0, 0].numpy(), np.linspace(-102.0, 102.0, 128), atol=1e-5)
    np.testing.assert_allclose(gen.anchors[:, 0, 0, 1].numpy(), np.linspace(-50.8, 50.8, 64), atol=1e-5)
    centres = AnchorGenerator([-102.4, -51.2, -3, 102.4, 51.2, 1], (64, 128))
    assert float(centres.anchors[0, 0, 0, 0]) == pytest.approx(-101.6)
    with pytest.raises(ValueError, match="anchors.margin must be"):
        AnchorGenerator([-1, -1, -3, 1, 1, 1], (2, 2), margin=(0.4,))


def test_pos_cls_weight_is_the_reference_classification_weighting():
    torch.manual_seed(0)
    cls = torch.randn(2, 2, 3, 4)
    out = HeadOutput(cls=cls, reg=torch.zeros(2, 14, 3, 4), dir=torch.zeros(2, 4, 3, 4))
    anchors = AnchorGenerator([-4.8, -3.6, -3, 4.8, 3.6, 1], (3, 4)).flat()
    gt = [torch.tensor([[1.2, 0.0, -1.0, 3.9, 1.6, 1.56, 0.1]]), torch.zeros(0, 7)]
    t = type(assign_targets_reference(anchors, gt[0])).stack([assign_targets_reference(anchors, g) for g in gt])
    ours = DetectionLoss(cls_weight=1.0, pos_cls_weight=2.0)(out, t).cls
    # point_pillar_loss: weights positives * pos_cls_weight + negatives, / positives per sample, summed / B
    p = cls.permute(0, 2, 3, 1).reshape(2, -1)
    y = (t.labels == 1).float()
    w = ((t.labels == 1) * 2.0 + (t.labels == 0) * 1.0) / y.sum(1, keepdim=True).clamp(min=1)
    prob = p.sigmoid()
    pt = y * prob + (1 - y) * (1 - prob)
    ce = p.clamp(min=0) - p * y + torch.log1p(torch.exp(-p.abs()))
    want = ((1 - pt) ** 2 * (y * 0.25 + (1 - y) * 0.75) * ce * w).sum() / 2
    torch.testing.assert_close(ours, want)
    with pytest.raises(ValueError, match="pos_cls_weight must be > 0"):
        DetectionLoss(pos_cls_weight=0)


# ---------------------------------------------------------------- the protocol reaches the model
def test_the_experiment_protocol_builds_the_model(tmp_path):
    cfg = load_experiment(ROOT / "configs" / "dairv2x" / "gencomm_stage1_m1.yaml")
    assert cfg.protocol == "reference"
    model = build_model(cfg)
    assert model.protocol == "reference" and model.encoders["m1"].encoder.protocol == "reference"
    native = build_model(load_experiment(ROOT / "configs" / "dairv2x" / "gencomm_stage1_m1.yaml",
                                         ["protocol=native"]))
    assert native.protocol == "native" and native.encoders["m1"].encoder.protocol == "native"
    with pytest.raises(ConfigError, match="model.protocol.?: the protocol is the experiment's top-level key"):
        load_experiment(ROOT / "configs" / "dairv2x" / "gencomm_stage1_m1.yaml", ["model.protocol=reference"])
    with pytest.raises(ValueError, match=r"protocol must be one of \['native', 'reference', 'equalized'\]"):
        from opencood_ext.models.detector import CooperativeDetector

        CooperativeDetector({"m1": {"encoder": {"type": "pointpillars"}, "backbone": {}}},
                            [-8, -8, -3, 8, 8, 1], link={"type": "full_feature"}, protocol="paper")


def test_a_paper_order_gencomm_link_is_refused_under_the_reference_protocol():
    """Refused when the model is built (the detector hands the link its protocol), naming the config file
    that holds the model section and the key; a link built alone is refused on its first reference arrival."""
    cfg = load_experiment(ROOT / "configs" / "dairv2x" / "gencomm_stage1_m1.yaml",
                          ["model.link.warp_before_generation=true"])
    with pytest.raises(ValueError, match=r"dairv2x/gencomm_link\.yaml: key 'model': model\.link\.warp_before_generation: "
                                         "protocol reference generates in the sender"):
        build_model(cfg)
    from gencomm.link import GenCommLink
    from opencood_ext.models.links import Arrival

    link = GenCommLink(8, ["m1"], [-8, -8, -3, 8, 8, 1], warp_before_generation=True)
    arrival = Arrival(torch.eye(4)[None], ["m1"], torch.zeros(1, 8, 16, 16), ["m1"], torch.ones(1, 1, 16, 16),
                      protocol="reference")
    with pytest.raises(ValueError, match="warp_before_generation: protocol reference generates in the sender"):
        link.receive(torch.zeros(1, 2, 16, 16), arrival)


# ---------------------------------------------------------------- the shipped configs' sizes
def _pillars(c=64, cin=10):
    return cin * c + 2 * c  # PFNLayer: Linear without bias, BatchNorm1d


def _base_bev(cin, nums, filters, ups, up_filters):
    n = 0
    for c, num, up, cu in zip(filters, nums, ups, up_filters):
        n += 9 * cin * c + 2 * c + num * (9 * c * c + 2 * c)  # blocks: conv (no bias) + BN, num more
        n += c * cu * int(up) ** 2 + 2 * cu  # deblocks: ConvTranspose2d (no bias) + BN
        cin = c
    return n


def _downsample(cin, d):
    return 9 * cin * d + d + 9 * d * d + d  # DoubleConv: conv (bias), 3x3 conv (bias)


def _second(cin=4, out=64):
    """VoxelBackBone8x: 3x3x3 sparse convs without bias + BatchNorm1d; conv_out kernel (3, 1, 1)."""
    layers = [(cin, 16), (16, 16), (16, 32), (32, 32), (32, 32), (32, 64), (64, 64), (64, 64), (64, 64),
              (64, 64), (64, 64)]
    return sum(27 * i * o + 2 * o for i, o in layers) + 3 * 64 * out + 2 * out


def _message(c):
    return (18 * c * 9 + 18) + (c * 64 * 9 + 64) + (64 * 32 + 32) + (32 * 64 + 64) + (64 * 64 + 64) + (64 * 2 + 2)


def _unet(c, ch=8):
    """DiffusionUNet, ch_mult (1, 1), 2 res blocks, no attention level, on cat(message, x): c + 2 in."""
    block = 2 * ch + 9 * ch * ch + ch + 4 * ch * ch + ch + 2 * ch + 9 * ch * ch + ch
    block2 = 4 * ch + 9 * 2 * ch * ch + ch + 4 * ch * ch + ch + 2 * ch + 9 * ch * ch + ch + 2 * ch * ch + ch
    temb = ch * 4 * ch + 4 * ch + 16 * ch * ch + 4 * ch
    return temb + (9 * (c + 2) * ch + ch) + 4 * block + (9 * ch * ch + ch) + 2 * block + 6 * block2 + \
        (9 * ch * ch + ch) + 2 * ch + 9 * ch * c + c


def _enhancer_read(c):
    """The Enhancer's parameters its forward reads: block_1's norms and FRFN, the split attention."""
    return 4 * c + (c // 4) ** 2 * 9 + (c * 4 * c + 4 * c) + (2 * c * 9 + 2 * c) + (2 * c * c + c) + 2 * c * c + 2 * c


def _enhancer_unread(c, heads=4):
    """block_1.attn and blocks 2 and 3, which the reference holds and never reads (dropped on import)."""
    attn = 5 * heads + (c * c + c) + (2 * c * c + 2 * c) + (c * c + c)
    return attn + 2 * (attn + _enhancer_read(c) - 2 * c * c - 2 * c)


def _heads(c, k=2, classes=1):
    return (c * k * classes + k * classes) + (c * 7 * k * classes + 7 * k * classes) + (c * 2 * k + 2 * k)



def _conv_bn(cin, cout, k=1):
    return k * k * cin * cout + 2 * cout  # conv without bias + BatchNorm2d


# EfficientNet-B0's stages (efficientnet_pytorch's block args): expansion, kernel, in, out, repeats; SE 0.25
B0_STAGES = [(1, 3, 32, 16, 1), (6, 3, 16, 24, 2), (6, 5, 24, 40, 2), (6, 3, 40, 80, 3), (6, 5, 80, 112, 3),
             (6, 5, 112, 192, 4), (6, 3, 192, 320, 1)]


def _efficientnet_b0_trunk():
    """The stem and the 16 MBConv blocks the CamEncode runs (not ``_conv_head``, ``_bn1``, ``_fc``)."""
    n = _conv_bn(3, 32, 3)
    for e, k, cin, cout, repeats in B0_STAGES:
        for r in range(repeats):
            i = cin if r == 0 else cout
            mid, squeeze = i * e, max(1, int(i * 0.25))
            n += (_conv_bn(i, mid) if e != 1 else 0) + k * k * mid + 2 * mid  # expand, depthwise (+ BNs)
            n += (mid * squeeze + squeeze) + (squeeze * mid + mid)  # SE reduce / expand (1x1 convs with bias)
            n += _conv_bn(mid, cout)  # project
    return n


def _resnet101_layers_1_2():
    """torchvision resnet101's conv1, bn1, layer1 (3 bottlenecks) and layer2 (4): CamEncode_Resnet101."""
    n, cin = _conv_bn(3, 64, 7), 64
    for planes, blocks in ((64, 3), (128, 4)):
        for b in range(blocks):
            n += _conv_bn(cin, planes) + _conv_bn(planes, planes, 3) + _conv_bn(planes, 4 * planes)
            if b == 0:
                n += _conv_bn(cin, 4 * planes)  # downsample
            cin = 4 * planes
    return n


def _lss(trunk, depth_bins=48, context=128):
    """lss_submodule.py CamEncode (img_downsample 8: up1 Up(320 + 112, 512), up2 Up(512 + 40, 512)) or
    CamEncode_Resnet101, then depth_head (512 -> D) and image_head (512 -> C), 1x1 convs with bias."""
    up = lambda cin: _conv_bn(cin, 512, 3) + _conv_bn(512, 512, 3)  # noqa: E731  (lss_submodule Up)
    body = _efficientnet_b0_trunk() + up(320 + 112) + up(512 + 40) if trunk == "efficientnet_b0" \
        else _resnet101_layers_1_2()
    return body + 512 * depth_bins + depth_bins + 512 * context + context


PP3 = ([3, 5, 8], [64, 128, 256], [1, 2, 4], [128, 128, 128])
STACKS = {  # (family, type) -> reference parameters of encoder + backbone + shrink header
    ("opv2v_h", "m1"): _pillars() + _base_bev(64, *PP3) + _downsample(384, 128),
    ("opv2v_h", "m3"): _second() + _base_bev(128, [3], [64], [1], [128]) + _downsample(128, 128),
    ("opv2v_h", "m2"): _lss("efficientnet_b0") + _base_bev(128, *PP3) + _downsample(384, 128),
    ("opv2v_h", "m4"): _lss("resnet101") + _base_bev(128, *PP3) + _downsample(384, 128),
    ("dairv2x", "m1"): _pillars() + _base_bev(64, *PP3) + _downsample(384, 128),
    ("dairv2x", "m3"): _second() + _base_bev(128, [3], [64], [1], [128]) + _downsample(128, 128),
    ("v2xreal", "m1"): _pillars() + _base_bev(64, *PP3) + _downsample(384, 256),
    ("v2xreal", "m3"): _pillars() + _base_bev(64, [3], [64], [1], [128]) + _downsample(128, 256),
}
# no documented size difference remains (under protocol reference our SECOND keeps the reference's 2 z
# layers on DAIR's 5 m range too: 128 BEV channels into the backbone's first conv)
EXTRA = {}
# a config whose stack is another published yaml's: OPV2V-H's stage-1 m3 (gencomm/stage1/m3_att.yaml, three levels)
BY_CONFIG = {("opv2v_h", "gencomm_stage1_m3", "m3"): _second() + _base_bev(128, *PP3) + _downsample(384, 128)}
CAMERA_STAGE1 = ("gencomm_stage1_m2", "gencomm_stage1_m4")


def _count(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("family,name", [("opv2v_h", "gencomm_stage1_m1"), ("opv2v_h", "gencomm_stage1_m3"),
                                         ("opv2v_h", "gencomm_stage1_m3_for_stage2"),
                                         ("opv2v_h", "gencomm_stage1_m2"), ("opv2v_h", "gencomm_stage1_m4"),
                                         ("opv2v_h", "gencomm_stage2_m1_m2m3m4"),
                                         ("dairv2x", "gencomm_stage2_m1_m3"), ("v2xreal", "gencomm_stage2_m1_m3"),
                                         ("dairv2x", "m1_intermediate")])
def test_shipped_configs_build_the_reference_architecture(family, name):
    model = build_model(load_experiment(ROOT / "configs" / family / f"{name}.yaml"))
    c = model.channels
    for t, stack in model.encoders.items():
        want = BY_CONFIG.get((family, name, t), STACKS[(family, t)] + EXTRA.get((family, t), 0))
        assert _count(stack) == want, (family, t)
    # the camera stage 1 runs on the reference's +-51.2 m square
    assert model.grid.cell == (1.6, 1.6) and model.grid.shape == ((64, 64) if name in CAMERA_STAGE1 else (64, 128))
    classes = model.anchor_gen.num_classes
    k = model.anchor_gen.num_per_loc // classes  # the reference's anchor_number (rotations)
    # heads: cls anchor_number * num_class^2, reg 7 * anchor_number * num_class (1x1 convs with bias)
    assert _count(model.head.cls) == c * k * classes ** 2 + k * classes ** 2
    assert _count(model.head.reg) == 7 * k * classes * (c + 1)
    if classes == 1:  # V2X-Real's dir head is one per anchor here, per rotation there (docs/protocol.md)
        assert _count(model.head) == _heads(c, k)
    parts = sum(_count(s) for s in model.encoders.values()) + _count(model.head)
    if model.link is not None and type(model.link).__name__ == "GenCommLink":
        for t in model.encoders:  # the reference: one extractor per type, ONE generator and enhancer (the ego's)
            assert _count(model.link.dme[t]) == _message(c)
            assert _count(model.link.safg[t]) == _unet(c)
            assert _count(model.link.enhancer[t]) == _enhancer_read(c)
        parts += _count(model.link)
    assert _count(model) == parts  # nothing else holds parameters (no post-fusion layers, no fusion weights)


def test_the_reference_m1_sizes_the_issue_names():
    assert _base_bev(64, *PP3) == 6_577_408  # plain BaseBEVBackbone (the issue: 6.6M; the residual one 11.4M)
    assert _message(128) == 103_028 and _unet(128) == 43_176 and _enhancer_read(128) == 144_256
    # the camera encoders' figures in docs/interop.md (EfficientNet-B0 for m2, ResNet-101 for m4)
    assert _lss("efficientnet_b0") == 12_942_636 and _lss("resnet101") == 1_535_216
