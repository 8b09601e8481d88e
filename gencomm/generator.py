"""Spatial-Aware Feature Generator (SAFG): message -> feature in the receiver's space.

One SAFG per RECEIVER type. A conditional diffusion model over BEV features:

1. ``x_{T-1} = sqrt(abar_{T-1}) * init + sqrt(1 - abar_{T-1}) * eps`` where
   ``init`` is the receiver's own feature (N, C, H, W) in the receiver frame
   and ``T = num_steps`` (3): the init is noised to the LAST step.
2. For ``t = T-1 .. 0``: a small UNet sees ``[message, x_t]`` (concatenated
   on channels) and the step ``t`` and predicts the clean feature ``x0_hat``
   (x0 parameterisation). For ``t > 0`` a DDPM ancestral step draws
   ``x_{t-1} ~ N(mu_t, var_t)`` with the posterior of q(x_{t-1} | x_t, x0_hat)::

       mu_t  = sqrt(abar_{t-1}) * beta_t / (1 - abar_t) * x0_hat
             + sqrt(alpha_t) * (1 - abar_{t-1}) / (1 - abar_t) * x_t
       var_t = beta_t * (1 - abar_{t-1}) / (1 - abar_t)     ("fixed_small")

   At ``t = 0`` the output is ``x0_hat``.

The chain is unrolled in torch, so detection and generation losses reach the
UNet through every step; all N agents go through each step as one batch.
The schedule comes from a ``diffusers.DDPMScheduler`` built with
``trained_betas`` (betas linear in sqrt(beta) from beta_start to beta_end,
i.e. 5e-3, 2.17e-2, 5e-2 for 3 steps), ``prediction_type="sample"`` and
``clip_sample=False`` (features are not images in [-1, 1]); its
``alphas_cumprod`` feed the step above, which equals ``scheduler.step``
(tested) but is batched and device-resident.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Literal, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler
from torch import Tensor, nn

from .split_conv import MessageInputConv


def _norm(channels: int, groups: Optional[int] = None, eps: float = 1e-5) -> nn.GroupNorm:
    """GroupNorm with ``groups`` groups (default gcd(8, channels))."""
    return nn.GroupNorm(math.gcd(8, channels) if groups is None else groups, channels, eps=eps)


class _ResBlock(nn.Module):
    """GN-SiLU-conv, + step embedding shift, GN-SiLU-conv, residual. (N, cin, H, W) -> (N, cout, H, W).

    norm_groups / eps: of both GroupNorms (None: gcd(8, channels)). emb_act: apply SiLU to the
    step embedding before this block's linear projection.
    """

    def __init__(self, cin: int, cout: int, emb_dim: int, norm_groups: Optional[int] = None,
                 eps: float = 1e-5, emb_act: bool = False):
        super().__init__()
        self.norm1, self.conv1 = _norm(cin, norm_groups, eps), nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb_dim, cout)
        self.norm2, self.conv2 = _norm(cout, norm_groups, eps), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()
        self.emb_act = emb_act

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:
        e = self.emb(F.silu(emb) if self.emb_act else emb)
        h = self.conv1(F.silu(self.norm1(x))) + e[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class ConditionalUNet(nn.Module):
    """Two-level UNet: (N, in_channels, H, W), step (N,) -> (N, out_channels, H, W).

    Any H, W (odd sizes too): the up path resizes to the skip's size.
    """

    def __init__(self, in_channels: int, out_channels: int, base_channels: int = 32, num_steps: int = 3):
        super().__init__()
        b = base_channels
        emb_dim = 4 * b
        self.step_embed = nn.Sequential(nn.Embedding(num_steps, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.inp = MessageInputConv(in_channels, b, 3, padding=1)
        self.enc = _ResBlock(b, b, emb_dim)
        self.down = nn.Conv2d(b, 2 * b, 3, stride=2, padding=1)
        self.mid = _ResBlock(2 * b, 2 * b, emb_dim)
        self.up = nn.Conv2d(2 * b, b, 3, padding=1)
        self.dec = _ResBlock(2 * b, b, emb_dim)
        self.out_norm = _norm(b)
        self.out = nn.Conv2d(b, out_channels, 1)

    def forward(self, x: Tensor, step: Tensor) -> Tensor:
        return self.body(self.inp(x), step)

    def body(self, h: Tensor, step: Tensor) -> Tensor:
        """Everything after the input conv: h = ``inp(x)`` (N, b, H, W), step (N,) -> (N, out, H, W)."""
        emb = self.step_embed(step)
        skip = self.enc(h, emb)
        h = self.mid(self.down(skip), emb)
        h = self.up(F.interpolate(h, size=skip.shape[-2:], mode="nearest"))
        h = self.dec(torch.cat([h, skip], dim=1), emb)
        return self.out(F.silu(self.out_norm(h)))


def sinusoidal_embedding(steps: Tensor, dim: int) -> Tensor:
    """(N,) step indices -> (N, dim) float: ``[sin(t f_0..f_{h-1}), cos(t f_0..f_{h-1})]``,
    ``h = dim // 2``, ``f_i = 10000 ** (-i / (h - 1))``; a zero column is appended when dim is odd."""
    half = dim // 2
    if half < 2:
        raise ValueError(f"sinusoidal step embedding needs dim >= 4, got {dim}")
    freqs = torch.exp(torch.arange(half, device=steps.device, dtype=torch.float32)
                      * (-math.log(10000.0) / (half - 1)))
    ang = steps.float()[:, None] * freqs[None]
    emb = torch.cat([ang.sin(), ang.cos()], dim=1)
    return F.pad(emb, (0, 1)) if dim % 2 else emb


