"""Pyramid Fusion (HEAL's heter_pyramid_collab) against an independent restatement of HEAL's computation.

State dicts are built by hand in HEAL's layout (``pyramid_backbone.resnet.layer<i>.<j>.*`` ResNeXt
bottlenecks, ``pyramid_backbone.deblocks.<i>``, ``pyramid_backbone.single_head_<i>``, ``shrink_conv``,
``cls/reg/dir_head``), imported, and the fused feature is compared with a functional restatement of
HEAL's ``PyramidFusion.forward_collab`` + ``shrink_conv`` written here from those tensors (F.conv2d,
F.batch_norm, normalize_pairwise_tfm's affine, grid_sample, softmax over agents). The foreground loss
is compared with a restatement of ``PointPillarPyramidLoss.calc_occ_loss``.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from opencood_ext.interop.weights import import_reference_state
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.models.pyramid_fusion import PyramidFusion

RANGE = (-12.8, -6.4, -3.0, 12.8, 6.4, 1.0)
VOXEL = (0.4, 0.4, 4.0)
C = 8
FUSION = dict(layer_nums=[1, 2, 1], layer_strides=[1, 2, 2], num_filters=[16, 32, 64], upsample_strides=[1, 2, 4],
              num_upsample_filters=[8, 8, 8], resnext=True,
              shrink={"kernel_size": [3], "stride": [1], "padding": [1], "dims": [16]},
              occupancy_weights=[0.4, 0.2, 0.1], occupancy_pos_weight=2.0)
TYPES = {"m1": {"encoder": {"type": "pointpillars", "voxel_size": list(VOXEL), "num_filters": [C]},
                "backbone": {"type": "resnet_bev", "layer_nums": [1], "layer_strides": [2], "num_filters": [C],
                             "upsample_strides": [], "num_upsample_filters": [], "norm_eps": 1e-5},
                "shrink": {"type": "none"}}}


def _model() -> CooperativeDetector:
    return CooperativeDetector(TYPES, RANGE, fusion="pyramid", fusion_op="pyramid", fusion_args=FUSION,
                               link={"type": "full_feature"}).eval()


def _bn(g, prefix, n, ref):
    ref[prefix + "weight"] = torch.rand(n, generator=g) + 0.5
    ref[prefix + "bias"] = torch.randn(n, generator=g) * 0.1
    ref[prefix + "running_mean"] = torch.randn(n, generator=g) * 0.1
    ref[prefix + "running_var"] = torch.rand(n, generator=g) + 0.5
    ref[prefix + "num_batches_tracked"] = torch.tensor(7)


def _conv(g, shape, scale=None):
    fan_in = math.prod(shape[1:])
    return torch.randn(*shape, generator=g) * (scale or 1.0 / math.sqrt(fan_in))


def heal_state(seed=0, fusion=FUSION, cin=C, head_in=16):
    """HEAL-layout keys of the pyramid backbone, shrink_conv and heads (random weights and BN statistics)
    for the fusion arguments ``fusion`` on ``cin``-wide features."""
    g = torch.Generator().manual_seed(seed)
    ref = {}
    for i, (num, stride, cout) in enumerate(zip(fusion["layer_nums"], fusion["layer_strides"], fusion["num_filters"])):
        width = (cout * 4 // 64) * 32
        for j in range(num):
            p = f"pyramid_backbone.resnet.layer{i}.{j}."
            ref[p + "conv1.weight"] = _conv(g, (width, cin, 1, 1))
            _bn(g, p + "bn1.", width, ref)
            ref[p + "conv2.weight"] = _conv(g, (width, width // 32, 3, 3))
            _bn(g, p + "bn2.", width, ref)
            ref[p + "conv3.weight"] = _conv(g, (cout, width, 1, 1))
            _bn(g, p + "bn3.", cout, ref)
            if j == 0 and (stride != 1 or cin != cout):
                ref[p + "downsample.0.weight"] = _conv(g, (cout, cin, 1, 1))
                _bn(g, p + "downsample.1.", cout, ref)
            cin = cout
        up, cu = fusion["upsample_strides"][i], fusion["num_upsample_filters"][i]
        ref[f"pyramid_backbone.deblocks.{i}.0.weight"] = _conv(g, (cout, cu, up, up), 1.0 / math.sqrt(cout))
        _bn(g, f"pyramid_backbone.deblocks.{i}.1.", cu, ref)
        ref[f"pyramid_backbone.single_head_{i}.weight"] = _conv(g, (1, cout, 1, 1))
        ref[f"pyramid_backbone.single_head_{i}.bias"] = torch.randn(1, generator=g) * 0.5
    width = sum(fusion["num_upsample_filters"])
    ref["shrink_conv.layers.0.double_conv.0.weight"] = _conv(g, (head_in, width, 3, 3))
    ref["shrink_conv.layers.0.double_conv.0.bias"] = torch.randn(head_in, generator=g) * 0.1
    ref["shrink_conv.layers.0.double_conv.2.weight"] = _conv(g, (head_in, head_in, 3, 3))
    ref["shrink_conv.layers.0.double_conv.2.bias"] = torch.randn(head_in, generator=g) * 0.1
    for name, out in (("cls_head", 2), ("reg_head", 14), ("dir_head", 4)):
        ref[f"{name}.weight"] = _conv(g, (out, head_in, 1, 1))
        ref[f"{name}.bias"] = torch.randn(out, generator=g) * 0.1
    return ref


# ---------------------------------------------------------------- HEAL, restated from its tensors
def _bn_eval(x, ref, p, eps):
    return F.batch_norm(x, ref[p + "running_mean"], ref[p + "running_var"], ref[p + "weight"], ref[p + "bias"],
                        training=False, eps=eps)


def _heal_levels(x, ref):
    out = []
    for i, (num, stride) in enumerate(zip(FUSION["layer_nums"], FUSION["layer_strides"])):
        for j in range(num):
            p = f"pyramid_backbone.resnet.layer{i}.{j}."
            s = stride if j == 0 else 1
            y = F.relu(_bn_eval(F.conv2d(x, ref[p + "conv1.weight"]), ref, p + "bn1.", 1e-5))
            y = F.relu(_bn_eval(F.conv2d(y, ref[p + "conv2.weight"], stride=s, padding=1, groups=32), ref, p + "bn2.",
                                1e-5))
            y = _bn_eval(F.conv2d(y, ref[p + "conv3.weight"]), ref, p + "bn3.", 1e-5)
            idt = x
            if p + "downsample.0.weight" in ref:
                idt = _bn_eval(F.conv2d(x, ref[p + "downsample.0.weight"], stride=s), ref, p + "downsample.1.", 1e-5)
            x = F.relu(y + idt)
        out.append(x)
    return out


def _heal_affine(T_ego_from_agent):
    """normalize_pairwise_tfm of the ego's row: T_{agent <- ego} -> (N, 2, 3) on a range centred at 0, in
    float64 as the reference's collated pairwise matrices."""
    W, H = RANGE[3] - RANGE[0], RANGE[4] - RANGE[1]
    t = torch.linalg.inv(T_ego_from_agent.double())
    a = t[:, [0, 1], :][:, :, [0, 1, 3]].clone()
    a[:, 0, 1] *= H / W
    a[:, 1, 0] *= W / H
    a[:, 0, 2] = a[:, 0, 2] / W * 2
    a[:, 1, 2] = a[:, 1, 2] / H * 2
    return a


