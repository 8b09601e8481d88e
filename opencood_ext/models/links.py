"""Communication links of intermediate fusion: what a collaborator's BEV feature
becomes on the wire, and how the receiving ego turns it into a feature of its own.

A link has two halves, run on different machines in reality:

* ``send(features, agent_types)``: the SENDER's side. (n, C, H, W) BEV
  features, each in its own agent frame -> (n, m, H, W) payloads, same frames.
* ``receive(payload, T_ego_from_sender, ego_feature, receiver_types, valid)``:
  the RECEIVER's side. Payloads as they arrived (still in the senders'
  frames), their poses seen from the receiver (computed from each message's
  header and the receiver's own pose), the receiver's own feature (n, C, H, W,
  ego frame) and type for each, and ``valid`` (n, 1, H, W) the ego cells each
  sender covers -> (n, C, H, W) features in the ego frame, ready for fusion.
* ``losses(received, sender_features, T_ego_from_sender, valid)``: auxiliary
  training losses (the sender's real feature is at hand in training only). A
  link whose class sets ``losses_take_context = True`` also gets, as keyword
  arguments, ``sender_types`` (n,) from the message headers,
  ``receiver_features`` (n, C, H, W) each receiver's own feature (ego frame) and
  ``receiver_types`` (n,): what a link needs to align the two sides' feature
  spaces (STAMP, :mod:`opencood_ext.methods.stamp`).

``payload_channels`` and ``wire_dtype`` say what crosses the network.
:data:`LINKS` is the registry the ``model.link.type`` config key names;
:class:`FullFeatureLink` lives here, methods register their own (``gencomm``
registers GenComm's when imported; the heterogeneous baselines register in
:mod:`opencood_ext.methods`).
"""
from __future__ import annotations

from typing import Dict, List, Literal

from torch import Tensor, nn

from ..registry import Registry
from .warp import warp_to_ego

LINKS = Registry("link", "intermediate-fusion links: what a collaborator sends, how the ego receives it "
                 "(config key model.link.type); GenComm's registers when the gencomm package is imported")

WireDtype = Literal["float32", "float16", "int8"]


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

    def receive(self, payload: Tensor, T_ego_from_sender: Tensor, ego_feature: Tensor,
                receiver_types: List[str], valid: Tensor) -> Tensor:
        return warp_to_ego(payload, T_ego_from_sender, self.lidar_range)

    def losses(self, received: Tensor, sender_features: Tensor, T_ego_from_sender: Tensor,
               valid: Tensor) -> Dict[str, Tensor]:
        return {}