class _Downsample(nn.Module):
    """Zero-pad one row/column at the bottom/right, 3x3 conv with stride 2: (N, c, H, W) -> (N, c, ceil(H/2)..)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class ResidualUNet(nn.Module):
    """DDPM-style UNet, the structure the reference GenComm's generator uses:
    (N, in_channels, H, W), step (N,) -> (N, out_channels, H, W).

    ``b = base_channels``; level ``i`` is ``b * channel_mult[i]`` wide. Step embedding:
    sinusoidal(b) -> Linear(b, 4b) -> SiLU -> Linear(4b, 4b); each residual block adds
    ``Linear(4b, cout)(SiLU(emb))`` after its first conv; GroupNorm(norm_groups, eps 1e-6).

    - in: 3x3 conv in_channels -> b
    - down: per level ``num_res_blocks`` blocks, then (all but the last level) a stride-2
      conv (zero pad bottom/right); every block/downsample output is kept as a skip
    - middle: two blocks
    - up: per level (last first) ``num_res_blocks + 1`` blocks, each on [h, popped skip];
      then (all but level 0) nearest resize to the next skip's size + 3x3 conv
    - out: GN-SiLU-3x3 conv b -> out_channels

    ``up_blocks`` and ``upsample`` run deepest level first (``up_blocks[k]`` is level
    ``levels - 1 - k``); the reference numbers its ``up[i]`` by level, which the weight importer
    renumbers (:mod:`gencomm.interop`).

    Any H, W >= 2 ** (levels - 1): the up path resizes to each skip's size.
    """

    def __init__(self, in_channels: int, out_channels: int, base_channels: int = 8,
                 channel_mult: Sequence[int] = (1, 1), num_res_blocks: int = 2, norm_groups: int = 4):
        super().__init__()
        b, mult = base_channels, tuple(int(m) for m in channel_mult)
        if not mult or min(mult) < 1 or num_res_blocks < 1:
            raise ValueError(f"ResidualUNet needs channel_mult >= 1 and num_res_blocks >= 1, got {channel_mult}, "
                             f"{num_res_blocks}")
        if any((b * m) % norm_groups for m in mult):
            raise ValueError(f"ResidualUNet widths {[b * m for m in mult]} not divisible by norm_groups {norm_groups}")
        emb_dim = 4 * b
        self.base_channels, self.levels = b, len(mult)
        self.step_embed = nn.Sequential(nn.Linear(b, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        block = partial(_ResBlock, emb_dim=emb_dim, norm_groups=norm_groups, eps=1e-6, emb_act=True)
        self.inp = MessageInputConv(in_channels, b, 3, padding=1)
        skips, cur = [b], b
        self.down_blocks, self.downsample = nn.ModuleList(), nn.ModuleList()
        for i, m in enumerate(mult):
            level = nn.ModuleList()
            for _ in range(num_res_blocks):
                level.append(block(cur, b * m))
                cur = b * m
                skips.append(cur)
            self.down_blocks.append(level)
            if i < len(mult) - 1:
                self.downsample.append(_Downsample(cur))
                skips.append(cur)
        self.mid = nn.ModuleList([block(cur, cur), block(cur, cur)])
        self.up_blocks, self.upsample = nn.ModuleList(), nn.ModuleList()
        for i in reversed(range(len(mult))):
            level = nn.ModuleList()
            for _ in range(num_res_blocks + 1):
                level.append(block(cur + skips.pop(), b * mult[i]))
                cur = b * mult[i]
            self.up_blocks.append(level)
            if i > 0:
                self.upsample.append(nn.Conv2d(cur, cur, 3, padding=1))
        self.out_norm = _norm(cur, norm_groups, 1e-6)
        self.out = nn.Conv2d(cur, out_channels, 3, padding=1)

    def forward(self, x: Tensor, step: Tensor) -> Tensor:
        return self.body(self.inp(x), step)

    def body(self, h: Tensor, step: Tensor) -> Tensor:
        """Everything after the input conv: h = ``inp(x)`` (N, b, H, W), step (N,) -> (N, out, H, W)."""
        if min(h.shape[-2:]) < 2 ** (self.levels - 1):
            raise ValueError(f"ResidualUNet with {self.levels} levels needs H, W >= {2 ** (self.levels - 1)}, "
                             f"got {tuple(h.shape[-2:])}")
        emb = self.step_embed(sinusoidal_embedding(step, self.base_channels).to(h.dtype))
        hs = [h]
        for i, level in enumerate(self.down_blocks):
            for blk in level:
                hs.append(blk(hs[-1], emb))
            if i < len(self.downsample):
                hs.append(self.downsample[i](hs[-1]))
        h = hs[-1]
        for blk in self.mid:
            h = blk(h, emb)
        for j, level in enumerate(self.up_blocks):
            for blk in level:
                h = blk(torch.cat([h, hs.pop()], dim=1), emb)
            if j < len(self.upsample):
                h = self.upsample[j](F.interpolate(h, size=hs[-1].shape[-2:], mode="nearest"))
        return self.out(F.silu(self.out_norm(h)))


@dataclass
class GenerationOutput:
    """SAFG result; all tensors (N, C, H, W) in the receiver's frame.

    feature: the generated feature (x0_hat of the last step).
    x_start: the noised init the chain started from (x_{T-1}).
    x0_predictions: x0_hat of each step, in chain order (t = T-1 first).
    timesteps: the step indices in chain order, e.g. (2, 1, 0).
    """
    feature: Tensor
    x_start: Tensor
    x0_predictions: Tuple[Tensor, ...]
    timesteps: Tuple[int, ...]


def sqrt_linear_betas(beta_start: float, beta_end: float, num_steps: int) -> np.ndarray:
    """Betas linear in sqrt(beta): (num_steps,) float64."""
    return np.linspace(math.sqrt(beta_start), math.sqrt(beta_end), num_steps, dtype=np.float64) ** 2


class SpatialAwareFeatureGenerator(nn.Module):
    """Generates the collaborator's feature in the receiver's semantic space.

    Args:
        feature_channels: C of the receiver's BEV feature.
        message_channels: m of the message.
        variant: the denoising UNet.
            ``"compact"`` (:class:`ConditionalUNet`, two levels, one block each, learned step
            embedding; C=128, m=2: 69,616 parameters at b=16, 234,848 at b=32, 852,544 at b=64).
            ``"reference"`` (:class:`ResidualUNet`, the reference GenComm's structure and size:
            b=8, channel_mult (1, 1), 2 blocks per level, GroupNorm(4); 43,176 parameters at
            C=128, m=2, b=8; arithmetic below).
        base_channels: UNet width b.
        channel_mult, num_res_blocks: ``reference`` only (defaults (1, 1) and 2).
        num_steps: diffusion steps (3 in the paper).
        beta_start, beta_end: ends of the sqrt-linear beta schedule.

    ``reference`` parameters at C=128, m=2, b=8 (weights + biases; GN = 2 * channels)::

        step MLP   (8*32+32) + (32*32+32)                        =  1,344
        in conv    130*8*9 + 8                                   =  9,368
        block 8->8    GN 16 + conv 584 + emb 32*8+8=264 + GN 16 + conv 584 = 1,464
        block 16->8   GN 32 + conv 16*8*9+8=1,160 + emb 264 + GN 16 + conv 584
                      + 1x1 skip 16*8+8=136                      =  2,192
        down: 4 blocks 8->8 (5,856) + stride-2 conv 584          =  6,440
        middle: 2 blocks 8->8                                     =  2,928
        up: 6 blocks 16->8 (13,152) + upsample conv 584           = 13,736
        out GN 16 + 3x3 conv 8*128*9+128                          =  9,360
        total                                                     = 43,176
    """

    def __init__(self, feature_channels: int = 128, message_channels: int = 2, base_channels: int = 32,
                 num_steps: int = 3, beta_start: float = 5e-3, beta_end: float = 5e-2,
                 variant: Literal["compact", "reference"] = "compact",
                 channel_mult: Optional[Sequence[int]] = None, num_res_blocks: Optional[int] = None):
        super().__init__()
        if num_steps < 1:
            raise ValueError(f"SAFG num_steps must be >= 1, got {num_steps}")
        if not 0.0 < beta_start <= beta_end < 1.0:
            raise ValueError(f"SAFG needs 0 < beta_start <= beta_end < 1, got {beta_start}, {beta_end}")
        if variant not in ("compact", "reference"):
            raise ValueError(f"SAFG variant must be 'compact' or 'reference', got {variant!r}")
        if variant == "compact" and (channel_mult is not None or num_res_blocks is not None):
            raise ValueError("SAFG channel_mult / num_res_blocks apply to variant 'reference' only")
        self.feature_channels = feature_channels
        self.message_channels = message_channels
        self.beta_start, self.beta_end = float(beta_start), float(beta_end)
        self.out_channels = feature_channels
        self.num_steps = num_steps
        self.variant = variant
        self.scheduler = DDPMScheduler(
            num_train_timesteps=num_steps, trained_betas=sqrt_linear_betas(beta_start, beta_end, num_steps).tolist(),
            prediction_type="sample", clip_sample=False, variance_type="fixed_small")
        in_ch = message_channels + feature_channels
        if variant == "reference":
            self.unet = ResidualUNet(in_ch, feature_channels, base_channels,
                                     (1, 1) if channel_mult is None else channel_mult,
                                     2 if num_res_blocks is None else num_res_blocks)
        else:
            self.unet = ConditionalUNet(in_ch, feature_channels, base_channels, num_steps)
        abar = self.scheduler.alphas_cumprod.double()
        betas = self.scheduler.betas.double()
        abar_prev = torch.cat([abar.new_ones(1), abar[:-1]])
        self.register_buffer("alphas_cumprod", abar.float(), persistent=False)
        self.register_buffer("coef_x0", (abar_prev.sqrt() * betas / (1 - abar)).float(), persistent=False)
        self.register_buffer("coef_xt", ((1 - betas).sqrt() * (1 - abar_prev) / (1 - abar)).float(),
                             persistent=False)
        var = (betas * (1 - abar_prev) / (1 - abar)).clamp(min=1e-20)
        self.register_buffer("posterior_std", var.sqrt().float(), persistent=False)
        self._coefs = [(float(self.coef_x0[t]), float(self.coef_xt[t]), float(self.posterior_std[t]))
                       for t in range(num_steps)]
        self._start = (float(abar[-1].sqrt()), float((1 - abar[-1]).sqrt()))

    @staticmethod
    def _noise(like: Tensor, generator: Optional[torch.Generator]) -> Tensor:
        if generator is None:
            return torch.randn_like(like)
        # Drawn on the generator's device, so a seeded CPU generator is reproducible on any device.
        return torch.randn(like.shape, generator=generator, device=generator.device,
                           dtype=like.dtype).to(like.device)

    def posterior_step(self, x0_pred: Tensor, x_t: Tensor, t: int, noise: Optional[Tensor]) -> Tensor:
        """x_{t-1} = mu_t(x0_pred, x_t) + std_t * noise (noise None or t == 0: the mean).

        One new tensor, accumulated in place with Python-float coefficients (the chain's
        element-wise work on (N, C, H, W) maps is a visible part of its CPU time)."""
        c_x0, c_xt, std = self._coefs[t]
        out = x0_pred.mul(c_x0).add_(x_t, alpha=c_xt)
        if t == 0 or noise is None:
            return out
        return out.add_(noise, alpha=std)

    def forward(self, message: Tensor, init_feature: Tensor,
                generator: Optional[torch.Generator] = None) -> GenerationOutput:
        """message (N, m, H, W) and init_feature (N, C, H, W), both in the receiver frame."""
        if message.dim() != 4 or message.shape[1] != self.message_channels:
            raise ValueError(f"SAFG message must be (N, {self.message_channels}, H, W), got {tuple(message.shape)}")
        if init_feature.dim() != 4 or init_feature.shape[1] != self.feature_channels:
            raise ValueError(
                f"SAFG init_feature must be (N, {self.feature_channels}, H, W), got {tuple(init_feature.shape)}")
        if message.shape[0] != init_feature.shape[0] or message.shape[2:] != init_feature.shape[2:]:
            raise ValueError(f"SAFG message {tuple(message.shape)} and init_feature {tuple(init_feature.shape)} "
                             "must share N, H, W")
        t_last = self.num_steps - 1
        a, b = self._start
        x = init_feature.mul(a).add_(self._noise(init_feature, generator), alpha=b)
        x_start = x
        # The UNet's input conv on [message, x_t]: the message's half (with the bias) once for all
        # steps, then each step convolves x_t alone and adds it (gencomm.split_conv)
        message_term = self.unet.inp.message_term(message.to(init_feature.dtype))
        preds, steps = [], []
        for t in range(t_last, -1, -1):
            step = torch.full((x.shape[0],), t, dtype=torch.long, device=x.device)
            x0 = self.unet.body(self.unet.inp(x, message_term), step)
            preds.append(x0)
            steps.append(t)
            if t > 0:  # the last step's output is x0_hat itself; its posterior mean is never used
                x = self.posterior_step(x0, x, t, self._noise(x, generator))
        return GenerationOutput(feature=preds[-1], x_start=x_start, x0_predictions=tuple(preds),
                                timesteps=tuple(steps))


def generation_loss(pred: Tensor, target: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Mean squared error between (N, C, H, W) features.

    mask: optional (N, H, W) or (N, 1, H, W) weights (e.g. where the
    collaborator's warped feature is valid); the mean is over weighted
    elements. Returns 0 (with a graph) when the mask is all zero.
    """
    if pred.shape != target.shape:
        raise ValueError(f"generation_loss: pred {tuple(pred.shape)} vs target {tuple(target.shape)}")
    err = (pred - target) ** 2
    if mask is None:
        return err.mean()
    if mask.dim() == 3:
        mask = mask[:, None]
    if mask.shape[0] != pred.shape[0] or mask.shape[1] != 1 or mask.shape[2:] != pred.shape[2:]:
        raise ValueError(f"generation_loss: mask {tuple(mask.shape)} must be (N, [1,] H, W) for {tuple(pred.shape)}")
    mask = mask.to(err.dtype)
    denom = mask.sum() * pred.shape[1]
    return (err * mask).sum() / denom.clamp(min=1.0)
