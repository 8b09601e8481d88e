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

Not counted: activations, pooling, element-wise products (SE gate,
attention-free gating), softmax, reshapes. ``torch.utils.flop_counter.
FlopCounterMode`` was checked (torch 2.13): it counts convolutions and
matmuls but gives ``grid_sample`` zero, so it would miss the deformable
sampling; hooks are used instead.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict

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


def _layer_macs(mod: nn.Module, args: tuple, out: Any) -> int:
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

    handles = [m.register_forward_hook(hook) for m in module.modules()
               if isinstance(m, (DeformConv2d, nn.Conv2d, nn.ConvTranspose2d, nn.Linear) + _NORMS)]
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
