"""Encoders (PointPillars, SECOND, LSS), backbone, encoder stack and the config registry."""
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from opencood_ext.data.voxelize import Voxelizer, collate_voxels
from opencood_ext.models import REGISTRY, EncoderStack, build
from opencood_ext.models.backbone import ResNetBEVBackbone
from opencood_ext.data.inputs import CameraInput, LidarInput
from opencood_ext.models.lss import LSSEncoder, depth_loss, frustum_points, splat
from opencood_ext.models.pointpillars import PillarFeatureNet, PointPillarEncoder, scatter_to_bev
from opencood_ext.models.second import SecondEncoder, install_cpu_stream_shim

torch.set_num_threads(1)
RANGE = [-6.4, -3.2, -3.0, 6.4, 3.2, 1.0]  # 12.8 x 6.4 m
BACKBONE = {"layer_nums": [1, 1], "layer_strides": [2, 2], "num_filters": [16, 32],
            "upsample_strides": [1, 2], "num_upsample_filters": [16, 16]}
FIXTURE = Path(__file__).resolve().parents[4] / "shared" / "fixtures"


def _cloud(n, seed):
    g = torch.Generator().manual_seed(seed)
    lo, hi = torch.tensor(RANGE[:3]), torch.tensor(RANGE[3:])
    xyz = lo + torch.rand(n, 3, generator=g) * (hi - lo)
    return torch.cat([xyz, torch.rand(n, 1, generator=g)], dim=1)


def _lidar(voxel_size, max_points=8, clouds=(300, 200)):
    vox = Voxelizer(voxel_size, RANGE, max_points_per_voxel=max_points)
    return LidarInput.from_batch(collate_voxels([vox(_cloud(n, i)) for i, n in enumerate(clouds)]), len(clouds))


def _stack(encoder, backbone=BACKBONE):
    return EncoderStack(encoder, backbone, RANGE, shrink_channels=32)


# ---------------------------------------------------------------- PointPillars
def test_pillar_augmented_features_by_hand():
    pfn = PillarFeatureNet([0.4, 0.4, 4.0], RANGE)
    voxels = torch.zeros(1, 3, 4)
    voxels[0, :2] = torch.tensor([[0.1, 0.1, -1.0, 0.5], [0.3, 0.2, -2.0, 1.0]])
    coords = torch.tensor([[0, 0, 8, 16]])  # a, z, y, x: centre x = -6.4 + 16.5*0.4 = 0.2, y = 0.2, z = -1
    f = pfn.augment(voxels, torch.tensor([2]), coords)
    np.testing.assert_allclose(f[0, 0].numpy(), [0.1, 0.1, -1.0, 0.5, -0.1, -0.05, 0.5, -0.1, -0.1, 0.0],
                               atol=1e-5)
    assert torch.all(f[0, 2] == 0)


def test_pillar_padding_is_ignored():
    torch.manual_seed(0)
    pfn = PillarFeatureNet([0.4, 0.4, 4.0], RANGE, num_filters=(8, 16)).eval()
    data = _lidar([0.4, 0.4, 4.0])
    ref = pfn(data.voxels, data.num_points, data.coords)
    garbage = data.voxels.clone()
    pad = torch.arange(garbage.shape[1])[None] >= data.num_points[:, None]
    garbage[pad] = 1e3
    assert torch.allclose(pfn(garbage, data.num_points, data.coords), ref)


def test_point_lands_in_expected_bev_cell():
    enc = PointPillarEncoder(RANGE, [0.4, 0.4, 4.0], num_filters=(16,)).eval()
    vox = Voxelizer(enc.voxel_size, RANGE)
    # x = 1.3 -> col (1.3 + 6.4) / 0.4 = 19.25 -> 19; y = -2.9 -> row 0.75 -> 0
    # x = -6.3 -> col 0; y = 3.1 -> row 15
    clouds = [np.array([[1.3, -2.9, -1.0, 0.5]], np.float32), np.array([[-6.3, 3.1, 0.0, 0.9]], np.float32)]
    data = LidarInput.from_batch(collate_voxels([vox(c) for c in clouds]), 2)
    bev = enc(data).bev
    assert bev.shape == (2, 16, 16, 32)
    occupied = [tuple(x) for x in (bev.abs().sum(1) > 0).nonzero().tolist()]
    assert occupied == [(0, 0, 19), (1, 15, 0)]


def test_scatter_to_bev_places_features():
    feats = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    coords = torch.tensor([[1, 0, 2, 3], [0, 0, 0, 1]])
    bev = scatter_to_bev(feats, coords, 2, (4, 5))
    assert bev[1, :, 2, 3].tolist() == [1.0, 2.0] and bev[0, :, 0, 1].tolist() == [3.0, 4.0]
    assert bev.abs().sum() == 10.0