def _heal_weighted_fuse(x, score, counts, affine):
    out, start = [], 0
    for n in counts:
        m = affine[start:start + n]
        size = [n, x.shape[1], x.shape[2], x.shape[3]]
        # warp_affine_simple: the grid from the float64 matrix, cast to the map's dtype (.to(src))
        feat = F.grid_sample(x[start:start + n], F.affine_grid(m, size, align_corners=False).to(x),
                             align_corners=False)
        sc = F.grid_sample(score[start:start + n],
                           F.affine_grid(m, [n, 1, *x.shape[2:]], align_corners=False).to(score), align_corners=False)
        sc = torch.softmax(sc.masked_fill(sc == 0, -float("inf")), dim=0)
        sc = torch.where(torch.isnan(sc), torch.zeros_like(sc), sc)
        out.append((feat * sc).sum(0))
        start += n
    return torch.stack(out)


def heal_collab(x, counts, T, ref):
    levels = _heal_levels(x, ref)
    affine = _heal_affine(T)
    fused, occ = [], []
    for i, f in enumerate(levels):
        o = F.conv2d(f, ref[f"pyramid_backbone.single_head_{i}.weight"], ref[f"pyramid_backbone.single_head_{i}.bias"])
        occ.append(o)
        fused.append(_heal_weighted_fuse(f, torch.sigmoid(o) + 1e-4, counts, affine))
    ups = []
    for i, f in enumerate(fused):
        s = FUSION["upsample_strides"][i]
        y = F.conv_transpose2d(f, ref[f"pyramid_backbone.deblocks.{i}.0.weight"], stride=s)
        ups.append(F.relu(_bn_eval(y, ref, f"pyramid_backbone.deblocks.{i}.1.", 1e-3)))
    y = torch.cat(ups, 1)
    y = F.relu(F.conv2d(y, ref["shrink_conv.layers.0.double_conv.0.weight"],
                        ref["shrink_conv.layers.0.double_conv.0.bias"], padding=1))
    y = F.relu(F.conv2d(y, ref["shrink_conv.layers.0.double_conv.2.weight"],
                        ref["shrink_conv.layers.0.double_conv.2.bias"], padding=1))
    return y, occ


