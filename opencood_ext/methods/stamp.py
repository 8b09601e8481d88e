"""STAMP (Gao et al., ICLR 2025) as an onboarding method: a new agent type joins
through a protocol adapter (its feature space -> the protocol space) and a
reverter (protocol -> its space); its encoder and the whole ego alliance stay frozen.

Here the protocol space is the ego alliance's (the protocol owner ``protocol``,
the ego's type, m1): its adapter and reverter are the identity. A sender applies
its own type's adapter and sends the protocol feature (C channels, kind "bev");
a receiver applies its own type's reverter to each message, in the sender's frame
as the reference does (its fusion warps afterwards), then warps it into its frame.

Facts from the reference (jeffreychou777/GenComm: ``heter_model_baseline_w_stamp.py``,
``stamp_modules/adapter.py`` (``AdapterConvNext``), ``loss/adapter_loss.py``,
``hypes_yaml/opv2v/GenComm_yamls/baselines/stage2/STAMP/m0m{2,3,4}_att.yaml``):

* adapter = reverter architecture: 1x1 conv C -> 64, three ConvNeXt blocks of
  width 64 (7x7 depthwise conv, LayerNorm, 64 -> 256 -> 64 MLP with GELU, layer
  scale 1e-6, residual), 1x1 conv 64 -> C (no resize: every type ends on the same
  grid here). 126,016 parameters each, 252,032 for adapter + reverter at C = 128.
  The reference's 547,200 also counts a 3x3 C -> C "smoothing" conv that every
  adapter and reverter builds and never applies (2 x 147,584); it is not built here.
* only the new type's adapter and reverter train (stage ``train_adapter``).
* alignment (``AdapterLoss``, MSE): 10 x M->P (adapter(F_M) vs F_P) + 9 x P->M
  (reverter(F_P) vs F_M) + 1 x M->P->M (reverter(adapter(F_M), adapter output
  detached) vs F_M), F_M the new type's feature and F_P the protocol feature.
* schedule: 5 epochs for m2, m3, m4 (6 for m1 against its m0 protocol), Adam lr
  0.01, weight decay 1e-4, x0.1 after epochs 1, 3 and 4.

Two differences, both forced by this framework's data and named here:

* the loss: the reference's stage-2 configs train with the alignment loss alone;
  STAMP's paper adds decision-space alignment (the task loss through the frozen
  protocol fusion and head). Here the detection loss through the ego alliance's
  frozen fusion and head is always on (the trainer adds it), plus the alignment.
* the pairs: the reference runs the protocol encoder and the new encoder on the
  SAME agent's sensors (every OPV2V agent carries all of them, and its STAMP
  dataset feeds both stacks). A cooperative sample here gives each agent one
  type, so F_P is the protocol owner's own feature of the same ground, moved by
  the message pose into the new type's frame and compared on the cells both
  maps cover: M->P and P->M are measured between two viewpoints of one scene,
  M->P->M on the new type's whole map as in the reference.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Literal, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..models.links import LINKS, Arrival
from ..models.warp import warp_mask, warp_to_ego
from .base import ONBOARDING, OnboardingMethod, feature_map_cost, require_trained

#: the reference baseline's adapter / reverter size (``submodule_args``: dim 64, num_of_blocks 3)
REFERENCE_SIZE = {"hidden_channels": 64, "blocks": 3, "kernel_size": 7}


class ConvNeXtBlock(nn.Module):
    """(n, dim, H, W) -> same: x + gamma * MLP(LayerNorm(depthwise_conv(x))), the MLP
    dim -> 4 dim -> dim with GELU over channels at each cell; gamma starts at ``layer_scale``."""

    def __init__(self, dim: int, kernel_size: int = 7, layer_scale: float = 1e-6):
        super().__init__()
        self.depthwise = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.expand = nn.Linear(dim, 4 * dim)
        self.project = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), float(layer_scale)))

    def forward(self, x: Tensor) -> Tensor:
        y = self.depthwise(x).permute(0, 2, 3, 1)  # channels last for LayerNorm / Linear
        y = self.gamma * self.project(F.gelu(self.expand(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class DomainAdapter(nn.Module):
    """One feature space to another on the same grid, (n, C, H, W) -> (n, C, H, W):
    1x1 conv C -> hidden, ``blocks`` ConvNeXt blocks, 1x1 conv hidden -> C. STAMP's
    adapter (type -> protocol) and reverter (protocol -> type) are both one."""

    def __init__(self, channels: int, hidden_channels: int = 64, blocks: int = 3, kernel_size: int = 7):
        super().__init__()
        if min(channels, hidden_channels, blocks, kernel_size) < 1 or kernel_size % 2 == 0:
            raise ValueError(f"STAMP adapter: channels {channels}, hidden_channels {hidden_channels} and blocks "
                             f"{blocks} must be >= 1 and kernel_size {kernel_size} odd")
        self.reduce = nn.Conv2d(channels, hidden_channels, 1)
        self.blocks = nn.Sequential(*[ConvNeXtBlock(hidden_channels, kernel_size) for _ in range(blocks)])
        self.restore = nn.Conv2d(hidden_channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.restore(self.blocks(self.reduce(x)))


def _mse(pred: Tensor, target: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Mean squared error over all elements, or over the cells where ``mask`` (n, 1, H, W) is 1."""
    if mask is None:
        return F.mse_loss(pred, target)
    weight = mask.expand_as(pred)
    return ((pred - target) ** 2 * weight).sum() / weight.sum().clamp(min=1.0)


