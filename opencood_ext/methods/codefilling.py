"""CodeFilling (Hu et al., CVPR 2024) as a heterogeneous baseline: a collaborator sends,
per BEV cell, the indices of codebook entries that describe its feature; the
receiver holds the same codebook and rebuilds the feature from the indices.

The quantiser (:class:`ResidualCodebookQuantizer`) follows the GenComm reference
baseline (``heter_model_baseline_w_codebook.py``, ``sub_modules/codebook.py``):
``levels`` (3) rounds of residual quantisation; in each, the C-dim cell feature is
split into ``segments`` (seg_num 2) parts of C / segments dims, each replaced by
the nearest of ``codes`` (dict_size 16) entries of that level's segment codebook.
So a message is levels x segments indices per cell: payload (levels * segments,
H, W), sent as uint8 (codes <= 256, else uint16): 6 bytes per cell at the
reference sizes. Per level ``i``::

    sender    z = E_i(x_i); h = Q_i(z); per segment s: code = argmin_k |h_s - c_isk|^2
              q_i = the chosen entries (concatenated); x_{i+1} = L_i(z) - q_i (not after the last level)
    receiver  from the last level down: y = D_i(q_i) (+ S_i(y_{i+1}) below the last); y_i = R_i(y)

E, Q, L, D, S, R are per-cell C x C linear maps; the feature is y_0. Training
samples the code with a hard Gumbel-softmax over logits -|h_s - c|^2 / sqrt(codes)
x a learned per-segment temperature (straight-through: the one-hot in the
forward pass, the softmax gradient backward), so gradients reach the codebook
and the sender's maps; in memory the message is that one-hot (levels *
segments, codes, H, W). Evaluation takes the nearest entry and the wire carries
the integer indices. Loss: the detection loss plus the reference's codebook
loss, the MSE between the rebuilt and the sender's own feature
(``reconstruction_weight`` 1; no separate commitment term, as in the reference).

Onboarding ``codefilling``: the reference trains ONE quantiser shared by every
sender (its fusion net and heads too; this benchmark keeps the alliance
frozen). No stage-1 run holds a codebook, so the shared quantiser
``link.quantizer`` (sender maps, codebooks, temperatures, receiver maps) is what
trains in stage 2, for every new type alike; each onboarding retrains it, so a
type joining later changes what earlier types' codes mean. Reference schedule:
5 epochs, Adam lr 1e-3 (its milestones at 10 and 15 never fire).
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.links import LINKS, Arrival
from ..models.warp import warp_to_ego
from .base import ONBOARDING, OnboardingMethod, count_unique_parameters, feature_macs

log = logging.getLogger(__name__)
_EPS = 1e-6  # lower bound of the temperatures


def _linears(n: int, channels: int) -> nn.ModuleList:
    return nn.ModuleList([nn.Linear(channels, channels) for _ in range(n)])


class ResidualCodebookQuantizer(nn.Module):
    """See the module docstring. Maps act per cell on (N, C) rows; C % segments == 0."""

    def __init__(self, channels: int, segments: int = 2, codes: int = 16, levels: int = 3):
        super().__init__()
        if segments < 1 or levels < 1 or codes < 2 or channels % segments:
            raise ValueError(f"codebook: need segments >= 1 dividing channels {channels}, levels >= 1, codes >= 2; "
                             f"got segments {segments}, levels {levels}, codes {codes}")
        self.channels, self.segments, self.codes, self.levels = channels, segments, codes, levels
        d = channels // segments
        self.latent, self.to_code, self.residual = _linears(levels, channels), _linears(levels, channels), \
            _linears(levels - 1, channels)
        self.from_code, self.side, self.restore = _linears(levels, channels), _linears(levels - 1, channels), \
            _linears(levels, channels)
        # the reference's small init: N(0, 2 / (5 d))
        self.codebook = nn.Parameter(torch.randn(levels, segments, codes, d) * math.sqrt(2.0 / (5.0 * d)))
        self.temperature = nn.Parameter(torch.ones(levels, segments))

    @property
    def planes(self) -> int:
        """Index planes of a message: levels x segments."""
        return self.levels * self.segments

    def _select(self, h: Tensor, level: int, sample: bool) -> Tensor:
        """(N, C) -> one-hot code choice (N, S, K): nearest entry, or a hard Gumbel sample (training)."""
        book = self.codebook[level]                                         # (S, K, d)
        hs = h.reshape(len(h), self.segments, -1)                           # (N, S, d)
        inner = torch.einsum("nsd,skd->snk", hs, book).permute(1, 0, 2)     # (N, S, K)
        dist = hs.square().sum(-1, keepdim=True) + book.square().sum(-1)[None] - 2 * inner
        if not sample:
            return F.one_hot(dist.argmin(-1), self.codes).to(h.dtype)
        logits = -dist / math.sqrt(self.codes) * self.temperature[level].clamp_min(_EPS)[None, :, None]
        return F.gumbel_softmax(logits, tau=1.0, hard=True)

    def _lookup(self, onehot: Tensor, level: int) -> Tensor:
        """(N, S, K) -> (N, C) the chosen entries, concatenated."""
        return torch.einsum("snk,skd->snd", onehot.permute(1, 0, 2), self.codebook[level]) \
            .permute(1, 0, 2).reshape(len(onehot), -1)

    def quantize(self, x: Tensor, sample: bool) -> Tensor:
        """Sender side: (n, C, H, W) -> one-hot choices (n, levels * segments, codes, H, W)."""
        n, C, H, W = x.shape
        rows = x.permute(0, 2, 3, 1).reshape(-1, C)
        picks = []
        for i in range(self.levels):
            z = self.latent[i](rows)
            onehot = self._select(self.to_code[i](z), i, sample)
            picks.append(onehot)
            if i < self.levels - 1:
                rows = self.residual[i](z) - self._lookup(onehot, i)
        out = torch.cat(picks, 1)                                           # (N, L*S, K)
        return out.reshape(n, H, W, self.planes, self.codes).permute(0, 3, 4, 1, 2)

    def dequantize(self, onehot: Tensor) -> Tensor:
        """Receiver side: one-hot choices (n, levels * segments, codes, H, W) -> (n, C, H, W)."""
        n, _, K, H, W = onehot.shape
        sel = onehot.permute(0, 3, 4, 1, 2).reshape(-1, self.levels, self.segments, K)
        y = None
        for i in reversed(range(self.levels)):
            q = self.from_code[i](self._lookup(sel[:, i], i))
            y = self.restore[i](q if y is None else q + self.side[i](y))
        return y.reshape(n, H, W, self.channels).permute(0, 3, 1, 2)

    def forward(self, x: Tensor) -> Tensor:
        """One message's round trip (sender then receiver, nearest entries): (n, C, H, W) -> same."""
        return self.dequantize(self.quantize(x, sample=False))


