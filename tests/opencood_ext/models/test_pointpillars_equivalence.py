"""The PointPillars encoder's faster computation (pillar max, valid-point features, channel-first
scatter) gives the outputs and gradients of the straightforward one, written here as the reference:
features on the padded (V, P, 10) grid, ``scatter_reduce`` amax of the ReLU outputs, an (A, H, W, C)
canvas permuted to channel-first."""
import copy

import numpy as np
import pytest
import torch

from opencood_ext.data.inputs import LidarInput
from opencood_ext.data.synthetic import make_frame
from opencood_ext.data.voxelize import Voxelizer, collate_voxels
from opencood_ext.models.pointpillars import PillarFeatureNet, PointPillarEncoder, scatter_to_bev

RANGE = [-40.0, -40.0, -3.0, 40.0, 40.0, 1.0]
VOXEL = [1.0, 1.0, 4.0]


def reference_pfn(pfn: PillarFeatureNet, voxels, num_points, coords):
    v, p = voxels.shape[:2]
    valid = torch.arange(p)[None] < num_points[:, None]
    pillar = torch.arange(v)[:, None].expand(v, p)[valid]
    xyz = voxels[..., :3]
    mean = (xyz * valid[..., None]).sum(1) / num_points.clamp(min=1)[:, None].to(xyz.dtype)
    centre = (coords[:, [3, 2, 1]].to(xyz.dtype) + 0.5) * pfn.voxel_size + pfn.origin
    feats = torch.cat([voxels[..., :4], xyz - mean[:, None], xyz - centre[:, None]], dim=-1)
    x = (feats * valid[..., None])[valid]
    pooled = None
    for i, layer in enumerate(pfn.layers):
        h = layer["norm"](layer["linear"](x)).relu()
        pooled = h.new_zeros(v, h.shape[1]).scatter_reduce(
            0, pillar[:, None].expand_as(h), h, reduce="amax", include_self=True)
        if i + 1 < len(pfn.layers):
            x = torch.cat([h, pooled[pillar]], dim=-1)
    return pooled


def reference_scatter(features, coords, num_agents, bev_shape):
    h, w = bev_shape
    canvas = features.new_zeros(num_agents * h * w, features.shape[1])
    flat = (coords[:, 0].long() * h + coords[:, 2].long()) * w + coords[:, 3].long()
    canvas = canvas.index_copy(0, flat, features)
    return canvas.view(num_agents, h, w, -1).permute(0, 3, 1, 2).contiguous()


def _synthetic_input(duplicate_points: bool = False) -> LidarInput:
    vox = Voxelizer(VOXEL, RANGE, max_points_per_voxel=16)
    clouds = [a.lidar for a in make_frame(seed=3).agents]
    if duplicate_points:  # every point twice: ties at each pillar's max, whose gradient is shared
        clouds = [np.repeat(c, 2, axis=0) for c in clouds]
    return LidarInput.from_batch(collate_voxels([vox(c) for c in clouds]), len(clouds))


def _grads(module):
    return {n: p.grad.clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("num_filters", [(16,), (8, 16)])
@pytest.mark.parametrize("duplicate_points", [False, True])
def test_encoder_matches_reference_outputs_grads_and_running_stats(num_filters, duplicate_points):
    torch.manual_seed(0)
    data = _synthetic_input(duplicate_points)
    enc = PointPillarEncoder(RANGE, VOXEL, num_filters=num_filters)
    ref = copy.deepcopy(enc)
    assert int(data.num_points.sum()) > 1000 and (data.num_points > 1).any()
    out = enc(data).bev
    expected = reference_scatter(reference_pfn(ref.pfn, data.voxels, data.num_points, data.coords),
                                 data.coords, data.num_agents, ref.bev_shape)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert out.is_contiguous() and out.shape == expected.shape
    g = torch.randn_like(expected)
    out.backward(g)
    expected.backward(g)
    got, want = _grads(enc), _grads(ref)
    for name in want:
        # BLAS summation order over ~10^4 points: relative float32 rounding only
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-4 * float(want[name].abs().max()),
                                   msg=lambda m, n=name: f"{n}: {m}")
    for (name, a), (_, b) in zip(enc.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(a, b, msg=lambda m, n=name: f"{n}: {m}")


def test_tied_points_share_the_gradient_and_nonpositive_max_gets_none():
    """Two points equal at a pillar's max share its gradient evenly; a pillar whose max is <= 0
    passes nothing back (ReLU), as the scatter_reduce of the ReLU outputs does."""
    pfn = PillarFeatureNet([1.0, 1.0, 4.0], RANGE, num_filters=(2,)).eval()  # BN: running mean 0, var 1
    with torch.no_grad():
        weight = pfn.layers[0]["linear"].weight
        weight.zero_()
        weight[0, 3], weight[1, 3] = 1.0, -1.0  # channel 0 = intensity; channel 1 = -intensity (max < 0)
    voxels = torch.zeros(2, 3, 4)
    voxels[0, :3, 3] = torch.tensor([0.5, 0.9, 0.9])  # pillar 0: two points tied at its max
    voxels[1, :1, 3] = 0.2
    num_points, coords = torch.tensor([3, 1]), torch.tensor([[0, 0, 1, 1], [0, 0, 2, 2]])
    results = []
    for fn in (pfn, lambda *a: reference_pfn(pfn, *a)):
        pfn.zero_grad()
        out = fn(voxels, num_points, coords)
        out.sum().backward()
        results.append((out.detach(), weight.grad.clone()))
    (out, grad), (ref_out, ref_grad) = results
    assert torch.equal(out, ref_out) and torch.equal(grad, ref_grad)
    scale = 1.0 / np.sqrt(1.0 + 1e-3)
    # intensity of the tied pair's shared max (0.9, not 2 x 0.9) plus pillar 1's 0.2, through BN's scale
    assert grad[0, 3].item() == pytest.approx((0.9 + 0.2) * scale, rel=1e-6)
    assert grad[1].abs().sum() == 0


def test_scatter_to_bev_gradient_matches_reference():
    torch.manual_seed(1)
    coords = torch.tensor([[1, 0, 2, 3], [0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 3, 4]])
    feats = torch.randn(4, 3, requires_grad=True)
    feats_ref = feats.detach().clone().requires_grad_(True)
    out, ref = scatter_to_bev(feats, coords, 2, (4, 5)), reference_scatter(feats_ref, coords, 2, (4, 5))
    assert torch.equal(out, ref)
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    assert torch.equal(feats.grad, feats_ref.grad)


def test_bfloat16_autocast_matches_reference():
    """Under ``train.amp=bf16`` the linear layer runs in bfloat16: the pillar max handles it alike."""
    torch.manual_seed(0)
    data = _synthetic_input()
    enc = PointPillarEncoder(RANGE, VOXEL, num_filters=(16,))
    ref = copy.deepcopy(enc)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = enc(data).bev
        expected = reference_scatter(reference_pfn(ref.pfn, data.voxels, data.num_points, data.coords),
                                     data.coords, data.num_agents, ref.bev_shape)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)
    out.float().square().sum().backward()
    expected.float().square().sum().backward()
    for (name, p), (_, q) in zip(enc.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-3 * float(q.grad.abs().max()),
                                   msg=lambda m, n=name: f"{n}: {m}")