def _pose(x, y, yaw_deg):
    a = math.radians(yaw_deg)
    T = torch.eye(4)
    T[0, 0], T[0, 1], T[1, 0], T[1, 1] = math.cos(a), -math.sin(a), math.sin(a), math.cos(a)
    T[0, 3], T[1, 3] = x, y
    return T


def test_heal_checkpoint_imports_and_fuses_as_heal_does():
    model = _model()
    assert model.grid.shape == (16, 32) and isinstance(model.fuse, PyramidFusion)
    ref = heal_state()
    mapping = import_reference_state(ref, model, partial=True)
    assert {"fuse", "head"} <= set(mapping.matched)
    assert not mapping.unused, mapping.unused[:5]
    model.load_state_dict(mapping.state, strict=False)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, C, 16, 32, generator=g)
    counts = [2, 3]  # sample 0: ego + 1, sample 1: ego + 2
    T = torch.stack([torch.eye(4), _pose(3.0, -1.5, 20.0), torch.eye(4), _pose(-4.0, 2.0, -35.0),
                     _pose(1.2, 0.8, 90.0)])
    with torch.no_grad():
        ours, occ = model.fuse.collab(x, counts, T, RANGE)
        want, want_occ = heal_collab(x, counts, T, ref)
    assert ours.shape == want.shape == (2, 16, 16, 32)
    scale = float(want.abs().max())
    assert scale > 0.1
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-5 * scale)
    for a, b in zip(occ, want_occ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * float(b.abs().max()))
    # the head reads the fused map: HEAL's cls_head on it
    with torch.no_grad():
        cls = model.head(ours).cls
    torch.testing.assert_close(cls, F.conv2d(want, ref["cls_head.weight"], ref["cls_head.bias"]),
                               rtol=0, atol=1e-5 * scale)


