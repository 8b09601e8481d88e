"""Deformable 2D convolution built from ``torch.nn.functional.grid_sample``.

Pure PyTorch (no compiled extension), so it runs wherever torch runs and its
backward comes from autograd. It follows ``torchvision.ops.deform_conv2d``
exactly (same arguments, same layouts, same bilinear/zero-border semantics);
``tests/opencood_ext/models/test_deform_conv.py`` checks it against a plain per-pixel reference
and, where torchvision imports, against torchvision itself.

Layouts (torchvision's, read from its CPU kernel ``deform_conv2d_kernel.cpp``):

- ``offset``: (N, 2 * offset_groups * kh * kw, H_out, W_out). For offset group
  ``g`` and kernel tap ``k = i * kw + j`` (row-major over the kernel), channel
  ``g * 2*kh*kw + 2*k`` is the ROW offset ``dy`` and channel ``... + 2*k + 1``
  the COLUMN offset ``dx``, both in input pixels.
- ``mask`` (modulated, DCNv2): (N, offset_groups * kh * kw, H_out, W_out),
  channel ``g * kh*kw + k``.
- Tap ``(i, j)`` of output pixel ``(oy, ox)`` reads the input at
  ``y = oy*stride_h - pad_h + i*dil_h + dy``, ``x = ox*stride_w - pad_w + j*dil_w + dx``
  by bilinear interpolation; corners outside the image count as zero (so a
  sample at y <= -1 or y >= H is zero), which is grid_sample's
  ``padding_mode="zeros"`` with ``align_corners=False`` once pixel ``p`` maps to
  the normalised coordinate ``(2p + 1) / size - 1``.
- Input channels ``[g*C/G, (g+1)*C/G)`` use offset group ``g``; ``groups``
  splits channels for the weight as in ``nn.Conv2d``.

Cost (MACs, the convention of :mod:`opencood_ext.eval.flops`): sampling is 4 MACs per
sampled value (C_in * kh*kw * H_out*W_out values, plus 1 for the mask when
modulated); the contraction is C_out * (C_in/groups) * kh*kw * H_out*W_out.
That is the ``sample_first`` order (``grid_sample`` on the input); ``project_first`` (chosen
automatically when cheaper, see :func:`deform_conv2d`) samples G * kh*kw * C_out values per
output pixel instead, half as many for the message extractor's 128 -> 64 layer, and does it
channels-last as one matmul plus one weighted ``embedding_bag`` gather (no ``grid_sample``, whose
CPU backward on the (n*kk, C_out, H, W) projection cost 3.5x its forward):
``tests/opencood_ext/models/test_deform_conv_fast.py`` checks it against the per-tap ``grid_sample`` computation,
forward and gradients; ``python tools/bench.py gencomm`` times it.
"""
from __future__ import annotations

import math
from typing import Literal, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

IntPair = Union[int, Tuple[int, int]]


def _pair(v: IntPair, name: str) -> Tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    t = tuple(int(a) for a in v)
    if len(t) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {v!r}")
    return t  # type: ignore[return-value]


Method = Literal["auto", "sample_first", "project_first"]