# ---------------------------------------------------------------- SECOND
def test_second_cpu_shim_and_backward():
    assert install_cpu_stream_shim() is (not torch.cuda.is_available())
    stack = _stack({"type": "second", "voxel_size": [0.2, 0.2, 0.25], "channels": [8, 16, 16],
                    "blocks": [1, 1, 1], "out_z_channels": 16},
                   dict(BACKBONE, layer_strides=[1, 2], upsample_strides=[1, 2]))
    enc = stack.encoder
    # grid 16 x 32 x 64 -> two stride-2 stages -> 4 x 8 x 16 -> z conv -> depth 1
    assert enc.bev_shape == (8, 16) and enc.out_depth == 1 and enc.out_channels == 16
    out = stack(_lidar(enc.voxel_size))
    assert out.bev.shape == (2, 32, 8, 16) and out.depth_logits is None
    out.bev.square().mean().backward()
    w = enc.stages[0][0][0].weight
    assert w.grad is not None and torch.isfinite(w.grad).all() and w.grad.abs().sum() > 0


def test_second_runs_under_mixed_precision():
    """train.amp: spconv has no bf16 kernels, so the sparse part stays float32 inside autocast and the
    dense BEV backbone after it computes in bf16; the result equals float32 to bf16 precision.

    Measured as the relative error of the whole map (||got - want|| / ||want||), which floating point
    makes independent of the map's scale: an element-wise tolerance fails on another CPU's kernels for
    a few elements near zero (this randomly initialised SECOND gives |x| <= 1e-5). Over 30 weight seeds
    the error is 0.33-0.48% (bf16 keeps 8 bits: 0.39% per rounding); 3% leaves a margin of 6."""
    torch.manual_seed(0)
    stack = _stack({"type": "second", "voxel_size": [0.2, 0.2, 0.25], "channels": [8, 16, 16],
                    "blocks": [1, 1, 1], "out_z_channels": 16},
                   dict(BACKBONE, layer_strides=[1, 2], upsample_strides=[1, 2])).eval()
    data = _lidar(stack.encoder.voxel_size)
    with torch.no_grad():
        want = stack(data).bev
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = stack(data).bev
    assert got.dtype == torch.bfloat16 and want.norm() > 0
    relative_error = ((got.float() - want).norm() / want.norm()).item()
    assert relative_error < 0.03, f"bf16 map differs from float32 by {relative_error:.2%} of its norm"


def _second_pass(enc, data, threads):
    """Output and gradients of ``enc`` with torch at ``threads`` intra-op threads, and the count after."""
    torch.set_num_threads(threads)
    enc.zero_grad()
    bev = enc(data).bev
    (bev * torch.linspace(-1, 1, bev.numel()).reshape(bev.shape)).sum().backward()
    return bev.detach(), [p.grad.clone() for p in enc.parameters()], torch.get_num_threads()


def test_second_on_the_cpu_is_the_same_with_any_thread_count():
    """spconv's CPU SubMConv3d is wrong with more than one thread (about 5% of the output, different on
    every call); the encoder runs its sparse part on one thread, forward and backward, and gives the
    caller back its thread count."""
    torch.manual_seed(0)
    enc = SecondEncoder(RANGE, [0.2, 0.2, 0.25], channels=[8, 16], blocks=[2, 1], out_z_channels=8)
    data = _lidar(enc.voxel_size, clouds=(3000, 2000))
    before = torch.get_num_threads()
    try:
        one = _second_pass(enc, data, 1)
        for _ in range(3):
            bev, grads, after = _second_pass(enc, data, 2)
            assert after == 2
            assert torch.equal(bev, one[0]) and all(torch.equal(a, b) for a, b in zip(grads, one[1]))
        torch.set_num_threads(2)
        with torch.no_grad():
            assert torch.equal(enc(data).bev, one[0]) and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_second_equals_its_dense_computation():
    """A one-stage SECOND (SubMConv3d, the layer whose CPU kernel races, then the z conv) against the same
    layers as dense conv3d, with the 2 threads of a 2-core machine. Inactive voxels are zero in the dense
    input; BatchNorm has its initial statistics, so a zero stays zero and the two agree everywhere."""
    torch.manual_seed(1)
    enc = SecondEncoder(RANGE, [0.2, 0.2, 0.25], channels=[4], blocks=[0], out_z_channels=4).eval()
    (subm, bn1, _), (zconv, bn2, _) = enc.stages[0][0], enc.z_conv
    data = _lidar(enc.voxel_size, clouds=(3000,))
    _, z, y, x = data.coords.long().T
    dense = torch.zeros(1, 4, *enc.sparse_shape)
    dense[0, :, z, y, x] = enc.mean_features(data.voxels, data.num_points).T
    active = dense.abs().sum(1, keepdim=True) > 0

    def layer(v, conv, bn, **kw):
        out = torch.nn.functional.conv3d(v, conv.weight.permute(0, 4, 1, 2, 3), **kw)
        return torch.relu((out - bn.running_mean[:, None, None, None]) /
                          torch.sqrt(bn.running_var + bn.eps)[:, None, None, None] * bn.weight[:, None, None, None]
                          + bn.bias[:, None, None, None])

    with torch.no_grad():
        h = layer(dense, subm, bn1, padding=1) * active  # submanifold: outputs at the active voxels only
        want = layer(h, zconv, bn2, stride=(2, 1, 1))
        before = torch.get_num_threads()
        try:
            torch.set_num_threads(2)
            got = enc(data).bev
        finally:
            torch.set_num_threads(before)
    torch.testing.assert_close(got, want.reshape(1, -1, *want.shape[-2:]), rtol=1e-4, atol=1e-5 * want.abs().max())