def test_a_sample_alone_is_heal_forward_single():
    """One agent: HEAL's forward_single (no warp, the softmax of one score is 1)."""
    model = _model()
    ref = heal_state(seed=1)
    model.load_state_dict(import_reference_state(ref, model, partial=True).state, strict=False)
    x = torch.randn(1, C, 16, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ours, _ = model.fuse.collab(x, [1], torch.eye(4)[None], RANGE)
        y = heal_upsample_shrink(_heal_levels(x, ref), ref)
    torch.testing.assert_close(ours, y, rtol=0, atol=1e-5 * float(y.abs().max()))


def heal_upsample_shrink(levels, sd):
    """HEAL's pyramid decoding of the (fused) levels: each level's deblock (transposed conv, BN, ReLU),
    concatenated, then the DownsampleConv ``shrink_conv`` (two 3x3 conv + ReLU)."""
    ups = [F.relu(_bn_eval(F.conv_transpose2d(f, sd[f"pyramid_backbone.deblocks.{i}.0.weight"],
                                              stride=FUSION["upsample_strides"][i]),
                           sd, f"pyramid_backbone.deblocks.{i}.1.", 1e-3)) for i, f in enumerate(levels)]
    y = torch.cat(ups, 1)
    for k in (0, 2):
        y = F.relu(F.conv2d(y, sd[f"shrink_conv.layers.0.double_conv.{k}.weight"],
                            sd[f"shrink_conv.layers.0.double_conv.{k}.bias"], padding=1))
    return y


def test_heal_m1_base_widths_import_whole():
    """HEAL's stage-1 m1 base (64 in; [3, 5, 8] ResNeXt levels 64 / 128 / 256; deblocks to 128 each; shrink
    384 -> 256): every hand-built HEAL key finds its module, and the counts are HEAL's."""
    heal = dict(FUSION, layer_nums=[3, 5, 8], num_filters=[64, 128, 256], num_upsample_filters=[128, 128, 128],
                shrink={"kernel_size": [3], "stride": [1], "padding": [1], "dims": [256]})
    types = {"m1": dict(TYPES["m1"], encoder={"type": "pointpillars", "voxel_size": list(VOXEL), "num_filters": [64]},
                        backbone=dict(TYPES["m1"]["backbone"], num_filters=[64]))}
    model = CooperativeDetector(types, RANGE, fusion="pyramid", fusion_op="pyramid", fusion_args=heal,
                                link={"type": "full_feature"})
    ref = heal_state(fusion=heal, cin=64, head_in=256)
    mapping = import_reference_state(ref, model, partial=True)
    assert {"fuse", "head"} <= set(mapping.matched) and not mapping.unused
    pyramid = [k for k in ref if k.startswith(("pyramid_backbone.", "shrink_conv.")) and "running" not in k
               and "num_batches" not in k]
    assert sum(ref[k].numel() for k in pyramid) == sum(p.numel() for p in model.fuse.parameters()) == 5_232_707


def test_convnext_aligner_imports_and_runs_as_heal():
    """HEAL's AlignNet(convnext) after a type's backbone: hand-built aligner_<m>.channel_align.model.<k>.*
    keys import, and the stack's aligner equals a restatement of HEAL's ConvNeXt blocks."""
    types = {"m1": dict(TYPES["m1"], aligner={"type": "convnext", "num_blocks": 2})}
    model = CooperativeDetector(types, RANGE, fusion="pyramid", fusion_op="pyramid", fusion_args=FUSION,
                                link={"type": "full_feature"}).eval()
    g = torch.Generator().manual_seed(6)
    ref = {}
    for k in range(2):
        p = f"aligner_m1.channel_align.model.{k}."
        ref[p + "dwconv.weight"], ref[p + "dwconv.bias"] = _conv(g, (C, 1, 7, 7)), torch.randn(C, generator=g) * 0.1
        ref[p + "norm.weight"], ref[p + "norm.bias"] = torch.rand(C, generator=g) + 0.5, torch.randn(C, generator=g) * 0.1
        ref[p + "pwconv1.weight"], ref[p + "pwconv1.bias"] = _conv(g, (4 * C, C)), torch.randn(4 * C, generator=g) * 0.1
        ref[p + "pwconv2.weight"], ref[p + "pwconv2.bias"] = _conv(g, (C, 4 * C)), torch.randn(C, generator=g) * 0.1
        ref[p + "gamma"] = torch.rand(C, generator=g) + 0.2
    mapping = import_reference_state(ref, model, partial=True)
    assert "encoders.m1.aligner" in mapping.matched and not mapping.unused
    model.load_state_dict(mapping.state, strict=False)
    x = torch.randn(2, C, 16, 32, generator=g)
    want = x
    for k in range(2):
        p = f"aligner_m1.channel_align.model.{k}."
        y = F.conv2d(want, ref[p + "dwconv.weight"], ref[p + "dwconv.bias"], padding=3, groups=C).permute(0, 2, 3, 1)
        u, v = y.mean(-1, keepdim=True), y.var(-1, unbiased=False, keepdim=True)
        y = (y - u) / torch.sqrt(v + 1e-6) * ref[p + "norm.weight"] + ref[p + "norm.bias"]
        y = F.linear(F.gelu(F.linear(y, ref[p + "pwconv1.weight"], ref[p + "pwconv1.bias"])),
                     ref[p + "pwconv2.weight"], ref[p + "pwconv2.bias"])
        want = want + (ref[p + "gamma"] * y).permute(0, 3, 1, 2)
    with torch.no_grad():
        got = model.encoders["m1"].aligner(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))


