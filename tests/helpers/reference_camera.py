"""The reference LSS camera encoder for the interop tests, written out by hand from the public source
(jeffreychou777/GenComm and yifanlu0227/HEAL ``opencood/models/heter_encoders.py`` LiftSplatShoot,
``sub_modules/lss_submodule.py`` CamEncode / CamEncode_Resnet101 / Up, ``utils/camera_utils.py``), the
``efficientnet_pytorch`` package (EfficientNet-B0 as ``EfficientNet.from_pretrained`` builds it) and
torchvision's ResNet-101:

* key lists with shapes of ``encoder_<m>.camencode.*`` (:func:`efficientnet_camencode`,
  :func:`resnet101_camencode`), filled by :func:`random_state`;
* the reference's computation with torch.nn.functional in the reference's parameter names and order
  (:func:`reference_bev`): CamEncode, create_frustum / get_geometry (no image augmentation:
  post_rots = I, post_trans = 0), voxel_pooling with its sort-and-cumsum trick. Paddings are computed
  the TensorFlow-"same" way per input size, which equals the package's static ones for inputs that
  are multiples of 32.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F

BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
# EfficientNet-B0 stages: expand ratio, kernel, stride, output width, repeats (stem 32)
B0 = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
      (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]
# the reference's matrix turning its OpenCV camera axes into OPV2V's UE4 camera axes
UE4_FROM_OPENCV = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, -1.0, 0.0]], dtype=torch.float64)


def _bn(prefix, c):
    return {f"{prefix}.{p}": ((c,) if p != "num_batches_tracked" else ()) for p in BN}


def _b0_blocks():
    """(input width, expand, kernel, stride, output width) of the 16 MBConv blocks."""
    out, cin = [], 32
    for e, k, s, c, r in B0:
        for j in range(r):
            out.append((cin, e, k, s if j == 0 else 1, c))
            cin = c
    return out


def efficientnet_camencode(prefix, D, C, downsample):
    """CamEncode: trunk (the whole EfficientNet-B0, classifier included), up1 (320+112 -> 512),
    up2 (512+40 -> 512, when downsample is 8), depth_head, image_head."""
    t = f"{prefix}.camencode.trunk"
    shapes = {f"{t}._conv_stem.weight": (32, 3, 3, 3), **_bn(f"{t}._bn0", 32)}
    for i, (cin, e, k, s, c) in enumerate(_b0_blocks()):
        b, mid = f"{t}._blocks.{i}", cin * e
        if e != 1:
            shapes[f"{b}._expand_conv.weight"] = (mid, cin, 1, 1)
            shapes.update(_bn(f"{b}._bn0", mid))
        shapes[f"{b}._depthwise_conv.weight"] = (mid, 1, k, k)
        shapes.update(_bn(f"{b}._bn1", mid))
        sq = max(1, int(cin * 0.25))
        shapes.update({f"{b}._se_reduce.weight": (sq, mid, 1, 1), f"{b}._se_reduce.bias": (sq,),
                       f"{b}._se_expand.weight": (mid, sq, 1, 1), f"{b}._se_expand.bias": (mid,),
                       f"{b}._project_conv.weight": (c, mid, 1, 1)})
        shapes.update(_bn(f"{b}._bn2", c))
    shapes.update({f"{t}._conv_head.weight": (1280, 320, 1, 1), **_bn(f"{t}._bn1", 1280),
                   f"{t}._fc.weight": (1000, 1280), f"{t}._fc.bias": (1000,)})
    ups = [("up1", 320 + 112)] + ([("up2", 512 + 40)] if downsample == 8 else [])
    for name, cin in ups:
        u = f"{prefix}.camencode.{name}.conv"
        shapes.update({f"{u}.0.weight": (512, cin, 3, 3), **_bn(f"{u}.1", 512), f"{u}.3.weight": (512, 512, 3, 3),
                       **_bn(f"{u}.4", 512)})
    return {**shapes, **_heads(prefix, D, C)}


def _heads(prefix, D, C):
    c = f"{prefix}.camencode"
    return {f"{c}.depth_head.weight": (D, 512, 1, 1), f"{c}.depth_head.bias": (D,),
            f"{c}.image_head.weight": (C, 512, 1, 1), f"{c}.image_head.bias": (C,)}


def resnet101_camencode(prefix, D, C):
    """CamEncode_Resnet101: torchvision ResNet-101's conv1, bn1, layer1 (3 bottlenecks), layer2 (4)."""
    c = f"{prefix}.camencode"
    shapes = {f"{c}.conv1.weight": (64, 3, 7, 7), **_bn(f"{c}.bn1", 64)}
    cin = 64
    for layer, (blocks, width) in enumerate([(3, 64), (4, 128)], start=1):
        for j in range(blocks):
            b = f"{c}.layer{layer}.{j}"
            shapes.update({f"{b}.conv1.weight": (width, cin, 1, 1), **_bn(f"{b}.bn1", width),
                           f"{b}.conv2.weight": (width, width, 3, 3), **_bn(f"{b}.bn2", width),
                           f"{b}.conv3.weight": (4 * width, width, 1, 1), **_bn(f"{b}.bn3", 4 * width)})
            if j == 0:
                shapes.update({f"{b}.downsample.0.weight": (4 * width, cin, 1, 1),
                               **_bn(f"{b}.downsample.1", 4 * width)})
            cin = 4 * width
    return {**shapes, **_heads(prefix, D, C)}


