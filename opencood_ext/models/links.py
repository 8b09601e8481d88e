"""Communication links of intermediate fusion: what a collaborator's BEV feature
becomes on the wire, and how the receiving ego turns it into a feature of its own.

A link has two halves, run on different machines in reality:

* ``send(features, agent_types)``: the SENDER's side. (n, C, H, W) BEV
  features, each in its own agent frame -> (n, m, H, W) payloads, same frames.
* ``receive(payload, arrival)``: the RECEIVER's side. Payloads as they arrived
  (still in the senders' frames) and an :class:`Arrival`: what the receiver
  knows about each message besides its payload (its pose seen from the
  receiver, from the header and the receiver's own pose; the sender's type from
  the header; the receiver's own feature and type; the cells the sender covers)
  -> (n, C, H, W) features in the ego frame, ready for fusion.
* ``losses(received, sender_features, arrival)``: auxiliary training losses
  (the sender's real feature, in its own frame, is at hand in training only).
* ``own(features, agent_types)`` (optional): under protocol ``reference``, what the receiver
  fuses in place of its own (n, C, H, W) feature, ego frame; a link without it fuses the feature
  as is (HEAL's and OpenCOOD's models; the reference GenComm generates and enhances the ego's too).

``payload_channels`` and ``wire_dtype`` say what crosses the network.
:data:`LINKS` is the registry the ``model.link.type`` config key names;
:class:`FullFeatureLink` lives here, methods register their own (``gencomm``
registers GenComm's when imported; the heterogeneous baselines register in
:mod:`opencood_ext.methods`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Literal, Optional

from torch import Tensor, nn

from ..registry import Registry
from .warp import warp_to_ego

LINKS = Registry("link", "intermediate-fusion links: what a collaborator sends, how the ego receives it "
                 "(config key model.link.type); GenComm's registers when the gencomm package is imported")

WireDtype = Literal["float32", "float16", "int8"]


@dataclass
class Arrival:
    """What a receiver knows about the n messages that arrived, besides their payloads.

    T_ego_from_sender: (n, 4, 4) each message's pose seen from its receiver (header pose and the
        receiver's own pose); sender_types: (n,) from the headers; receiver_features: (n, C, H, W)
        each receiver's own feature, ego frame; receiver_types: (n,); valid: (n, 1, H, W) the ego
        cells each sender covers. protocol: the receiving model's (``native`` or ``reference``:
        follow the reference code's computation, which masks no cells by coverage).
        ego_type_features: training, for a link that asks (``needs_ego_type_features``, GenComm's
        ego-encoder target): (n, C, H, W) each message's SENDER's own scan encoded by its RECEIVER
        type's frozen encoder, in the sender's input frame (:mod:`.ego_type_target`), zero where
        ``has_ego_type_feature`` (n,) bool is False (a sender of the receiver's own type); else None."""

    T_ego_from_sender: Tensor
    sender_types: List[str]
    receiver_features: Tensor
    receiver_types: List[str]
    valid: Tensor
    protocol: Literal["native", "reference"] = "native"
    ego_type_features: Optional[Tensor] = None
    has_ego_type_feature: Optional[Tensor] = None


@LINKS.register("full_feature")
class FullFeatureLink(nn.Module):
    """Send the whole feature; the receiver warps it into its frame. No parameters.

    channels: C of the features (derived). wire_dtype: payload dtype on the wire."""

    kind = "bev"

    def __init__(self, channels: int, agent_types: List[str], lidar_range, wire_dtype: WireDtype = "float32"):
        super().__init__()
        self.lidar_range = list(lidar_range)
        self.payload_channels = int(channels)
        self.wire_dtype = wire_dtype

    def send(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """The message IS the feature."""
        return features

    def receive(self, payload: Tensor, arrival: Arrival) -> Tensor:
        return warp_to_ego(payload, arrival.T_ego_from_sender, self.lidar_range)

    def own(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """The receiver fuses its own feature as is (HEAL's / OpenCOOD's models, every protocol)."""
        return features

    def losses(self, received: Tensor, sender_features: Tensor, arrival: Arrival) -> Dict[str, Tensor]:
        return {}