def test_second_out_channels_follow_depth():
    enc = SecondEncoder(RANGE, [0.4, 0.4, 0.1], channels=[4, 8, 8], blocks=[0, 0, 0], out_z_channels=6)
    # nz = 40 -> 20 -> 10 -> (10 - 3) // 2 + 1 = 4 layers * 6 channels
    assert enc.out_depth == 4 and enc.out_channels == 24 and enc.bev_cell == (1.6, 1.6)
    with torch.no_grad():
        assert enc.eval()(_lidar(enc.voxel_size)).bev.shape == (2, 24, 4, 8)
        empty = LidarInput(torch.zeros(0, 8, 4), torch.zeros(0, dtype=torch.int32),
                           torch.zeros(0, 4, dtype=torch.int32), num_agents=3)
        assert torch.equal(enc(empty).bev, torch.zeros(3, 24, 4, 8))


# ---------------------------------------------------------------- LSS geometry
def _yaw_T(yaw, t):
    T = torch.eye(4)
    c, s = math.cos(yaw), math.sin(yaw)
    T[:2, :2] = torch.tensor([[c, -s], [s, c]])
    T[:3, 3] = torch.tensor(t)
    return T


def test_frustum_points_by_hand():
    K = torch.tensor([[10.0, 0, 8.0], [0, 20.0, 4.0], [0, 0, 1]])[None, None]
    T = _yaw_T(math.pi / 2, [1.0, 2.0, 0.5])[None, None]  # camera looks along +y of the LiDAR frame
    pts = frustum_points(K, T, (2, 4), 4, torch.tensor([5.0, 10.0]))
    assert pts.shape == (1, 1, 2, 2, 4, 3)
    # feature pixel (i=1, j=3): u = 14, v = 6 -> camera ray (1, 0.6, -0.1); depth 10 -> (10, 6, -1)
    # yaw +90 deg: lidar x = -cam y, lidar y = cam x -> (-6 + 1, 10 + 2, -1 + 0.5)
    np.testing.assert_allclose(pts[0, 0, 1, 1, 3].numpy(), [-5.0, 12.0, -0.5], atol=1e-5)


