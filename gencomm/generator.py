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
from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler
from torch import Tensor, nn


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(8, channels), channels)


class _ResBlock(nn.Module):
    """GN-SiLU-conv, + step embedding shift, GN-SiLU-conv, residual. (N, cin, H, W) -> (N, cout, H, W)."""

    def __init__(self, cin: int, cout: int, emb_dim: int):
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb_dim, cout)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.emb(emb)[:, :, None, None]
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
        self.inp = nn.Conv2d(in_channels, b, 3, padding=1)
        self.enc = _ResBlock(b, b, emb_dim)
        self.down = nn.Conv2d(b, 2 * b, 3, stride=2, padding=1)
        self.mid = _ResBlock(2 * b, 2 * b, emb_dim)
        self.up = nn.Conv2d(2 * b, b, 3, padding=1)
        self.dec = _ResBlock(2 * b, b, emb_dim)
        self.out_norm = _norm(b)
        self.out = nn.Conv2d(b, out_channels, 1)

    def forward(self, x: Tensor, step: Tensor) -> Tensor:
        emb = self.step_embed(step)
        skip = self.enc(self.inp(x), emb)
        h = self.mid(self.down(skip), emb)
        h = self.up(F.interpolate(h, size=skip.shape[-2:], mode="nearest"))
        h = self.dec(torch.cat([h, skip], dim=1), emb)
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
        base_channels: UNet width b (C=128, m=2: 69,616 parameters at b=16,
            234,848 at b=32, 852,544 at b=64).
        num_steps: diffusion steps (3 in the paper).
        beta_start, beta_end: ends of the sqrt-linear beta schedule.
    """

    def __init__(self, feature_channels: int = 128, message_channels: int = 2, base_channels: int = 32,
                 num_steps: int = 3, beta_start: float = 5e-3, beta_end: float = 5e-2):
        super().__init__()
        if num_steps < 1:
            raise ValueError(f"SAFG num_steps must be >= 1, got {num_steps}")
        if not 0.0 < beta_start <= beta_end < 1.0:
            raise ValueError(f"SAFG needs 0 < beta_start <= beta_end < 1, got {beta_start}, {beta_end}")
        self.feature_channels = feature_channels
        self.message_channels = message_channels
        self.out_channels = feature_channels
        self.num_steps = num_steps
        self.scheduler = DDPMScheduler(
            num_train_timesteps=num_steps, trained_betas=sqrt_linear_betas(beta_start, beta_end, num_steps).tolist(),
            prediction_type="sample", clip_sample=False, variance_type="fixed_small")
        self.unet = ConditionalUNet(message_channels + feature_channels, feature_channels, base_channels, num_steps)
        abar = self.scheduler.alphas_cumprod.double()
        betas = self.scheduler.betas.double()
        abar_prev = torch.cat([abar.new_ones(1), abar[:-1]])
        self.register_buffer("alphas_cumprod", abar.float(), persistent=False)
        self.register_buffer("coef_x0", (abar_prev.sqrt() * betas / (1 - abar)).float(), persistent=False)
        self.register_buffer("coef_xt", ((1 - betas).sqrt() * (1 - abar_prev) / (1 - abar)).float(),
                             persistent=False)
        var = (betas * (1 - abar_prev) / (1 - abar)).clamp(min=1e-20)
        self.register_buffer("posterior_std", var.sqrt().float(), persistent=False)

    @staticmethod
    def _noise(like: Tensor, generator: Optional[torch.Generator]) -> Tensor:
        if generator is None:
            return torch.randn_like(like)
        # Drawn on the generator's device, so a seeded CPU generator is reproducible on any device.
        return torch.randn(like.shape, generator=generator, device=generator.device,
                           dtype=like.dtype).to(like.device)

    def posterior_step(self, x0_pred: Tensor, x_t: Tensor, t: int, noise: Optional[Tensor]) -> Tensor:
        """x_{t-1} = mu_t(x0_pred, x_t) + std_t * noise (noise None or t == 0: the mean)."""
        mean = self.coef_x0[t] * x0_pred + self.coef_xt[t] * x_t
        if t == 0 or noise is None:
            return mean
        return mean + self.posterior_std[t] * noise

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
        abar = self.alphas_cumprod[t_last]
        x = abar.sqrt() * init_feature + (1 - abar).sqrt() * self._noise(init_feature, generator)
        x_start = x
        message = message.to(init_feature.dtype)
        preds, steps = [], []
        for t in range(t_last, -1, -1):
            step = torch.full((x.shape[0],), t, dtype=torch.long, device=x.device)
            x0 = self.unet(torch.cat([message, x], dim=1), step)
            preds.append(x0)
            steps.append(t)
            x = self.posterior_step(x0, x, t, self._noise(x, generator) if t > 0 else None)
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