def heal_occ_loss(occ_list, pos_equal_one, neg_equal_one, relative_downsample, weights, pos_cls_weight, alpha, gamma):
    """PointPillarPyramidLoss.calc_occ_loss, restated (its sigmoid_focal_loss written out)."""
    n = pos_equal_one.shape[0]
    occ_pos = torch.logical_or(pos_equal_one[..., 0], pos_equal_one[..., 1]).unsqueeze(-1).float()
    occ_neg = torch.logical_and(neg_equal_one[..., 0], neg_equal_one[..., 1]).unsqueeze(-1).float()
    total = 0
    for i, o in enumerate(occ_list):
        k = relative_downsample[i]
        pos = F.max_pool2d(occ_pos.permute(0, 3, 1, 2), kernel_size=k).permute(0, 2, 3, 1).reshape(n, -1, 1)
        neg = (1 - F.max_pool2d((1 - occ_neg).permute(0, 3, 1, 2), kernel_size=k)).permute(0, 2, 3, 1).reshape(n, -1, 1)
        norm = pos.sum(1, keepdim=True)
        preds = o.permute(0, 2, 3, 1).reshape(n, -1, 1)
        w = (pos * pos_cls_weight + neg) / torch.clamp(norm, min=1.0)
        ce = torch.clamp(preds, min=0) - preds * pos + torch.log1p(torch.exp(-torch.abs(preds)))
        p = torch.sigmoid(preds)
        p_t = pos * p + (1 - pos) * (1 - p)
        loss = torch.pow(1 - p_t, gamma) * (pos * alpha + (1 - pos) * (1 - alpha)) * ce * w
        total = total + loss.sum() / n * weights[i]
    return total


def test_foreground_loss_is_heal_calc_occ_loss():
    model = _model()
    g = torch.Generator().manual_seed(5)
    labels = torch.randint(-1, 2, (3, 32, 64, 2), generator=g)
    labels[labels == 1] = torch.where(torch.rand(int((labels == 1).sum()), generator=g) < 0.1, 1, 0)
    occ = [torch.randn(3, 1, 32 // s, 64 // s, generator=g) for s in (1, 2, 4)]
    ours = model.fuse.occupancy_loss(occ, labels, alpha=0.25, gamma=2.0)
    want = heal_occ_loss(occ, (labels == 1).float(), (labels == 0).float(), [1, 2, 4], [0.4, 0.2, 0.1], 2.0, 0.25, 2.0)
    assert float(want) > 0
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=0)


def test_fusion_methods_that_skip_the_pyramid_are_refused_in_one_line():
    """none / late / early detect on an agent's own feature; a pyramid model's head reads the pyramid's
    wider output, so they would fail deep in torch: refused when set, naming the widths."""
    from test_registry_contract import FUSION_OP_ARGS, RANGE, TYPES

    model = CooperativeDetector(TYPES, RANGE, fusion="pyramid", fusion_op="pyramid",
                                fusion_args=FUSION_OP_ARGS["pyramid"])
    for name in ("none", "late", "early"):
        with pytest.raises(ValueError, match=rf"fusion '{name}' detects on an agent's own 8-channel feature, but this "
                                             r"model's head reads its fusion op's 16 channels \(PyramidFusion\)"):
            model.set_fusion(name)
    assert model.method.name == "pyramid"