def random_state(shapes, seed):
    """Weights of fan-in scale (so a deep trunk neither explodes nor vanishes), BN statistics near 0 / 1."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, shape in shapes.items():
        if k.endswith("num_batches_tracked"):
            out[k] = torch.tensor(11)
        elif k.endswith("running_var"):
            out[k] = torch.rand(shape, generator=g) * 0.5 + 0.75
        elif k.endswith("running_mean") or len(shape) == 1:
            out[k] = torch.randn(shape, generator=g) * 0.1 + (1.0 if k.endswith("weight") else 0.0)
        else:
            out[k] = torch.randn(shape, generator=g) / math.sqrt(np.prod(shape[1:]))
    return out


# ---------------------------------------------------------------- the reference's computation
def _norm(w, p, x, eps):
    return F.batch_norm(x, w[f"{p}.running_mean"], w[f"{p}.running_var"], w[f"{p}.weight"], w[f"{p}.bias"],
                        False, 0.0, eps)


def _tf_same(x, k, s):
    pads = []
    for n in (x.shape[3], x.shape[2]):
        total = max((math.ceil(n / s) - 1) * s + k - n, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads)


def _swish(x):
    return x * torch.sigmoid(x)


def _efficientnet(w, t, x):
    x = _swish(_norm(w, f"{t}._bn0", F.conv2d(_tf_same(x, 3, 2), w[f"{t}._conv_stem.weight"], stride=2), 1e-3))
    endpoints, prev = [], x
    for i, (cin, e, k, s, c) in enumerate(_b0_blocks()):
        b, inp = f"{t}._blocks.{i}", x
        if e != 1:
            x = _swish(_norm(w, f"{b}._bn0", F.conv2d(x, w[f"{b}._expand_conv.weight"]), 1e-3))
        x = F.conv2d(_tf_same(x, k, s), w[f"{b}._depthwise_conv.weight"], stride=s, groups=x.shape[1])
        x = _swish(_norm(w, f"{b}._bn1", x, 1e-3))
        sq = F.conv2d(F.adaptive_avg_pool2d(x, 1), w[f"{b}._se_reduce.weight"], w[f"{b}._se_reduce.bias"])
        sq = F.conv2d(_swish(sq), w[f"{b}._se_expand.weight"], w[f"{b}._se_expand.bias"])
        x = _norm(w, f"{b}._bn2", F.conv2d(torch.sigmoid(sq) * x, w[f"{b}._project_conv.weight"]), 1e-3)
        if s == 1 and cin == c:
            x = x + inp
        if prev.size(2) > x.size(2):
            endpoints.append(prev)
        prev = x
    return endpoints + [x]


def _up(w, u, x1, x2):
    x = torch.cat([x2, F.interpolate(x1, scale_factor=2, mode="bilinear", align_corners=True)], dim=1)
    x = F.relu(_norm(w, f"{u}.1", F.conv2d(x, w[f"{u}.0.weight"], padding=1), 1e-5))
    return F.relu(_norm(w, f"{u}.4", F.conv2d(x, w[f"{u}.3.weight"], padding=1), 1e-5))


def _resnet(w, c, x):
    x = F.max_pool2d(F.relu(_norm(w, f"{c}.bn1", F.conv2d(x, w[f"{c}.conv1.weight"], stride=2, padding=3), 1e-5)),
                     3, 2, 1)
    for layer, blocks in ((1, 3), (2, 4)):
        for j in range(blocks):
            b, s = f"{c}.layer{layer}.{j}", (2 if layer == 2 and j == 0 else 1)
            y = F.relu(_norm(w, f"{b}.bn1", F.conv2d(x, w[f"{b}.conv1.weight"]), 1e-5))
            y = F.relu(_norm(w, f"{b}.bn2", F.conv2d(y, w[f"{b}.conv2.weight"], stride=s, padding=1), 1e-5))
            y = _norm(w, f"{b}.bn3", F.conv2d(y, w[f"{b}.conv3.weight"]), 1e-5)
            if j == 0:
                x = _norm(w, f"{b}.downsample.1", F.conv2d(x, w[f"{b}.downsample.0.weight"], stride=s), 1e-5)
            x = F.relu(y + x)
    return x


def camencode(w, prefix, trunk, downsample, x):
    """-> (depth logits (B, D, h, w), new_x (B, C, D, h, w))."""
    c = f"{prefix}.camencode"
    if trunk == "efficientnet_b0":
        e = _efficientnet(w, f"{c}.trunk", x)
        feats = _up(w, f"{c}.up1.conv", e[4], e[3])
        if downsample == 8:
            feats = _up(w, f"{c}.up2.conv", feats, e[2])
    else:
        feats = _resnet(w, c, x)
    logit = F.conv2d(feats, w[f"{c}.depth_head.weight"], w[f"{c}.depth_head.bias"])
    img = F.conv2d(feats, w[f"{c}.image_head.weight"], w[f"{c}.image_head.bias"])
    return logit, logit.softmax(dim=1).unsqueeze(1) * img.unsqueeze(2)


def depth_discretization(dmin, dmax, n, mode):
    if mode == "UD":
        return dmin + (dmax - dmin) / n * np.arange(n)
    size = 2 * (dmax - dmin) / (n * (1 + n))
    return dmin + size * (np.arange(n) * np.arange(1, 1 + n)) / 2


def reference_bev(w, prefix, trunk, downsample, ddiscr, mode, bounds, imgs, rots, trans, intrins):
    """heter_encoders.LiftSplatShoot.forward: imgs (B, N, 3, H, W), rots / trans / intrins the reference's
    camera (OpenCV axes) -> LiDAR rotation, translation and intrinsics. Geometry and pooling in float64."""
    B, N, _, H, W = imgs.shape
    logit, new_x = camencode(w, prefix, trunk, downsample, imgs.view(B * N, 3, H, W))
    fH, fW = H // downsample, W // downsample
    C, D = new_x.shape[1], new_x.shape[2]
    x = new_x.view(B, N, C, D, fH, fW).permute(0, 1, 3, 4, 5, 2)
    # create_frustum
    ds = torch.tensor(depth_discretization(*ddiscr, mode), dtype=torch.float64).view(-1, 1, 1).expand(-1, fH, fW)
    xs = torch.linspace(0, W - 1, fW, dtype=torch.float64).view(1, 1, fW).expand(D, fH, fW)
    ys = torch.linspace(0, H - 1, fH, dtype=torch.float64).view(1, fH, 1).expand(D, fH, fW)
    frustum = torch.stack((xs, ys, ds), -1)
    # get_geometry (post_rots = I, post_trans = 0)
    points = frustum.expand(B, N, D, fH, fW, 3).unsqueeze(-1)
    points = torch.cat((points[..., :2, :] * points[..., 2:3, :], points[..., 2:3, :]), -2)
    combine = rots.matmul(torch.inverse(intrins))
    geom = combine.view(B, N, 1, 1, 1, 3, 3).matmul(points).squeeze(-1) + trans.view(B, N, 1, 1, 1, 3)
    # voxel_pooling (gen_dx_bx; ranks, argsort, cumsum trick)
    dx = torch.tensor([b[2] for b in bounds], dtype=torch.float64)
    bx = torch.tensor([b[0] + b[2] / 2.0 for b in bounds], dtype=torch.float64)
    nx = torch.LongTensor([int((b[1] - b[0]) / b[2]) for b in bounds])
    P = B * N * D * fH * fW
    feats = x.reshape(P, C).double()
    g = ((geom - (bx - dx / 2.0)) / dx).long().view(P, 3)
    g = torch.cat((g, torch.arange(B).repeat_interleave(P // B)[:, None]), 1)
    kept = ((g[:, 0] >= 0) & (g[:, 0] < nx[0]) & (g[:, 1] >= 0) & (g[:, 1] < nx[1])
            & (g[:, 2] >= 0) & (g[:, 2] < nx[2]))
    feats, g = feats[kept], g[kept]
    ranks = g[:, 0] * (nx[1] * nx[2] * B) + g[:, 1] * (nx[2] * B) + g[:, 2] * B + g[:, 3]
    order = ranks.argsort()
    feats, g, ranks = feats[order], g[order], ranks[order]
    feats = feats.cumsum(0)
    last = torch.ones(feats.shape[0], dtype=torch.bool)
    last[:-1] = ranks[1:] != ranks[:-1]
    feats, g = feats[last], g[last]
    feats = torch.cat((feats[:1], feats[1:] - feats[:-1]))
    final = torch.zeros((B, C, int(nx[2]), int(nx[1]), int(nx[0])), dtype=torch.float64)
    final[g[:, 3], :, g[:, 2], g[:, 1], g[:, 0]] = feats
    return torch.cat(final.unbind(dim=2), 1), logit