def test_single_bright_pixel_splats_to_predicted_cell():
    """Whole LSS forward with an identity image net and a depth net that puts all
    mass on bin 7 and copies the image brightness into the context."""
    enc = LSSEncoder(RANGE, [0.4, 0.4, 4.0], channels=[4], depth_bins=[1.0, 6.0, 0.5], context_channels=2)

    class FixedDepth(nn.Module):
        def forward(self, x):
            logits = torch.full((x.shape[0], enc.num_bins, *x.shape[2:]), -1e4)
            logits[:, 7] = 1e4  # bin 7 -> centre 1.0 + 7.5 * 0.5 = 4.75 m
            return torch.cat([logits, x[:, :2]], dim=1)

    enc.image_net, enc.depth_net, enc.stride = nn.Identity(), FixedDepth(), 1
    images = torch.zeros(1, 2, 3, 6, 8)
    images[0, 1, :, 1, 6] = 1.0  # camera 1, pixel row 1, col 6
    K = torch.tensor([[4.0, 0, 4.0], [0, 4.0, 3.0], [0, 0, 1]]).expand(1, 2, 3, 3)
    T = torch.stack([_yaw_T(0.0, [0, 0, 0]), _yaw_T(math.pi, [0.5, 0.0, 0.2])])[None]  # cam 1 looks backwards
    out = enc(CameraInput(images, K, T))
    # u = 6.5, v = 1.5 -> camera (4.75, 2.5/4 * 4.75, 1.5/4 * 4.75) = (4.75, 2.96875, 1.78125)
    # yaw pi: lidar = (-4.75 + 0.5, -2.96875, 1.78125 + 0.2 = 1.98125 > zmax 1.0) -> dropped!
    assert out.bev.abs().sum() == 0
    images[0, 1, :, 1, 6] = 0.0
    images[0, 1, :, 4, 6] = 1.0  # row 4: v = 4.5 -> cam z = -1.5/4 * 4.75 = -1.78125 -> lidar z -1.58
    out = enc(CameraInput(images, K, T))
    # lidar x = -4.25 -> col floor((-4.25 + 6.4) / 0.4) = 5; y = -2.96875 -> row floor(0.23125 / 0.4) = 0
    cells = (out.bev.abs().sum(1) > 0).nonzero().tolist()
    assert cells == [[0, 0, 5]]
    np.testing.assert_allclose(out.bev[0, :, 0, 5].numpy(), [1.0, 1.0], atol=1e-5)
    assert out.depth_logits.shape == (1, 2, 10, 6, 8)


def test_splat_sums_and_drops_outside():
    pts = torch.tensor([[[0.1, 0.1, 0.0], [0.2, 0.3, -1.0], [7.0, 0.0, 0.0], [0.1, 0.1, 1.5]]])
    feats = torch.tensor([[[1.0], [2.0], [4.0], [8.0]]])
    bev = splat(pts, feats, RANGE, (16, 32))
    assert bev[0, 0, 8, 16] == 3.0 and bev.sum() == 3.0


def test_lift_matches_fixture_camera():
    """Pixels picked by eye in the V2XSet front image, lifted with the yaml calibration,
    land on the labelled cars: the jeep ahead (id 4313) and the sedan at the left edge (4321)."""
    root = FIXTURE / "v2xset_real" / "validate" / "2021_08_21_17_30_41" / "4279"
    if not root.exists():
        pytest.skip("../shared/fixtures is not present (a user's clone)")
    import yaml

    from opencood_ext.data.frame import ObjectLabel
    from opencood_ext.geometry import invert_transform, objects_to_boxes, pose_to_matrix, relative_transform

    meta = yaml.safe_load((root / "000069.yaml").read_text())
    cam = meta["camera0"]
    T_lidar_from_camera = np.linalg.inv(np.array(cam["extrinsic"], dtype=np.float64))
    np.testing.assert_allclose(T_lidar_from_camera,
                               relative_transform(pose_to_matrix(meta["lidar_pose"]), pose_to_matrix(cam["cords"])),
                               atol=1e-3)
    boxes = {k: b for k, b in zip(meta["vehicles"], objects_to_boxes(
        [ObjectLabel(k, **{f: v[f] for f in ("location", "center", "angle", "extent")})
         for k, v in meta["vehicles"].items()], invert_transform(pose_to_matrix(meta["lidar_pose"]))))}
    K = torch.tensor(cam["intrinsic"], dtype=torch.float64)[None, None]
    T = torch.tensor(T_lidar_from_camera)[None, None]

    def lift(col, row, depth):
        pts = frustum_points(K, T, (600, 800), 1, torch.tensor([depth], dtype=torch.float64))
        return pts[0, 0, 0, row, col].numpy()

    def inside_footprint(p, box, margin):
        d = p[:2] - box[:2]
        c, s = math.cos(box[6]), math.sin(box[6])
        return abs(c * d[0] + s * d[1]) <= box[3] / 2 + margin and abs(-s * d[0] + c * d[1]) <= box[4] / 2 + margin

    jeep = boxes[4313]
    rear_depth = jeep[0] - jeep[3] / 2 - T_lidar_from_camera[0, 3]
    spare_wheel = lift(412, 303, rear_depth)
    assert inside_footprint(spare_wheel, jeep, 0.3)
    assert abs(spare_wheel[2] - jeep[2]) < 0.5
    tyre_bottom = lift(377, 339, rear_depth)
    assert abs(tyre_bottom[2] - (jeep[2] - jeep[5] / 2)) < 0.3  # on the ground, not on the roof
    sedan = boxes[4321]
    assert inside_footprint(lift(95, 320, sedan[0] - T_lidar_from_camera[0, 3]), sedan, 0.3)


