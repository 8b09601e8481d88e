"""MPDA (Xu et al., ICRA 2023) as a heterogeneous baseline: every collaborator sends its
FULL feature; the receiver aligns a feature from a new agent type to its own
before fusion, with a learnable feature resizer and a cross-domain transformer
(:mod:`.mpda_modules`), trained with the detection loss plus an adversarial
domain loss.

Link ``mpda`` (config ``model.link``): sender = identity (kind "bev", C channels,
``wire_dtype``); receiver = warp the collaborator's feature into the ego frame,
then, for a sender of an ``adapted_types`` type ``t``, ``adapter.<t>``: resizer
(the collaborator's feature alone) and cross-domain attention (queries from it,
keys / values from the receiver's own feature), zero outside the cells the
sender covers. Messages from the alliance's own types pass through unchanged.

Domain loss (the reference's ``point_pillar_mpda_loss`` with ``da: True``): a
per-cell classifier behind a gradient reversal layer (x -9.1) tells the
receiver's own feature (label 1) from the adapted collaborator feature
(label 0); binary cross entropy with logits over the cells the sender covers,
weighted by ``domain_weight``. The classifier learns to tell them apart; the
reversed gradient teaches the resizer and attention to make them alike. One
classifier per adapted type (``adapter.<t>.domain``), so what trains for a new
type is its own. The reference adds this term twice to its total (effective
weight 2); ``domain_weight`` 1 here.

Onboarding ``mpda`` (stage 2): the ego alliance (its encoder, fusion,
post-fusion layers and head) and every new type's encoder stay frozen; only
``link.adapter.<t>`` trains for new type ``t`` (resizer + cross-domain
attention + domain classifier). The reference also trains its fusion net and
heads in stage 2 (only encoders, backbones and shrinkers are frozen there);
onboarding ``mpda`` keeps the alliance frozen as every method here does;
onboarding ``mpda_fusion_head`` is the reference's trainable set (adapters plus
the ego's fusion, post-fusion layers and head), so the alliance's own detections
change too. Reference schedule:
10 epochs, Adam lr 1e-3, x0.1 after epoch 5 (weight decay 1e-4).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.links import LINKS, Arrival, WireDtype
from ..models.warp import warp_to_ego
from .base import ONBOARDING, OnboardingMethod, count_unique_parameters, feature_macs, feature_map_cost
from .mpda_modules import CrossDomainEncoder, DomainClassifier, FeatureResizer


class MPDAAdapter(nn.Module):
    """The receiver's alignment of one sender type's feature: (cav, ego) (n, C, H, W) ego frame
    -> (n, C, H, W). ``domain`` is used by the training loss only."""

    def __init__(self, channels: int, resizer: Optional[dict] = None, attention: Optional[dict] = None,
                 domain: Optional[dict] = None):
        super().__init__()
        self.resizer = FeatureResizer(channels, channels, **dict(resizer or {}))
        self.cross = CrossDomainEncoder(channels, **dict(attention or {}))
        self.domain = DomainClassifier(channels, **dict(domain or {}))

    def forward(self, cav: Tensor, ego: Tensor) -> Tensor:
        return self.cross(self.resizer(cav, ego.shape[-2:]), ego)


@LINKS.register("mpda")
class MPDALink(nn.Module):
    """See the module docstring.

    channels / agent_types / lidar_range: derived by the detector.
    adapted_types: sender types the receiver aligns (the new types); each gets an adapter.
    resizer: FeatureResizer arguments (mlp_dim, dim_head, window, dropout, depth, residual_blocks).
    attention: CrossDomainEncoder arguments (heads, dim_head, window, depth).
    domain: DomainClassifier arguments (hidden, reverse_scale).
    domain_weight: weight of the adversarial domain loss (0 = off).
    wire_dtype: payload dtype on the wire (the full feature).
    """

    kind = "bev"
    def __init__(self, channels: int, agent_types: List[str], lidar_range, adapted_types: Sequence[str] = (),
                 resizer: Optional[dict] = None, attention: Optional[dict] = None, domain: Optional[dict] = None,
                 domain_weight: float = 1.0, wire_dtype: WireDtype = "float32"):
        super().__init__()
        unknown = sorted(set(adapted_types) - set(agent_types))
        if unknown:
            raise ValueError(f"model.link.adapted_types: {unknown} are not agent types of the model {agent_types}")
        if domain_weight < 0:
            raise ValueError(f"model.link.domain_weight must be >= 0, got {domain_weight}")
        self.lidar_range = list(lidar_range)
        self.payload_channels = int(channels)
        self.wire_dtype = wire_dtype
        self.domain_weight = float(domain_weight)
        self.adapter = nn.ModuleDict({t: MPDAAdapter(channels, resizer, attention, domain)
                                      for t in dict.fromkeys(adapted_types)})

    def send(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """Sender side: the message is the feature itself."""
        return features

    def receive(self, payload: Tensor, arrival: Arrival) -> Tensor:
        """Receiver side (:mod:`opencood_ext.models.links`): warp, then align each message from an
        adapted type (its header's sender type) with that type's adapter and the receiver's own
        feature; zero outside the cells the sender covers."""
        types = list(arrival.sender_types)
        out = warp_to_ego(payload, arrival.T_ego_from_sender, self.lidar_range)
        for t in (t for t in dict.fromkeys(types) if t in self.adapter):
            sel = torch.as_tensor([k for k, s in enumerate(types) if s == t], device=payload.device)
            out = out.index_copy(0, sel, self.adapter[t](out[sel], arrival.receiver_features[sel]))
        return out * arrival.valid

    @staticmethod
    def _domain_term(classifier: nn.Module, ego: Tensor, adapted: Tensor, valid: Tensor) -> Tensor:
        """BCE of the per-cell classifier telling the receiver's own feature (1) from the adapted one
        (0), over the cells the sender covers (where ``adapted`` is what ``receive`` returned)."""
        logits = classifier(torch.cat([ego, adapted]))
        target = torch.cat([torch.ones_like(valid), torch.zeros_like(valid)])
        weight = torch.cat([valid, valid])
        loss = F.binary_cross_entropy_with_logits(logits, target, weight=weight, reduction="sum")
        return loss / weight.sum().clamp_min(1.0)

    def losses(self, received: Tensor, sender_features: Tensor, arrival: Arrival) -> Dict[str, Tensor]:
        """The adversarial domain loss on the adapted messages of a training step (none when no
        message came from an adapted type)."""
        if self.domain_weight <= 0:
            return {}
        types = list(arrival.sender_types)
        terms = []
        for t in (t for t in dict.fromkeys(types) if t in self.adapter):
            sel = torch.as_tensor([k for k, s in enumerate(types) if s == t], device=received.device)
            terms.append(self._domain_term(self.adapter[t].domain, arrival.receiver_features[sel], received[sel],
                                           arrival.valid[sel]))
        return {"domain": torch.stack(terms).mean() * self.domain_weight} if terms else {}


@ONBOARDING.register("mpda")
class MPDAOnboarding(OnboardingMethod):
    name = "mpda"
    description = "the receiver's feature resizer + cross-domain attention for the new type train (MPDA)"
    train_defaults = {"lr": 1e-3, "epochs": 10, "lr_scheduler": "multistep", "milestones": [5], "gamma": 0.1}

    def link(self, ego_link: Optional[dict], ego_type: str, new_types: List[str]) -> Optional[dict]:
        return {"type": "mpda", "adapted_types": list(new_types)}

    def trainable(self, t: str) -> List[str]:
        return [f"link.adapter.{t}"]

    def check_stage1(self, model: dict, run: Path) -> None:
        link = (model.get("link") or {}).get("type", "full_feature")
        if link == "mpda":
            raise ValueError(f"{run}: an MPDA onboarding run, not a stage-1 run")

    def cost(self, model, t: str, batch=None) -> Tuple[int, float]:
        """Parameters of ``link.adapter.<t>``; GFLOPs of one message through it on the model's grid
        (resizer + cross-domain attention; attention matmuls included) plus, as it trains too, the
        domain classifier on the receiver's and the adapted feature. ``batch`` is not needed."""
        adapter = model.link.adapter[t]
        H, W = model.grid.shape
        x = torch.zeros(1, model.channels, H, W, device=next(adapter.parameters()).device)
        macs = feature_macs(adapter, (x, x)) + feature_macs(adapter.domain, (torch.cat([x, x]),))
        return count_unique_parameters([adapter]), 2 * macs / 1e9


@ONBOARDING.register("mpda_fusion_head")
class MPDAFusionHeadOnboarding(MPDAOnboarding):
    """MPDA with the reference's trainable set: ``link.adapter.<t>`` and the ego alliance's fusion,
    post-fusion layers and head (the reference freezes only encoders, backbones and shrinkers).
    Those shared parts serve every type, so the alliance's {ego} result changes as well."""
    name = "mpda_fusion_head"
    description = ("MPDA with the reference's trainable set: the new type's adapter and the ego's fusion, "
                   "post-fusion layers and head")
    alliance_parts = ("fuse", "post_fusion", "head")

    def trainable(self, t: str) -> List[str]:
        return [*super().trainable(t), *self.alliance_parts]

    def cost(self, model, t: str, batch=None) -> Tuple[int, float]:
        """MPDA's adapter cost plus the shared parts': every parameter of the fusion op, post-fusion
        layers and head; the FLOPs of the post-fusion layers and head on one fused map of the model's
        grid (the fusion op's own arithmetic, a per-cell weighting, is left out: it needs the agents)."""
        params, gflops = super().cost(model, t, batch)
        _, shared_gflops = feature_map_cost(model, ["post_fusion", "head"])
        shared_params = count_unique_parameters([getattr(model, p) for p in self.alliance_parts])
        return params + shared_params, gflops + shared_gflops