def deform_conv2d(
    input: torch.Tensor,
    offset: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    stride: IntPair = (1, 1),
    padding: IntPair = (0, 0),
    dilation: IntPair = (1, 1),
    mask: Optional[torch.Tensor] = None,
    method: Method = "auto",
) -> torch.Tensor:
    """Deformable convolution with torchvision's signature and layouts.

    input (N, C_in, H, W); offset (N, 2*G*kh*kw, H_out, W_out);
    weight (C_out, C_in/groups, kh, kw); bias (C_out,); mask (N, G*kh*kw,
    H_out, W_out) or None. ``G`` (offset groups) and ``groups`` are inferred
    from the shapes as torchvision does. Returns (N, C_out, H_out, W_out).

    method: both compute the same sum (equal up to float rounding; tested).
    ``"sample_first"`` bilinearly samples the C_in input channels at every tap
    (C_in*kh*kw values per output pixel), then contracts with the weight.
    ``"project_first"`` contracts first: a grouped 1x1 conv gives, per offset
    group and tap, the C_out-channel projection ``W[:, c in g, tap] @ x`` at
    every input pixel; sampling it at the tap's positions and summing over taps
    and groups is the same sum, since bilinear sampling is linear in the image
    (zero border included). It samples G*kh*kw*C_out values per output pixel
    and costs C_out*C_in*kh*kw MACs per INPUT pixel. ``"auto"`` takes
    project_first when that is cheaper: stride 1, groups 1 and G*C_out < C_in
    (the message extractor: 128 -> 64).
    """
    sh, sw = _pair(stride, "stride")
    ph, pw = _pair(padding, "padding")
    dh, dw = _pair(dilation, "dilation")
    if input.dim() != 4 or offset.dim() != 4 or weight.dim() != 4:
        raise ValueError(
            f"deform_conv2d expects 4-D input, offset and weight, got {tuple(input.shape)}, "
            f"{tuple(offset.shape)}, {tuple(weight.shape)}")
    n, c_in, h, w = input.shape
    c_out, c_per_group, kh, kw = weight.shape
    kk = kh * kw
    if c_in % c_per_group:
        raise ValueError(f"weight expects {c_per_group} input channels per group; input has {c_in}")
    groups = c_in // c_per_group
    if c_out % groups:
        raise ValueError(f"out channels {c_out} not divisible by groups {groups}")
    h_out = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    w_out = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    if h_out <= 0 or w_out <= 0:
        raise ValueError(f"input {h}x{w} too small for kernel {kh}x{kw} with padding {ph},{pw}")
    if offset.shape[0] != n or offset.shape[2:] != (h_out, w_out) or offset.shape[1] % (2 * kk):
        raise ValueError(
            f"offset must be (N={n}, 2*G*{kk}, {h_out}, {w_out}), got {tuple(offset.shape)}")
    n_off = offset.shape[1] // (2 * kk)
    if c_in % n_off:
        raise ValueError(f"input channels {c_in} not divisible by offset groups {n_off}")
    if mask is not None and tuple(mask.shape) != (n, n_off * kk, h_out, w_out):
        raise ValueError(f"mask must be ({n}, {n_off * kk}, {h_out}, {w_out}), got {tuple(mask.shape)}")
    if method == "auto":
        method = "project_first" if (sh, sw) == (1, 1) and groups == 1 and n_off * c_out < c_in \
            else "sample_first"
    if method not in ("sample_first", "project_first"):
        raise ValueError(f"deform_conv2d method must be auto, sample_first or project_first, got {method!r}")

    if method == "project_first":
        out = _project_first(input, offset, weight, groups, n_off, mask, (sh, sw), (ph, pw), (dh, dw))
    else:
        out = _sample_first(input, offset, weight, groups, n_off, mask, (sh, sw), (ph, pw), (dh, dw))
    if bias is not None:
        out = out + bias.view(1, c_out, 1, 1)
    return out


