"""GenComm's link: each sender type's Deformable Message Extractor makes a
``message_channels``-channel spatial message; the receiver warps it to its
frame, generates a feature in its own semantic space with its Spatial-Aware
Feature Generator, and refines it with its Channel Enhancer.

The sender / receiver interface is :mod:`opencood_ext.models.links`'s; the
fusion method (:mod:`opencood_ext.models.fusion_methods`) moves the messages
between them, over the wire at inference.
"""
from __future__ import annotations

from typing import Dict, List, Literal, Optional

import torch
from torch import Tensor, nn

from opencood_ext.models.links import LINKS, Arrival
from opencood_ext.models.warp import warp_to_ego

from .enhancer import ChannelEnhancer
from .generator import SpatialAwareFeatureGenerator, generation_loss
from .message import DeformableMessageExtractor


@LINKS.register("gencomm")
class GenCommLink(nn.Module):
    """GenComm's sender/receiver modules for every agent type of the alliance.

    agent_types: names of the types; each gets a DME (sender) and, as a
        receiver, an SAFG and a Channel Enhancer.
    message: DeformableMessageExtractor arguments (``in_channels`` is derived).
    generator: SpatialAwareFeatureGenerator arguments (channels derived).
    enhancer: ChannelEnhancer arguments (channels derived).
    warp_before_generation: True follows the paper (warp the message to the
        receiver frame, then generate, so the result is spatially consistent);
        False runs the reference order (generate in the sender frame from the
        receiver's unwarped feature, then warp the generated feature).
    generation_weight: weight of the MSE between the generated feature and the
        collaborator's real feature warped to the ego (stage 1; 0 in stage 2,
        where sender and receiver live in different semantic spaces).
    wire_dtype: payload dtype on the wire in evaluation: float32, float16, int8.
    """

    kind = "bev"

    def __init__(self, channels: int, agent_types: List[str], lidar_range,
                 message: Optional[dict] = None, generator: Optional[dict] = None,
                 enhancer: Optional[dict] = None, warp_before_generation: bool = True,
                 generation_weight: float = 1.0,
                 wire_dtype: Literal["float32", "float16", "int8"] = "float16"):
        super().__init__()
        message, generator, enhancer = dict(message or {}), dict(generator or {}), dict(enhancer or {})
        self.lidar_range = list(lidar_range)
        self.dme = nn.ModuleDict({t: DeformableMessageExtractor(in_channels=channels, **message)
                                  for t in agent_types})
        msg_ch = next(iter(self.dme.values())).out_channels
        self.safg = nn.ModuleDict({t: SpatialAwareFeatureGenerator(feature_channels=channels,
                                                                   message_channels=msg_ch, **generator)
                                   for t in agent_types})
        self.enhancer = nn.ModuleDict({t: ChannelEnhancer(channels=channels, **enhancer) for t in agent_types})
        self.payload_channels = msg_ch
        self.warp_before_generation = warp_before_generation
        self.generation_weight = float(generation_weight)
        self.wire_dtype = wire_dtype

    def send(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """Sender side: (n, C, H, W) features -> (n, m, H, W) messages, each by its type's DME."""
        types = list(dict.fromkeys(agent_types))
        for t in types:
            if t not in self.dme:
                raise KeyError(f"agent type {t} has no message extractor; known: {sorted(self.dme)}")
        if len(types) == 1:  # one type (every stage 1): no gather and scatter copies of the maps
            return self.dme[types[0]](features).to(features.dtype)
        out = features.new_zeros(features.shape[0], self.payload_channels, *features.shape[-2:])
        for t in types:
            idx = torch.as_tensor([i for i, a in enumerate(agent_types) if a == t], device=features.device)
            out[idx] = self.dme[t](features[idx]).to(out.dtype)  # autocast: the DME may compute in bf16
        return out

    def _generate(self, cond: Tensor, init: Tensor, receiver_types: List[str]) -> Tensor:
        """Row k: the receiver type's SAFG from message ``cond[k]`` and init ``init[k]``, then its
        enhancer. (n, m, H, W), (n, C, H, W) -> (n, C, H, W)."""
        types = list(dict.fromkeys(receiver_types))
        for r in types:
            if r not in self.safg:
                raise KeyError(f"receiver type {r} has no feature generator; known: {sorted(self.safg)}")
        if len(types) == 1:  # one receiver type (batch of one ego type): no gather and scatter copies
            return self.enhancer[types[0]](self.safg[types[0]](cond, init).feature).to(init.dtype)
        gen = init.new_zeros(init.shape)
        for r in types:
            sel = torch.as_tensor([k for k, t in enumerate(receiver_types) if t == r], device=init.device)
            gen[sel] = self.enhancer[r](self.safg[r](cond[sel], init[sel]).feature).to(gen.dtype)
        return gen

    def receive(self, payload: Tensor, arrival: Arrival) -> Tensor:
        """Receiver side, batched over messages (:mod:`opencood_ext.models.links`): warp each
        message into the receiver's frame, generate a feature in the receiver's own space from
        it and the receiver's own feature, enhance; zero outside the cells the sender covers.
        Protocol ``reference`` (needs ``warp_before_generation: false``): generate from the
        unwarped message, enhance, warp, and mask nothing, as the reference GenComm does."""
        reference = arrival.protocol == "reference"
        if reference and self.warp_before_generation:
            raise ValueError("model.link.warp_before_generation: protocol reference generates in the sender's "
                             "frame and warps afterwards, as the reference GenComm does; set it false")
        T_ego_from_sender = arrival.T_ego_from_sender
        cond = warp_to_ego(payload, T_ego_from_sender, self.lidar_range) if self.warp_before_generation \
            else payload
        gen = self._generate(cond, arrival.receiver_features, arrival.receiver_types)
        if not self.warp_before_generation:
            gen = warp_to_ego(gen, T_ego_from_sender, self.lidar_range)
        return gen if reference else gen * arrival.valid

    def own(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """Protocol ``reference``: the receiver's own (n, C, H, W) features, ego frame, replaced as the
        reference GenComm replaces the ego's: its type's DME message of the feature, generated
        into a feature from that message and the feature itself, enhanced."""
        return self._generate(self.send(features, agent_types), features, agent_types)

    def losses(self, received: Tensor, sender_features: Tensor, arrival: Arrival) -> Dict[str, Tensor]:
        """Stage 1: MSE between each generated feature and the sender's real one warped to the ego."""
        if self.generation_weight <= 0 or not len(received):
            return {}
        target = warp_to_ego(sender_features.detach(), arrival.T_ego_from_sender, self.lidar_range)
        return {"generation": self.generation_weight * generation_loss(received, target, arrival.valid)}
