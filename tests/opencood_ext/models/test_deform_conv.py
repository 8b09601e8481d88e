"""DeformConv2d (grid_sample) vs a plain per-pixel reference, torchvision, gradcheck."""
import math

import pytest
import torch

from opencood_ext.models.deform_conv import DeformConv2d, deform_conv2d


def _bilinear(img, y, x):
    """img (H, W) read at real (y, x); corners outside the image are zero."""
    h, w = img.shape
    y0, x0 = math.floor(y), math.floor(x)
    total = 0.0
    for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
        for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
            if 0 <= yy < h and 0 <= xx < w:
                total += wy * wx * float(img[yy, xx])
    return total


def _reference(inp, offset, weight, bias, stride, padding, dilation, mask):
    """Deformable conv written out with Python loops (DCN paper definition)."""
    n, c_in, h, w = inp.shape
    c_out, cpg, kh, kw = weight.shape
    groups = c_in // cpg
    n_off = offset.shape[1] // (2 * kh * kw)
    h_out = (h + 2 * padding - (dilation * (kh - 1) + 1)) // stride + 1
    w_out = (w + 2 * padding - (dilation * (kw - 1) + 1)) // stride + 1
    out = torch.zeros(n, c_out, h_out, w_out, dtype=torch.float64)
    for b in range(n):
        for o in range(c_out):
            g = o // (c_out // groups)
            for oy in range(h_out):
                for ox in range(w_out):
                    acc = float(bias[o]) if bias is not None else 0.0
                    for ci in range(cpg):
                        c = g * cpg + ci
                        og = c // (c_in // n_off)
                        for i in range(kh):
                            for j in range(kw):
                                k = i * kw + j
                                dy = float(offset[b, og * 2 * kh * kw + 2 * k, oy, ox])
                                dx = float(offset[b, og * 2 * kh * kw + 2 * k + 1, oy, ox])
                                y = oy * stride - padding + i * dilation + dy
                                x = ox * stride - padding + j * dilation + dx
                                v = _bilinear(inp[b, c], y, x)
                                if mask is not None:
                                    v *= float(mask[b, og * kh * kw + k, oy, ox])
                                acc += float(weight[o, ci, i, j]) * v
                    out[b, o, oy, ox] = acc
    return out