def _sample_first(input: torch.Tensor, offset: torch.Tensor, weight: torch.Tensor, groups: int, n_off: int,
                  mask: Optional[torch.Tensor], stride: Tuple[int, int], padding: Tuple[int, int],
                  dilation: Tuple[int, int]) -> torch.Tensor:
    """The ``sample_first`` sum: ``grid_sample`` of the C_in input channels at every tap, then one
    matmul with the weight. -> (n, C_out, h_out, w_out)."""
    n, c_in, h, w = input.shape
    c_out, c_per_group, kh, kw = weight.shape
    kk, (sh, sw), (ph, pw), (dh, dw) = kh * kw, stride, padding, dilation
    h_out, w_out = offset.shape[-2:]
    # Sampling positions -> grid_sample's normalised grid (align_corners=False), (n*G*kk, h_out, w_out, 2).
    dev, dt = input.device, input.dtype
    ki = torch.arange(kh, device=dev, dtype=dt).repeat_interleave(kw) * dh  # (kk,)
    kj = torch.arange(kw, device=dev, dtype=dt).repeat(kh) * dw
    oy = torch.arange(h_out, device=dev, dtype=dt) * sh - ph
    ox = torch.arange(w_out, device=dev, dtype=dt) * sw - pw
    off = offset.reshape(n, n_off, kk, 2, h_out, w_out)
    y = ki[:, None, None] + oy[None, :, None] + off[:, :, :, 0]  # (n, G, kk, h_out, w_out)
    x = kj[:, None, None] + ox[None, None, :] + off[:, :, :, 1]
    grid = torch.stack(((2.0 * x + 1.0) / w - 1.0, (2.0 * y + 1.0) / h - 1.0), dim=-1)
    cg = c_in // n_off
    sampled = F.grid_sample(input.reshape(n * n_off, cg, h, w), grid.reshape(n * n_off, kk * h_out, w_out, 2),
                            mode="bilinear", padding_mode="zeros", align_corners=False)
    # (n*G, cg, kk*h_out, w_out) -> (n, G, cg, kk, L)
    sampled = sampled.reshape(n, n_off, cg, kk, h_out * w_out)
    if mask is not None:
        sampled = sampled * mask.reshape(n, n_off, 1, kk, h_out * w_out)
    # Columns ordered (channel, tap) to match weight.view(C_out, C_in/groups * kk).
    cols = sampled.reshape(n, groups, c_per_group * kk, h_out * w_out)
    wmat = weight.reshape(groups, c_out // groups, c_per_group * kk)
    return torch.matmul(wmat, cols).reshape(n, c_out, h_out, w_out)


def _project_first(input: torch.Tensor, offset: torch.Tensor, weight: torch.Tensor, groups: int, n_off: int,
                   mask: Optional[torch.Tensor], stride: Tuple[int, int], padding: Tuple[int, int],
                   dilation: Tuple[int, int]) -> torch.Tensor:
    """The ``project_first`` sum as one matmul and one weighted gather. -> (n, C_out, h_out, w_out).

    1. Projection, channels last: row ``((g*n + b)*H*W + y*W + x)*kk + k`` of ``proj``
       (G*n*H*W*kk, C_out) is ``W[:, c in g, tap k] @ input[b, c in g, y, x]``: one (batched over
       G) matmul ``(n*H*W, cg) @ (cg, kk*C_out)``, the dense conv's arithmetic.
    2. Sampling and the sum over groups, taps and the 4 bilinear corners as ONE
       ``F.embedding_bag`` (mode sum, per-sample weights): output pixel ``(b, oy, ox)`` is the
       bag of its G*kk*4 corner rows of ``proj``, weighted by the bilinear weights (times the
       mask), a corner outside the map weighing 0 (zero border). Rows are contiguous C_out-vectors,
       so forward and backward (a segment sum of rows; the weights' gradient, hence the
       offsets', is a dot product per row) run at memory speed, where ``grid_sample`` on the
       (n*G*kk, C_out, H, W) projection walks strided planes, and its backward scatters per
       channel. Positions are taken in at least float32 and floored as torchvision does
       (an integer position's corners are itself and the next pixel).
    """
    n, c_in, h, w = input.shape
    c_out, c_per_group, kh, kw = weight.shape
    kk, (sh, sw), (ph, pw), (dh, dw) = kh * kw, stride, padding, dilation
    h_out, w_out = offset.shape[-2:]
    if groups > 1:  # the grouped weight as a dense block-diagonal (C_out, C_in, kh, kw) one
        dense = weight.new_zeros(c_out, c_in, kh, kw)
        per = c_out // groups
        for j in range(groups):
            dense[j * per:(j + 1) * per, j * c_per_group:(j + 1) * c_per_group] = weight[j * per:(j + 1) * per]
        weight = dense
    cg = c_in // n_off
    x_cl = input.permute(0, 2, 3, 1).reshape(n * h * w, n_off, cg).transpose(0, 1)  # (G, n*H*W, cg)
    w_g = weight.reshape(c_out, n_off, cg, kk).permute(1, 2, 3, 0).reshape(n_off, cg, kk * c_out)
    proj = torch.mm(x_cl[0], w_g[0]) if n_off == 1 else torch.bmm(x_cl, w_g)
    proj = proj.reshape(n_off * n * h * w * kk, c_out)

    dev = input.device
    pdt = torch.promote_types(offset.dtype, torch.float32)
    ki = (torch.arange(kh, device=dev) * dh).repeat_interleave(kw).to(pdt)  # (kk,)
    kj = (torch.arange(kw, device=dev) * dw).repeat(kh).to(pdt)
    oy = (torch.arange(h_out, device=dev) * sh - ph).to(pdt)
    ox = (torch.arange(w_out, device=dev) * sw - pw).to(pdt)
    off = offset.to(pdt).reshape(n, n_off, kk, 2, h_out, w_out)
    y = ki[:, None, None] + oy[None, :, None] + off[:, :, :, 0]  # (n, G, kk, h_out, w_out)
    x = kj[:, None, None] + ox[None, None, :] + off[:, :, :, 1]
    y0, x0 = y.detach().floor(), x.detach().floor()
    fy, fx = y - y0, x - x0
    y0, x0 = y0.long(), x0.long()
    gb = (torch.arange(n_off, device=dev)[None, :] * n + torch.arange(n, device=dev)[:, None]) * (h * w)
    base = gb[:, :, None, None, None]  # (n, G, 1, 1, 1)
    tap = torch.arange(kk, device=dev)[None, None, :, None, None]
    if mask is not None:
        mask = mask.to(pdt).reshape(n, n_off, kk, h_out, w_out)
    rows, weights = [], []
    for cy, wy in ((0, 1 - fy), (1, fy)):
        for cx, wx in ((0, 1 - fx), (1, fx)):
            yy, xx = y0 + cy, x0 + cx
            inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            rows.append((base + yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)) * kk + tap)
            wt = wy * wx * inside
            weights.append(wt if mask is None else wt * mask)
    # bags: one per output pixel (n, h_out, w_out), entries ordered (G, kk, corner)
    rows_t = torch.stack(rows, dim=-1).permute(0, 3, 4, 1, 2, 5).reshape(n * h_out * w_out, n_off * kk * 4)
    wts_t = torch.stack(weights, dim=-1).permute(0, 3, 4, 1, 2, 5).reshape(n * h_out * w_out, n_off * kk * 4)
    out = _WeightedGather.apply(proj, rows_t, wts_t.to(proj.dtype))
    return out.reshape(n, h_out, w_out, c_out).permute(0, 3, 1, 2)


