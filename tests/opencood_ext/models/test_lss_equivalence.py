"""The LSS encoder's lift-splat, which forms the lifted features of the frustum points inside the
grid only and pools them straight into a channel-first canvas, gives the outputs and gradients of
the straightforward one, written here as the reference: the whole (A, N, D, h, w, C) product,
``index_add_`` into an (A, H, W, C) canvas, permuted to channel-first."""
import copy

import numpy as np
import pytest
import torch

from opencood_ext.data.inputs import CameraInput
from opencood_ext.data.synthetic import make_frame
from opencood_ext.models.lss import LSSEncoder, frustum_points, splat

RANGE = [-40.0, -40.0, -3.0, 40.0, 40.0, 1.0]


def reference_splat(points, feats, lidar_range, bev_shape):
    a, c = points.shape[0], feats.shape[-1]
    H, W = bev_shape
    xmin, ymin, zmin, xmax, ymax, zmax = (float(x) for x in lidar_range)
    pts = points.reshape(a, -1, 3)
    agent = torch.arange(a)[:, None].expand(a, pts.shape[1]).reshape(-1)
    pts, f = pts.reshape(-1, 3), feats.reshape(-1, c)
    col = torch.floor((pts[:, 0] - xmin) / ((xmax - xmin) / W)).long()
    row = torch.floor((pts[:, 1] - ymin) / ((ymax - ymin) / H)).long()
    keep = (col >= 0) & (col < W) & (row >= 0) & (row < H) & (pts[:, 2] >= zmin) & (pts[:, 2] < zmax)
    flat = (agent[keep] * H + row[keep]) * W + col[keep]
    canvas = f.new_zeros(a * H * W, c).index_add_(0, flat, f[keep])
    return canvas.view(a, H, W, c).permute(0, 3, 1, 2).contiguous()


def reference_forward(enc: LSSEncoder, data: CameraInput):
    a, n, _, H, W = data.images.shape
    x = enc.depth_net(enc.image_net(data.images.reshape(a * n, 3, H, W)))
    h, w = x.shape[-2:]
    depth_logits = x[:, :enc.num_bins].reshape(a, n, enc.num_bins, h, w)
    context = x[:, enc.num_bins:].reshape(a, n, enc.context_channels, h, w)
    lifted = depth_logits.softmax(dim=2)[..., None] * context.permute(0, 1, 3, 4, 2)[:, :, None]
    pts = frustum_points(data.K, data.T_lidar_from_camera, (h, w), enc.stride, enc.depths)
    return reference_splat(pts, lifted, enc.lidar_range, enc.bev_shape), depth_logits


def _synthetic_cameras(image_hw=(64, 96)) -> CameraInput:
    """The synthetic frame's camera rigs (intrinsics scaled to the image) with random images."""
    frame = make_frame(seed=5, types=("m2", "m2", "m2"))
    H, W = image_hw
    g = torch.Generator().manual_seed(0)
    K, T = [], []
    for agent in frame.agents:
        Ks = []
        for cam in agent.cameras:
            k = cam.K.copy()
            k[0] *= W / cam.image.shape[1]
            k[1] *= H / cam.image.shape[0]
            Ks.append(k)
        K.append(np.stack(Ks))
        T.append(np.stack([cam.T_lidar_from_camera for cam in agent.cameras]))
    a, n = len(K), K[0].shape[0]
    return CameraInput(images=torch.rand(a, n, 3, H, W, generator=g), K=torch.from_numpy(np.stack(K)).float(),
                       T_lidar_from_camera=torch.from_numpy(np.stack(T)).float())


@pytest.mark.parametrize("voxel", [0.5, 2.0])
def test_encoder_matches_reference_outputs_and_grads(voxel):
    torch.manual_seed(0)
    data = _synthetic_cameras()
    enc = LSSEncoder(RANGE, [voxel, voxel, 4.0], channels=[8, 8, 16, 16], depth_bins=[1.0, 45.0, 1.0],
                     context_channels=8)
    ref = copy.deepcopy(enc)
    out = enc(data)
    bev, depth_logits = reference_forward(ref, data)
    assert (bev != 0).any(dim=1).sum() > 100  # many cells receive frustum points, several per cell
    torch.testing.assert_close(out.bev, bev, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out.depth_logits, depth_logits, rtol=0, atol=0)
    g = torch.randn_like(bev)
    (out.bev * g).sum().backward()
    (bev * g).sum().backward()
    for (name, p), (_, q) in zip(enc.named_parameters(), ref.named_parameters()):
        # the context and depth gradients sum the same terms in another order: float rounding only
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5 * float(q.grad.abs().max()),
                                   msg=lambda m, n=name: f"{n}: {m}")


def test_splat_matches_reference_with_shared_cells_and_gradients():
    g = torch.Generator().manual_seed(2)
    points = (torch.rand(2, 5, 7, 3, generator=g) - 0.5) * torch.tensor([100.0, 100.0, 8.0])
    feats = torch.randn(2, 5, 7, 4, generator=g, requires_grad=True)
    feats_ref = feats.detach().clone().requires_grad_(True)
    out, ref = splat(points, feats, RANGE, (4, 4)), reference_splat(points, feats_ref, RANGE, (4, 4))
    assert torch.equal(out, ref)
    assert (ref != 0).any(dim=1).sum() < int((points[..., 2].abs() < 1).sum())  # cells are shared
    grad = torch.randn_like(ref)
    out.backward(grad)
    ref.backward(grad)
    assert torch.equal(feats.grad, feats_ref.grad)
