"""Parameter and FLOP counting (forward hooks), deformable conv included.

Definitions. A MAC is one multiply-accumulate; FLOPs = 2 x MACs (the
convention of ``torch.utils.flop_counter``, which gives 2*MACs for a conv).
Counted per forward call of each leaf layer:

- Conv2d: out.numel() * (C_in / groups) * kh * kw MACs (bias not counted);
- ConvTranspose2d: in.numel() * (C_out / groups) * kh * kw;
- Linear: out.numel() * in_features;
- BatchNorm / GroupNorm / LayerNorm / InstanceNorm: 1 MAC per output element
  (the scale-and-shift);
- DeformConv2d (opencood_ext.models.deform_conv): the contraction, out.numel() *
  (C_in / groups) * kh * kw, PLUS bilinear sampling, 4 MACs per sampled value
  (N * C_in * kh*kw * H_out*W_out values), plus 1 more per value when
  modulated. Its offset conv is a Conv2d and is counted as one.
- spconv's sparse convolutions (SubMConv3d, SparseConv3d; SECOND): one
  (C_in / groups) * C_out contraction per (input site, kernel offset) pair the
  sparse conv actually forms, counted exactly from the input's active sites
  (:func:`sparse_conv_pairs`), so a sparse conv costs what its sites cost.

Not counted: activations, pooling, element-wise products (SE gate,
attention-free gating), softmax, reshapes. ``torch.utils.flop_counter.
FlopCounterMode`` was checked (torch 2.13): it counts convolutions and
matmuls but gives ``grid_sample`` zero, so it would miss the deformable
sampling; hooks are used instead.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Sequence

import torch
from torch import nn

from opencood_ext.models.deform_conv import DeformConv2d

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm, nn.LayerNorm,
          nn.InstanceNorm1d, nn.InstanceNorm2d)


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (only those with requires_grad when ``trainable_only``)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


@dataclass
class FlopReport:
    """macs: total multiply-accumulates; flops: 2 * macs; by_type: MACs per layer class name."""
    macs: int
    flops: int
    by_type: Dict[str, int] = field(default_factory=dict)


def _sparse_conv_types() -> tuple:
    """spconv's sparse convolution class, when spconv is installed (it is optional)."""
    try:
        from spconv.pytorch.conv import SparseConvolution
    except ImportError:
        return ()
    return (SparseConvolution,)


