"""The deformable convolution's gather path (project_first: one matmul + one weighted
``embedding_bag``) equals the straightforward per-tap ``grid_sample`` computation written out here,
forward and gradients (input, offset, weight, mask), offsets at exact integers (zero-initialised
offset conv) included."""
import pytest
import torch
import torch.nn.functional as F

from opencood_ext.models.deform_conv import deform_conv2d


def _straightforward(x, offset, weight, mask, padding):
    """Per tap: sample the whole input at (base + offset) with grid_sample, contract with that tap's
    weight slice, sum over taps. Stride 1, dilation 1, one offset group."""
    n, c, h, w = x.shape
    c_out, _, kh, kw = weight.shape
    out = 0
    for i in range(kh):
        for j in range(kw):
            k = i * kw + j
            ys = torch.arange(h, dtype=x.dtype)[:, None] - padding + i + offset[:, 2 * k]
            xs = torch.arange(w, dtype=x.dtype)[None, :] - padding + j + offset[:, 2 * k + 1]
            grid = torch.stack(((2 * xs + 1) / w - 1, (2 * ys + 1) / h - 1), dim=-1)
            s = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
            if mask is not None:
                s = s * mask[:, k:k + 1]
            out = out + torch.einsum("oc,nchw->nohw", weight[:, :, i, j], s)
    return out


@pytest.mark.parametrize("modulated", [False, True])
@pytest.mark.parametrize("spread", [0.0, 3.0])
def test_gather_path_equals_straightforward(modulated, spread):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 16, 12, 15, generator=g, dtype=torch.float64)
    # spread 0: every position an exact integer (the DME at init); 3: fractional, some outside the map
    offset = (torch.rand(2, 18, 12, 15, generator=g, dtype=torch.float64) - 0.5) * 2 * spread
    weight = torch.randn(4, 16, 3, 3, generator=g, dtype=torch.float64)
    mask = torch.rand(2, 9, 12, 15, generator=g, dtype=torch.float64) if modulated else None
    results = []
    for fn in (lambda *a: deform_conv2d(*a[:3], None, 1, 1, 1, a[3], method="project_first"),
               lambda *a: _straightforward(*a, padding=1)):
        leaves = [t.clone().requires_grad_() for t in (x, offset, weight) + ((mask,) if modulated else ())]
        out = fn(*leaves[:3], leaves[3] if modulated else None)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
        results.append([out.detach()] + [t.grad for t in leaves])
    names = ("output", "d input", "d offset", "d weight", "d mask")
    for name, got, want in zip(names, *results):
        if name == "d offset" and spread == 0.0:
            continue  # grid_sample's normalise/unnormalise round trip may floor an integer to the pixel below
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=name)


def test_gather_path_offset_gradient_at_integers_is_the_forward_difference():
    """At an exact integer position the corners are the pixel and the next one (torchvision's
    floor): d out / d dx is then weight * (x[.., col + 1] - x[.., col])."""
    x = torch.arange(20.0, dtype=torch.float64).reshape(1, 1, 4, 5) ** 2
    weight = torch.zeros(1, 1, 3, 3, dtype=torch.float64)
    weight[0, 0, 1, 1] = 1.0  # the centre tap only
    offset = torch.zeros(1, 18, 4, 5, dtype=torch.float64, requires_grad=True)
    out = deform_conv2d(x, offset, weight, padding=1, method="project_first")
    torch.testing.assert_close(out, x)
    out.sum().backward()
    nxt = torch.cat([x[..., 1:], torch.zeros(1, 1, 4, 1, dtype=x.dtype)], dim=-1)  # zero beyond the border
    torch.testing.assert_close(offset.grad[:, 9], (nxt - x)[:, 0])  # channel 2*4 + 1: centre tap's dx


def test_gather_path_float32_and_mixed_offset_dtype():
    """float32 maps at the DME's width: equal to sample_first within float32 rounding."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 32, 20, 20, generator=g)
    offset = (torch.rand(1, 18, 20, 20, generator=g) - 0.5) * 6
    weight = torch.randn(8, 32, 3, 3, generator=g) * 0.1
    a = deform_conv2d(x, offset, weight, padding=1, method="project_first")
    b = deform_conv2d(x, offset, weight, padding=1, method="sample_first")
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_weighted_gather_gradients_equal_embedding_bag():
    """The gather's own backward (table gradient as a sorted gather) equals autograd through
    F.embedding_bag: rows hit several times, rows never hit (zero gradient), float64."""
    from opencood_ext.models.deform_conv import _WeightedGather
    g = torch.Generator().manual_seed(5)
    table = torch.randn(30, 6, generator=g, dtype=torch.float64)
    rows = torch.randint(0, 20, (11, 7), generator=g)  # rows 20..29 never gathered; repeats within bags
    weights = torch.randn(11, 7, generator=g, dtype=torch.float64)
    upstream = torch.randn(11, 6, generator=g, dtype=torch.float64)
    results = []
    for fn in (lambda t, w: _WeightedGather.apply(t, rows, w),
               lambda t, w: F.embedding_bag(rows, t, per_sample_weights=w, mode="sum")):
        t, w = table.clone().requires_grad_(), weights.clone().requires_grad_()
        out = fn(t, w)
        out.backward(upstream)
        results.append((out.detach(), t.grad, w.grad))
    for name, got, want in zip(("output", "d table", "d weights"), *results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=name)
    assert results[0][1][20:].abs().sum() == 0


def test_weighted_gather_under_bf16_autocast():
    """The DME's deformable conv trains under CPU bf16 autocast: gradients come back in the
    leaves' dtypes and agree with float32 to bf16 rounding."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(1, 32, 10, 10, generator=g)
    offset = (torch.rand(1, 18, 10, 10, generator=g) - 0.5) * 4
    weight = torch.randn(8, 32, 3, 3, generator=g) * 0.1
    grads = []
    for amp in (False, True):
        leaves = [t.clone().requires_grad_() for t in (x, offset, weight)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = deform_conv2d(*leaves, padding=1, method="project_first")
        out.float().square().sum().backward()
        assert all(t.grad.dtype == torch.float32 for t in leaves)
        grads.append([t.grad for t in leaves])
    for name, a, b in zip(("d input", "d offset", "d weight"), *grads):
        assert torch.allclose(a, b, rtol=0.1, atol=0.1 * b.abs().max().item()), name