def test_depth_loss_by_hand():
    logits = torch.zeros(1, 1, 4, 1, 2, requires_grad=True)  # uniform over 4 bins
    depth = torch.tensor([[[[0.0, 3.7, 9.0, 0.0],      # patch 0: nearest valid 3.7 -> bin 1
                            [5.0, 0.0, 0.0, 0.0]]]])   # patch 1: 9.0 is past the bins -> ignored
    loss = depth_loss(logits, depth, (2.0, 6.0, 1.0))
    assert loss.item() == pytest.approx(math.log(4))
    loss.backward()
    assert logits.grad[0, 0, :, 0, 1].abs().sum() == 0 and logits.grad[0, 0, 1, 0, 0] < 0
    assert depth_loss(logits, torch.zeros(1, 1, 2, 4), (2.0, 6.0, 1.0)).item() == 0.0


# ---------------------------------------------------------------- stacks and registry
def test_all_types_agree_and_backpropagate():
    stacks = {
        "pointpillars": _stack({"type": "pointpillars", "voxel_size": [0.4, 0.4, 4.0], "num_filters": [16]}),
        "second": _stack({"type": "second", "voxel_size": [0.1, 0.1, 0.125], "channels": [4, 8, 8, 8],
                          "blocks": [1, 1, 1, 1], "out_z_channels": 8},
                         dict(BACKBONE, layer_strides=[1, 2], upsample_strides=[1, 2])),
        "lss": _stack({"type": "lss", "voxel_size": [0.4, 0.4, 4.0], "channels": [8, 8], "context_channels": 16,
                       "depth_bins": [1.0, 9.0, 1.0]}),
    }
    grids = {k: s.grid for k, s in stacks.items()}
    assert all(g.matches(grids["pointpillars"]) for g in grids.values()), grids
    assert grids["lss"].shape == (8, 16) and grids["lss"].cell == (0.8, 0.8)
    cam = CameraInput(torch.randn(2, 2, 3, 16, 24),
                      torch.tensor([[12.0, 0, 12], [0, 12, 8], [0, 0, 1]]).expand(2, 2, 3, 3),
                      torch.stack([_yaw_T(0, [0, 0, 0]), _yaw_T(math.pi, [0, 0, 0])]).expand(2, 2, 4, 4))
    inputs = {"pointpillars": _lidar(stacks["pointpillars"].voxel_size),
              "second": _lidar(stacks["second"].voxel_size, max_points=4), "lss": cam}
    for name, stack in stacks.items():
        out = stack(inputs[name])
        assert out.bev.shape == (2, stack.out_channels, 8, 16), name
        out.bev.mean().backward()
        grads = [p.grad for p in stack.encoder.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), name
        assert sum(float(g.abs().sum()) for g in grads) > 0, name
    assert stacks["lss"].voxel_size is None and stacks["lss"].input_kind == "camera"
    with pytest.raises(TypeError, match="takes CameraInput"):
        stacks["lss"](inputs["pointpillars"])


def test_build_reports_typos_and_derived_keys():
    with pytest.raises(ValueError, match="did you mean 'num_filters'"):
        build({"type": "pointpillars", "num_filter": [8]}, REGISTRY, "cfg.yaml: m1.encoder", lidar_range=RANGE)
    with pytest.raises(ValueError, match="did you mean 'pointpillars'"):
        build({"type": "pointpilars"}, REGISTRY, "cfg.yaml: m1.encoder")
    with pytest.raises(ValueError, match="lidar_range: is derived"):
        _stack({"type": "pointpillars", "lidar_range": RANGE})
    with pytest.raises(ValueError, match=r"needs \['lidar_range'\]"):
        build({"type": "pointpillars"}, REGISTRY, "cfg.yaml: m1.encoder")
    head = build({"type": "anchor_head", "num_classes": 3}, REGISTRY, "cfg.yaml: head", in_channels=8)
    assert head.cls.out_channels == 6


def test_backbone_stride_checks():
    with pytest.raises(ValueError, match="different strides"):
        ResNetBEVBackbone(8, [1, 1], [2, 2], [8, 8], [1, 1], [8, 8])
    bb = ResNetBEVBackbone(8, [1, 1], [2, 2], [8, 8], [1, 2], [8, 8])
    assert bb.out_stride == 2 and bb.out_channels == 16 and bb.out_shape((16, 32)) == (8, 16)
    with pytest.raises(ValueError, match="multiple of the deepest stride 4"):
        bb.out_shape((18, 32))
    with pytest.raises(ValueError, match="encoder BEV grid"):
        EncoderStack({"type": "pointpillars", "voxel_size": [0.4, 0.4, 4.0]},
                     BACKBONE, [-6.4, -3.0, -3.0, 6.4, 3.0, 1.0])