def sparse_conv_pairs(indices: torch.Tensor, spatial_shape, kernel_size, stride, padding, dilation,
                      subm: bool) -> int:
    """(input site, kernel offset) pairs a sparse conv forms on active sites ``indices``
    (N, 1 + D) ``[batch, d_1, ..., d_D]`` of a grid ``spatial_shape`` (D,).

    Submanifold (``subm``): the output sites are the input sites; a pair is an input site and an
    offset ``(k - k_size // 2) * dilation`` that lands on another (or the same) active site.
    Regular: a pair is an input site ``p`` and an offset ``k`` for which ``p + padding -
    k * dilation`` is a multiple of ``stride`` inside the output grid (that output site is then
    active, so every such pair is one multiply of the gather-GEMM-scatter)."""
    coords = indices[:, 1:].long()
    shape = torch.as_tensor(list(spatial_shape), dtype=torch.long, device=coords.device)
    ks, st, pad, dil = (torch.as_tensor(list(v), dtype=torch.long, device=coords.device)
                        for v in (kernel_size, stride, padding, dilation))
    offsets = torch.cartesian_prod(*[torch.arange(int(k), device=coords.device) for k in ks]).reshape(-1, len(ks))
    if subm:
        # linear index of each site over (batch, grid); a neighbour outside the grid is no site
        place = torch.cat([shape[1:].flip(0).cumprod(0).flip(0), shape.new_ones(1)])
        batch = indices[:, 0].long() * int(shape.prod())
        active = batch + coords @ place
        total = 0
        for off in offsets:
            q = coords + (off - ks // 2) * dil
            inside = ((q >= 0) & (q < shape)).all(dim=1)
            total += int(torch.isin(batch[inside] + q[inside] @ place, active).sum())
        return total
    out_shape = (shape + 2 * pad - dil * (ks - 1) - 1) // st + 1
    total = 0
    for off in offsets:
        q = coords + pad - off * dil
        o = torch.div(q, st, rounding_mode="floor")
        total += int(((q % st == 0).all(dim=1) & (o >= 0).all(dim=1) & (o < out_shape).all(dim=1)).sum())
    return total


def _layer_macs(mod: nn.Module, args: tuple, out: Any) -> int:
    sparse = _sparse_conv_types()
    if sparse and isinstance(mod, sparse):
        if mod.transposed or mod.inverse:
            raise ValueError(f"FLOP count: transposed / inverse sparse convs ({type(mod).__name__}) are not counted")
        x = args[0]
        pairs = sparse_conv_pairs(x.indices, x.spatial_shape, mod.kernel_size, mod.stride, mod.padding,
                                  mod.dilation, bool(mod.subm))
        return pairs * (mod.in_channels // mod.groups) * mod.out_channels
    if isinstance(mod, DeformConv2d):
        x = args[0]  # args: (input, offset[, mask])
        mask = args[2] if len(args) > 2 else None
        kk = mod.kernel_size[0] * mod.kernel_size[1]
        samples = x.shape[0] * x.shape[1] * kk * out.shape[2] * out.shape[3]
        contraction = out.numel() * (mod.in_channels // mod.groups) * kk
        return contraction + samples * (5 if mask is not None else 4)
    if isinstance(mod, nn.Conv2d):
        return out.numel() * (mod.in_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1]
    if isinstance(mod, nn.ConvTranspose2d):
        return args[0].numel() * (mod.out_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1]
    if isinstance(mod, nn.Linear):
        return out.numel() * mod.in_features
    if isinstance(mod, _NORMS):
        return out.numel()
    return 0


def profile_flops(module: nn.Module, inputs) -> FlopReport:
    """Run ``module(*inputs)`` once under no_grad and count MACs of the layers listed above.

    inputs: a tensor or a tuple of positional arguments. The pass runs in eval
    mode (so BatchNorm statistics are not touched); each submodule's
    train/eval flag is restored afterwards.
    """
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    by_type: Dict[str, int] = defaultdict(int)

    def hook(mod, hook_args, out):
        macs = _layer_macs(mod, hook_args, out)
        if macs:
            by_type[type(mod).__name__] += int(macs)

    counted = (DeformConv2d, nn.Conv2d, nn.ConvTranspose2d, nn.Linear) + _NORMS + _sparse_conv_types()
    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, counted)]
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            module(*args)
    finally:
        for h in handles:
            h.remove()
        for m, was_training in modes:
            m.training = was_training
    macs = sum(by_type.values())
    return FlopReport(macs=macs, flops=2 * macs, by_type=dict(by_type))


def count_flops(module: nn.Module, inputs) -> int:
    """FLOPs (2 x MACs) of one forward call; see the module docstring for what is counted."""
    return profile_flops(module, inputs).flops


class _Probe(nn.Module):
    """Holds ``modules`` as its only submodules (so the hooks go on them alone) and runs ``run``."""

    def __init__(self, modules: Sequence[nn.Module], run: Callable[[], object]):
        super().__init__()
        self.parts = nn.ModuleList(modules)
        self._run = run

    def forward(self):
        return self._run()


def flops_during(modules: Sequence[nn.Module], run: Callable[[], object]) -> int:
    """FLOPs of the layers of ``modules`` (a layer two of them share hooked once) while ``run()``
    runs, e.g. one forward pass of the model that holds them: what those parts cost inside a real
    pass, where their inputs come from the rest of the model. Eval mode, no gradients, as :func:`profile_flops`."""
    return profile_flops(_Probe(modules, run), ()).flops
