"""GenComm's modules in the reference GenComm's checkpoint layout: the weight-import layouts
(:data:`opencood_ext.interop.layouts.LAYOUTS`) of the ``variant: reference`` message extractor,
generator and enhancer, registered when :mod:`gencomm` is imported.

Reference modules (jeffreychou777/GenComm, ``opencood/models/gencomm_modules``), under the
prefixes of :data:`~opencood_ext.interop.layouts.SLOTS`:

* ``message_extractor_<m>.bev_extractor``: ``offset1`` (3x3 conv), ``dcn1`` (deformable conv with
  bias), ``attn.1`` / ``attn.3`` (the SE gate's 1x1 convs), ``fuse.0`` / ``fuse.2`` (1x1 convs);
* ``gencomm``: ``denoiser`` (the DDPM UNet: ``temb.dense``, ``conv_in``, ``down.<i>.block.<j>``,
  ``down.<i>.downsample.conv``, ``mid.block_1/2``, ``up.<i>.block.<j>``, ``up.<i>.upsample.conv``,
  ``norm_out``, ``conv_out``; residual blocks ``norm1 conv1 temb_proj norm2 conv2 nin_shortcut``)
  and twelve schedule buffers, which our generator computes: they are checked on import;
* ``enhancer``: ``block_1.{norm1, norm2, mlp.*}`` and ``split_attn.*`` (read by its forward);
  ``block_1.attn``, ``block_2`` and ``block_3`` are held but never read, and are dropped.
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from opencood_ext.interop.layouts import LAYOUTS, Layout, linear_as_conv1x1

from .enhancer import ChannelEnhancer
from .generator import SpatialAwareFeatureGenerator, sqrt_linear_betas
from .message import DeformableMessageExtractor


def reference_schedule(safg: SpatialAwareFeatureGenerator) -> Dict[str, Tensor]:
    """The reference GenComm's persistent schedule buffers for ``safg``'s betas (float64 math, stored
    float32; x0 parameterisation, posterior variance without the v_posterior mix)."""
    b = sqrt_linear_betas(safg.beta_start, safg.beta_end, safg.num_steps)
    abar = np.cumprod(1.0 - b)
    prev = np.append(1.0, abar[:-1])
    var = b * (1.0 - prev) / (1.0 - abar)
    values = {
        "betas": b, "alphas_cumprod": abar, "alphas_cumprod_prev": prev,
        "sqrt_alphas_cumprod": np.sqrt(abar), "sqrt_one_minus_alphas_cumprod": np.sqrt(1.0 - abar),
        "log_one_minus_alphas_cumprod": np.log(1.0 - abar), "sqrt_recip_alphas_cumprod": np.sqrt(1.0 / abar),
        "sqrt_recipm1_alphas_cumprod": np.sqrt(1.0 / abar - 1.0), "posterior_variance": var,
        "posterior_log_variance_clipped": np.log(np.maximum(var, 1e-20)),
        "posterior_mean_coef1": b * np.sqrt(prev) / (1.0 - abar),
        "posterior_mean_coef2": (1.0 - prev) * np.sqrt(1.0 - b) / (1.0 - abar),
    }
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in values.items()}


def _schedule_entry(name: str) -> Tuple[str, Callable[[nn.Module], Tensor]]:
    return name, lambda safg: reference_schedule(safg)[name]


def _up_level(safg: nn.Module, k: int) -> int:
    """Our up path runs deepest level first (up_blocks[k], upsample[k] belong to level L - 1 - k); the
    reference's up[i] is level i. Its own inverse."""
    return safg.unet.levels - 1 - k


def _res_block(ref: str, ours: str) -> Tuple[Tuple[str, str], ...]:
    """The reference ResnetBlock's names below ``ref`` <-> our _ResBlock's below ``ours``."""
    return ((f"{ref}.{{m:norm1|conv1|norm2|conv2}}.{{p}}", f"{ours}.{{m:norm1|conv1|norm2|conv2}}.{{p}}"),
            (f"{ref}.temb_proj.{{p}}", f"{ours}.emb.{{p}}"),
            (f"{ref}.nin_shortcut.{{p}}", f"{ours}.skip.{{p}}"))


_X = "bev_extractor"
MESSAGE_LAYOUT = Layout(
    keys=((f"{_X}.offset1.{{p}}", "offset.{p}"), (f"{_X}.dcn1.{{p}}", "deform.{p}"),
          (f"{_X}.attn.1.{{p}}", "se.fc1.{p}"), (f"{_X}.attn.3.{{p}}", "se.fc2.{p}"),
          (f"{_X}.fuse.0.{{p}}", "conv1.{p}"), (f"{_X}.fuse.2.{{p}}", "head.{p}")),
    transforms=(("se.{f:fc1|fc2}.weight", linear_as_conv1x1),), variant="reference")

_D = "denoiser"
GENERATOR_LAYOUT = Layout(
    keys=((f"{_D}.temb.dense.0.{{p}}", "unet.step_embed.0.{p}"), (f"{_D}.temb.dense.1.{{p}}", "unet.step_embed.2.{p}"),
          (f"{_D}.conv_in.{{p}}", "unet.inp.{p}"),
          *_res_block(f"{_D}.down.{{i}}.block.{{j}}", "unet.down_blocks.{i}.{j}"),
          (f"{_D}.down.{{i}}.downsample.conv.{{p}}", "unet.downsample.{i}.conv.{p}"),
          *_res_block(f"{_D}.mid.block_1", "unet.mid.0"), *_res_block(f"{_D}.mid.block_2", "unet.mid.1"),
          *_res_block(f"{_D}.up.{{u}}.block.{{j}}", "unet.up_blocks.{u}.{j}"),
          (f"{_D}.up.{{u}}.upsample.conv.{{p}}", "unet.upsample.{u}.{p}"),
          (f"{_D}.norm_out.{{p}}", "unet.out_norm.{p}"), (f"{_D}.conv_out.{{p}}", "unet.out.{p}")),
    derived=tuple(_schedule_entry(n) for n in (
        "betas", "alphas_cumprod", "alphas_cumprod_prev", "sqrt_alphas_cumprod", "sqrt_one_minus_alphas_cumprod",
        "log_one_minus_alphas_cumprod", "sqrt_recip_alphas_cumprod", "sqrt_recipm1_alphas_cumprod",
        "posterior_variance", "posterior_log_variance_clipped", "posterior_mean_coef1", "posterior_mean_coef2")),
    renumber=(("u", _up_level),), variant="reference")

ENHANCER_LAYOUT = Layout(
    keys=(("block_1.{m:norm1|norm2}.{p}", "reference.{m:norm1|norm2}.{p}"),
          ("block_1.mlp.partial_conv3.{p}", "reference.partial_conv.{p}"),
          ("block_1.mlp.linear1.0.{p}", "reference.linear1.{p}"),
          ("block_1.mlp.dwconv.0.{p}", "reference.dwconv.{p}"),
          ("block_1.mlp.linear2.0.{p}", "reference.linear2.{p}"),
          ("split_attn.fc1.{p}", "reference.gate_fc1.{p}"), ("split_attn.bn1.{p}", "reference.gate_norm.{p}"),
          ("split_attn.fc2.{p}", "reference.gate_fc2.{p}")),
    ignored=("block_1.attn.", "block_2.", "block_3."), variant="reference")

LAYOUTS[DeformableMessageExtractor] = MESSAGE_LAYOUT
LAYOUTS[SpatialAwareFeatureGenerator] = GENERATOR_LAYOUT
LAYOUTS[ChannelEnhancer] = ENHANCER_LAYOUT