@LINKS.register("codefilling")
class CodeFillingLink(nn.Module):
    """See the module docstring.

    channels / agent_types / lidar_range: derived by the detector.
    segments / codes / levels: the quantiser's sizes (reference: 2, 16, 3).
    reconstruction_weight: weight of the MSE between the rebuilt feature and the sender's own.
    The wire dtype follows from ``codes``: uint8 up to 256 entries, else uint16.
    """

    kind = "codes"

    def __init__(self, channels: int, agent_types: List[str], lidar_range, segments: int = 2, codes: int = 16,
                 levels: int = 3, reconstruction_weight: float = 1.0):
        super().__init__()
        if not 2 <= codes <= 1 << 16:
            raise ValueError(f"model.link.codes must be in [2, 65536] to travel as uint8 / uint16, got {codes}")
        if reconstruction_weight < 0:
            raise ValueError(f"model.link.reconstruction_weight must be >= 0, got {reconstruction_weight}")
        self.lidar_range = list(lidar_range)
        self.quantizer = ResidualCodebookQuantizer(channels, segments, codes, levels)
        self.payload_channels = self.quantizer.planes
        self.wire_dtype = "uint8" if codes <= 256 else "uint16"
        self.reconstruction_weight = float(reconstruction_weight)

    def send(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """Sender side: (n, C, H, W) -> integer codes (n, levels * segments, H, W) in evaluation;
        in training the straight-through one-hot (n, levels * segments, codes, H, W) of sampled codes."""
        onehot = self.quantizer.quantize(features, sample=self.training)
        return onehot if self.training else onehot.argmax(2)

    def receive(self, payload: Tensor, arrival: Arrival) -> Tensor:
        """Receiver side: rebuild each feature from its codes with the codebook (sender frame), warp it
        into the ego frame, zero outside ``valid``. Integer codes outside the codebook (a corrupt or
        foreign sender) leave their cell empty."""
        if payload.dtype.is_floating_point:
            onehot = payload
        else:
            bad = (payload < 0) | (payload >= self.quantizer.codes)
            if bool(bad.any()):
                log.warning("codefilling: %d code(s) outside the %d-entry codebook; those cells are left empty",
                            int(bad.sum()), self.quantizer.codes)
            onehot = F.one_hot(payload.long().clamp(0, self.quantizer.codes - 1), self.quantizer.codes)
            onehot = (onehot * (~bad)[..., None]).permute(0, 1, 4, 2, 3).to(arrival.receiver_features.dtype)
        rebuilt = self.quantizer.dequantize(onehot)
        if not payload.dtype.is_floating_point:
            rebuilt = rebuilt * (~bad).all(1, keepdim=True)
        return warp_to_ego(rebuilt, arrival.T_ego_from_sender, self.lidar_range) * arrival.valid

    def losses(self, received: Tensor, sender_features: Tensor, arrival: Arrival) -> Dict[str, Tensor]:
        """The codebook loss: MSE between each rebuilt feature and the sender's own, both in the
        ego frame, over the cells the sender covers."""
        if self.reconstruction_weight <= 0 or not len(received):
            return {}
        valid = arrival.valid
        target = warp_to_ego(sender_features.detach(), arrival.T_ego_from_sender, self.lidar_range)
        err = ((received - target) ** 2 * valid).sum() / (valid.sum() * received.shape[1]).clamp_min(1.0)
        return {"codebook": self.reconstruction_weight * err}


@ONBOARDING.register("codefilling")
class CodeFillingOnboarding(OnboardingMethod):
    name = "codefilling"
    description = "the shared codebook quantiser trains; messages are codebook indices (CodeFilling)"
    train_defaults = {"lr": 1e-3, "epochs": 5, "lr_scheduler": None}

    def link(self, ego_link: Optional[dict], ego_type: str, new_types: List[str]) -> Optional[dict]:
        return {"type": "codefilling"}

    def trainable(self, t: str) -> List[str]:
        return ["link.quantizer"]

    def check_stage1(self, model: dict, run: Path) -> None:
        if (model.get("link") or {}).get("type") == "codefilling":
            raise ValueError(f"{run}: a CodeFilling onboarding run, not a stage-1 run")

    def cost(self, model, t: str, batch=None) -> Tuple[int, float]:
        """Parameters of the shared quantiser; GFLOPs of one message through it on the model's grid
        (sender's maps and code search, receiver's look-ups and maps). ``batch`` is not needed."""
        q = model.link.quantizer
        H, W = model.grid.shape
        x = torch.zeros(1, model.channels, H, W, device=q.codebook.device)
        return count_unique_parameters([q]), 2 * feature_macs(q, (x,)) / 1e9