class _WeightedGather(torch.autograd.Function):
    """``out[b] = sum_e weights[b, e] * table[rows[b, e]]``: ``F.embedding_bag`` (mode sum, per-sample
    weights) whose table gradient is a gather as well. table (R, C), rows (B, E) int64, weights
    (B, E) -> (B, C).

    The table's gradient row ``r`` is the sum of ``weights[b, e] * grad[b]`` over the entries with
    ``rows[b, e] = r``: sorting the entries by row makes every table row one bag over ``grad`` (an
    empty bag is zero), so it is one more ``embedding_bag``, where embedding_bag's own backward
    zero-fills the (R, C) gradient and adds the entries into it one by one (about 10% of the
    message extractor's forward + backward; ``tests/opencood_ext/models/test_deform_conv_fast.py`` checks both against
    autograd). The weights' gradient is embedding_bag's own (the table detached)."""

    @staticmethod
    def forward(ctx, table: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(table, rows, weights)
        return F.embedding_bag(rows, table, per_sample_weights=weights, mode="sum")

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        table, rows, weights = ctx.saved_tensors
        grad = grad.contiguous()
        d_table = d_weights = None
        if ctx.needs_input_grad[0]:
            sorted_rows, order = torch.sort(rows.reshape(-1))
            counts = torch.bincount(sorted_rows, minlength=table.shape[0])
            d_table = F.embedding_bag(order // rows.shape[1], grad, counts.cumsum(0) - counts,
                                      per_sample_weights=weights.reshape(-1)[order].to(grad.dtype),
                                      mode="sum").to(table.dtype)
        if ctx.needs_input_grad[2]:
            with torch.enable_grad():
                w = weights.detach().requires_grad_()
                out = F.embedding_bag(rows, table.detach(), per_sample_weights=w, mode="sum")
                d_weights, = torch.autograd.grad(out, w, grad.to(out.dtype))
        return d_table, None, d_weights


class DeformConv2d(nn.Module):
    """Deformable convolution layer; offsets (and the DCNv2 mask) are inputs.

    Same constructor and ``forward(x, offset, mask=None)`` as
    ``torchvision.ops.DeformConv2d`` (plus ``method``, see :func:`deform_conv2d`;
    every method gives the same result); the offset predictor lives with the
    caller (see :class:`gencomm.message.DeformableMessageExtractor`).

    x (N, in_ch, H, W), offset (N, 2*G*k*k, H_out, W_out), mask (N, G*k*k,
    H_out, W_out) or None -> (N, out_ch, H_out, W_out).
    """

    def __init__(self, in_ch: int, out_ch: int, kernel_size: IntPair = 3, padding: IntPair = 1,
                 stride: IntPair = 1, dilation: IntPair = 1, groups: int = 1, bias: bool = True,
                 method: Method = "auto"):
        super().__init__()
        if in_ch % groups or out_ch % groups:
            raise ValueError(f"in_ch {in_ch} and out_ch {out_ch} must be divisible by groups {groups}")
        self.in_channels = in_ch
        self.out_channels = out_ch
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.padding = _pair(padding, "padding")
        self.stride = _pair(stride, "stride")
        self.dilation = _pair(dilation, "dilation")
        self.groups = groups
        self.method = method
        self.weight = nn.Parameter(torch.empty(out_ch, in_ch // groups, *self.kernel_size))
        self.bias = nn.Parameter(torch.empty(out_ch)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight.shape[1] * self.kernel_size[0] * self.kernel_size[1]
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor, offset: torch.Tensor,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return deform_conv2d(x, offset, self.weight, self.bias, self.stride, self.padding,
                             self.dilation, mask, self.method)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}, bias={self.bias is not None}")