@LINKS.register("stamp")
class StampLink(nn.Module):
    """STAMP's adapters and reverters for every agent type but the protocol owner.

    channels: C of every type's feature (derived). agent_types, lidar_range: derived.
    protocol: the agent type whose feature space is the protocol (the ego's; identity for it).
    hidden_channels / blocks / kernel_size: adapter and reverter size (reference: 64 / 3 / 7).
    m2p_weight / p2m_weight / cycle_weight: weights of the three alignment MSEs (reference
        alpha_M2P 10, alpha_P2M 9, alpha_M2P2M 1); 0 switches a term off.
    wire_dtype: payload dtype on the wire (the protocol feature is C channels).
    """

    kind = "bev"
    def __init__(self, channels: int, agent_types: List[str], lidar_range, protocol: str,
                 hidden_channels: int = 64, blocks: int = 3, kernel_size: int = 7,
                 m2p_weight: float = 10.0, p2m_weight: float = 9.0, cycle_weight: float = 1.0,
                 wire_dtype: Literal["float32", "float16", "int8"] = "float32"):
        super().__init__()
        if protocol not in agent_types:
            raise ValueError(f"model.link.protocol {protocol!r} must be one of the agent types {list(agent_types)}")
        weights = {"m2p_weight": m2p_weight, "p2m_weight": p2m_weight, "cycle_weight": cycle_weight}
        bad = {k: v for k, v in weights.items() if not float(v) >= 0}
        if bad:
            raise ValueError(f"model.link: alignment weights must be >= 0, got {bad}")
        self.lidar_range = list(lidar_range)
        self.protocol = protocol
        size = dict(hidden_channels=hidden_channels, blocks=blocks, kernel_size=kernel_size)
        self.adapter = nn.ModuleDict({t: DomainAdapter(channels, **size) for t in agent_types if t != protocol})
        self.reverter = nn.ModuleDict({t: DomainAdapter(channels, **size) for t in agent_types if t != protocol})
        self.weights = {k: float(v) for k, v in weights.items()}
        self.payload_channels = int(channels)
        self.wire_dtype = wire_dtype

    def _per_type(self, modules: nn.ModuleDict, x: Tensor, types: List[str]) -> Tensor:
        """Row i of ``x`` through ``modules[types[i]]`` (the protocol owner's rows unchanged)."""
        out = x
        for t in dict.fromkeys(types):
            if t == self.protocol:
                continue
            if t not in modules:
                raise KeyError(f"agent type {t} has no STAMP adapter / reverter; known: {sorted(modules)} "
                               f"and the protocol owner {self.protocol}")
            idx = torch.as_tensor([i for i, a in enumerate(types) if a == t], device=x.device)
            out = out.index_copy(0, idx, modules[t](x[idx]))
        return out

    def send(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """Sender side: (n, C, H, W) features, own frames -> the protocol features, same frames."""
        return self._per_type(self.adapter, features, agent_types)

    def receive(self, payload: Tensor, arrival: Arrival) -> Tensor:
        """Receiver side: each protocol feature through the receiver's own reverter (in the sender's
        frame), then warped into the receiver's frame; cells the sender does not cover read zero."""
        return warp_to_ego(self._per_type(self.reverter, payload, arrival.receiver_types),
                           arrival.T_ego_from_sender, self.lidar_range)

    def losses(self, received: Tensor, sender_features: Tensor, arrival: Arrival) -> Dict[str, Tensor]:
        """STAMP's alignment (module docstring) on the messages of a training step: the cycle term on
        every new-type sender's map; M->P and P->M on every message between the protocol owner and a
        new type (either direction), in the new type's frame, on the cells both maps cover."""
        sender_types, receiver_types = arrival.sender_types, arrival.receiver_types
        receiver_features, T_ego_from_sender = arrival.receiver_features, arrival.T_ego_from_sender
        out: Dict[str, Tensor] = {}
        p = self.protocol
        senders = [k for k, s in enumerate(sender_types) if s != p]
        if senders and self.weights["cycle_weight"] > 0:
            types = [sender_types[k] for k in senders]
            own = sender_features[senders].detach()
            with torch.no_grad():
                protocol_view = self._per_type(self.adapter, own, types)
            out["align_m2p2m"] = self.weights["cycle_weight"] * _mse(
                self._per_type(self.reverter, protocol_view, types), own)
        pairs = [k for k in range(len(sender_types)) if (sender_types[k] == p) != (receiver_types[k] == p)]
        if not pairs or self.weights["m2p_weight"] + self.weights["p2m_weight"] == 0:
            return out
        new_feats, proto_feats, to_new, types = [], [], [], []
        for k in pairs:
            if receiver_types[k] == p:  # a new type sent to the protocol owner: compare in the sender's frame
                new_feats.append(sender_features[k])
                proto_feats.append(receiver_features[k])
                to_new.append(torch.linalg.inv(T_ego_from_sender[k].double()))
                types.append(sender_types[k])
            else:  # the protocol owner sent to a new type: compare in the receiver's frame
                new_feats.append(receiver_features[k])
                proto_feats.append(sender_features[k])
                to_new.append(T_ego_from_sender[k].double())
                types.append(receiver_types[k])
        T = torch.stack(to_new)
        f_new = torch.stack(new_feats).detach()
        f_proto = warp_to_ego(torch.stack(proto_feats).detach(), T, self.lidar_range)
        both = warp_mask(T, self.lidar_range, tuple(f_new.shape[-2:]), device=f_new.device, dtype=f_new.dtype)
        if self.weights["m2p_weight"] > 0:
            out["align_m2p"] = self.weights["m2p_weight"] * _mse(
                self._per_type(self.adapter, f_new, types), f_proto, both)
        if self.weights["p2m_weight"] > 0:
            out["align_p2m"] = self.weights["p2m_weight"] * _mse(
                self._per_type(self.reverter, f_proto, types), f_new, both)
        return out


@ONBOARDING.register("stamp")
class StampOnboarding(OnboardingMethod):
    """STAMP: the new type's adapter and reverter train; its encoder stays frozen."""

    name = "stamp"
    description = "only the new type's protocol adapter and reverter train (STAMP); its encoder stays frozen"
    train_defaults = {"epochs": 5, "lr": 0.01, "weight_decay": 1e-4, "lr_scheduler": "multistep",
                      "milestones": [1, 3, 4], "gamma": 0.1}

    def link(self, ego_link: Optional[dict], ego_type: str, new_types: List[str]) -> Optional[dict]:
        """The protocol is the ego alliance's feature space: its owner is the ego's type."""
        return {"type": "stamp", "protocol": ego_type, **REFERENCE_SIZE}

    def trainable(self, t: str) -> List[str]:
        return [f"link.adapter.{t}", f"link.reverter.{t}"]

    def cost(self, model, t: str, batch=None) -> Tuple[int, float]:
        """Adapter (sender side) and reverter (receiver side) each once on a feature map: both
        train, though a frame with an m1 ego runs only the adapter."""
        return feature_map_cost(model, self.trainable(t))

    def check_stage1(self, model: dict, run: Path) -> None:
        """The new type's encoder is used frozen, as trained in stage 1: the run must hold weights."""
        require_trained(run, "STAMP uses its encoder stack frozen")
