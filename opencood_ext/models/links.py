"""Communication links of intermediate fusion: what a collaborator sends and how
the ego turns it into an ego-frame feature for fusion.

A link maps per-agent BEV features (N, C, H, W), each in its OWN agent frame,
to ego-frame features (N, C, H, W) ready for fusion, plus auxiliary losses and
the bytes each agent put on the wire. The ego row of each sample always keeps
the ego's real feature.

:data:`LINKS` is the registry the ``model.link.type`` config key names.
:class:`FullFeatureLink` (the whole feature on the wire) lives here; methods
register their own links (``gencomm`` registers GenComm's on import).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn

from ..comm import Message, MessageError, decode, encode
from ..registry import Registry
from .warp import warp_mask, warp_to_ego

log = logging.getLogger(__name__)

LINKS = Registry("link", "intermediate-fusion links: what a collaborator sends, how the ego receives it "
                 "(config key model.link.type)")


@dataclass
class LinkOutput:
    """features: (N, C, H, W) in each sample's ego frame (ego rows = real ego feature).
    valid: (N, 1, H, W) cells each agent covers. losses: named scalar losses.
    bytes_sent: (N,) bytes each agent sent (0 for egos). dropped: collaborator rows
    whose packet was rejected (their features are zero)."""

    features: Tensor
    valid: Tensor
    losses: Dict[str, Tensor] = field(default_factory=dict)
    bytes_sent: Optional[Tensor] = None
    dropped: List[int] = field(default_factory=list)


def _ego_mask(n: int, ego_index: Tensor, device) -> Tensor:
    mask = torch.zeros(n, dtype=torch.bool, device=device)
    mask[ego_index] = True
    return mask


def _through_wire(payload: Tensor, sender_ids: List[int], agent_types: List[str], rows: List[int],
                  T: Tensor, dtype: str):
    """Encode each row's payload (m, H, W), decode it back; -> (payload, bytes, dropped rows)."""
    out = torch.zeros_like(payload)
    nbytes = torch.zeros(payload.shape[0], dtype=torch.long)
    dropped = []
    for r in rows:
        msg = Message(sender_id=int(sender_ids[r]), agent_type=agent_types[r], timestamp=0.0,
                      pose=T[r].detach().double().cpu().numpy(), payload=payload[r].detach().cpu().numpy())
        packet = encode(msg, dtype=dtype)
        nbytes[r] = len(packet)
        try:
            received = decode(packet)
        except MessageError as exc:
            log.warning("message from agent %s rejected: %s", sender_ids[r], exc)
            dropped.append(r)
            continue
        out[r] = torch.as_tensor(received.payload, dtype=payload.dtype, device=payload.device)
    return out, nbytes, dropped


@LINKS.register("full_feature")
class FullFeatureLink(nn.Module):
    """Send the full feature; the ego warps it into its frame. No parameters."""

    def __init__(self, channels: int, agent_types: List[str], lidar_range, wire_dtype: str = "float32"):
        super().__init__()
        self.lidar_range = list(lidar_range)
        self.wire_dtype = wire_dtype

    def messages(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """The message IS the feature."""
        return features

    def generate(self, messages: Tensor, T_ego_from_sender: Tensor, ego_feature: Tensor,
                 receiver_types: List[str]) -> Tensor:
        """Receiver side: warp the received features (n, C, H, W) into the ego frame."""
        return warp_to_ego(messages, T_ego_from_sender, self.lidar_range)

    def forward(self, features: Tensor, batch) -> LinkOutput:
        n, _, H, W = features.shape
        T = batch.T_ego_from_agent
        ego = _ego_mask(n, batch.ego_index.to(features.device), features.device)
        payload, nbytes, dropped = features, torch.zeros(n, dtype=torch.long), []
        if not self.training:
            rows = [i for i in range(n) if not ego[i]]
            payload, nbytes, dropped = _through_wire(features, batch.agent_ids, batch.agent_types, rows, T,
                                                     self.wire_dtype)
            payload = torch.where(ego[:, None, None, None], features, payload)
        warped = warp_to_ego(payload, T, self.lidar_range)
        valid = warp_mask(T, self.lidar_range, (H, W), device=features.device)
        for r in dropped:
            valid[r] = 0
        return LinkOutput(warped, valid, {}, nbytes, dropped)