@pytest.mark.parametrize("method", ["sample_first", "project_first"])
@pytest.mark.parametrize("stride,padding,dilation,groups,n_off,modulated", [
    (1, 1, 1, 1, 1, False),
    (1, 1, 1, 1, 1, True),
    (2, 1, 1, 2, 2, True),
    (1, 2, 2, 1, 2, False),
])
def test_matches_plain_reference(stride, padding, dilation, groups, n_off, modulated, method):
    g = torch.Generator().manual_seed(0)
    n, c_in, c_out, h, w, k = 2, 4, 4, 5, 6, 3
    inp = torch.randn(n, c_in, h, w, generator=g, dtype=torch.float64)
    h_out = (h + 2 * padding - (dilation * (k - 1) + 1)) // stride + 1
    w_out = (w + 2 * padding - (dilation * (k - 1) + 1)) // stride + 1
    # Offsets up to +-3 px so many taps fall outside the image (zero border path).
    offset = (torch.rand(n, 2 * n_off * k * k, h_out, w_out, generator=g, dtype=torch.float64) - 0.5) * 6
    weight = torch.randn(c_out, c_in // groups, k, k, generator=g, dtype=torch.float64)
    bias = torch.randn(c_out, generator=g, dtype=torch.float64)
    mask = torch.rand(n, n_off * k * k, h_out, w_out, generator=g, dtype=torch.float64) if modulated else None
    got = deform_conv2d(inp, offset, weight, bias, stride, padding, dilation, mask, method=method)
    want = _reference(inp, offset, weight, bias, stride, padding, dilation, mask)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_zero_offset_equals_conv2d():
    g = torch.Generator().manual_seed(1)
    layer = DeformConv2d(3, 5, kernel_size=3, padding=1)
    x = torch.randn(2, 3, 7, 9, generator=g)
    offset = torch.zeros(2, 18, 7, 9)
    want = torch.nn.functional.conv2d(x, layer.weight, layer.bias, padding=1)
    torch.testing.assert_close(layer(x, offset), want, atol=1e-5, rtol=1e-5)


def test_offset_layout_dy_then_dx():
    """An integer (dy, dx) = (1, 0) offset on every tap equals conv of the image shifted up one row."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 2, 6, 6, generator=g, dtype=torch.float64)
    weight = torch.randn(3, 2, 3, 3, generator=g, dtype=torch.float64)
    offset = torch.zeros(1, 18, 6, 6, dtype=torch.float64)
    offset[:, 0::2] = 1.0  # dy channels
    shifted = torch.zeros_like(x)
    shifted[:, :, :-1] = x[:, :, 1:]
    want = torch.nn.functional.conv2d(shifted, weight, padding=1)
    got = deform_conv2d(x, offset, weight, padding=1)
    # Row 0's top taps read image row 0 here but the zero pad of the shifted image there.
    torch.testing.assert_close(got[:, :, 1:], want[:, :, 1:])
    assert not torch.allclose(got[:, :, 0], want[:, :, 0])


@pytest.mark.parametrize("method", ["sample_first", "project_first"])
def test_gradcheck_float64(method):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    # Keep sample points away from integer coordinates, where bilinear is not differentiable.
    offset = (torch.rand(1, 18, 3, 3, generator=g, dtype=torch.float64) * 0.8 + 0.1).requires_grad_()
    weight = torch.randn(2, 2, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(2, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(1, 9, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, o, wt, b, m: deform_conv2d(a, o, wt, b, 1, 1, 1, m, method=method),
        (x, offset, weight, bias, mask))


def test_bad_shapes_raise():
    layer = DeformConv2d(4, 4)
    with pytest.raises(ValueError, match="offset"):
        layer(torch.zeros(1, 4, 5, 5), torch.zeros(1, 17, 5, 5))
    with pytest.raises(ValueError, match="mask"):
        layer(torch.zeros(1, 4, 5, 5), torch.zeros(1, 18, 5, 5), torch.zeros(1, 8, 5, 5))


def test_matches_torchvision():
    tv_ops = pytest.importorskip(
        "torchvision.ops", reason="torchvision does not import beside the CPU torch wheel")
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 8, 9, 11, generator=g)
    offset = torch.randn(2, 2 * 2 * 9, 9, 11, generator=g) * 2
    mask = torch.rand(2, 2 * 9, 9, 11, generator=g)
    weight = torch.randn(6, 4, 3, 3, generator=g)
    bias = torch.randn(6, generator=g)
    for m in (None, mask):
        want = tv_ops.deform_conv2d(x, offset, weight, bias, padding=(1, 1), mask=m)
        got = deform_conv2d(x, offset, weight, bias, padding=1, mask=m)
        torch.testing.assert_close(got, want, atol=5e-4, rtol=1e-4)


def test_auto_projects_first_only_when_cheaper(monkeypatch):
    """auto: project_first for stride 1, groups 1 and G * C_out < C_in (the DME's 128 -> 64), else sample_first."""
    import opencood_ext.models.deform_conv as dc

    calls = []
    real = dc._project_first
    monkeypatch.setattr(dc, "_project_first", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(1, 8, 5, 5)
    deform_conv2d(x, torch.randn(1, 18, 5, 5), torch.randn(4, 8, 3, 3), padding=1)
    assert calls == [1]
    deform_conv2d(x, torch.randn(1, 18, 5, 5), torch.randn(8, 8, 3, 3), padding=1)  # C_out == C_in
    deform_conv2d(x, torch.randn(1, 18, 3, 3), torch.randn(4, 8, 3, 3), stride=2, padding=1)
    deform_conv2d(x, torch.randn(1, 18, 5, 5), torch.randn(2, 4, 3, 3), padding=1)  # groups 2
    assert calls == [1]
    with pytest.raises(ValueError, match="method"):
        deform_conv2d(x, torch.randn(1, 18, 5, 5), torch.randn(4, 8, 3, 3), padding=1, method="fast")


def test_project_first_equals_sample_first_at_message_extractor_size():
    """float32, the DME's layer (128 -> 64, 3x3) on a 24x40 map, offsets up to +-4 px: outputs and
    the gradients of input, offset and weight agree to 1e-5 (relative to their scale)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 128, 24, 40, generator=g)
    offset = (torch.rand(2, 18, 24, 40, generator=g) - 0.5) * 8
    weight = torch.randn(64, 128, 3, 3, generator=g) * 0.03
    results = {}
    for method in ("sample_first", "project_first"):
        leaves = [t.clone().requires_grad_() for t in (x, offset, weight)]
        out = deform_conv2d(*leaves, padding=1, method=method)
        out.square().sum().backward()
        results[method] = [out.detach()] + [t.grad for t in leaves]
    for name, a, b in zip(("output", "d input", "d offset", "d weight"), results["sample_first"],
                          results["project_first"]):
        scale = a.abs().max().item()
        assert scale > 0, name
        torch.testing.assert_close(b / scale, a / scale, atol=1e-5, rtol=0, msg=name)
