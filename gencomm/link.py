"""GenComm's link: each sender type's Deformable Message Extractor makes a
``message_channels``-channel spatial message; the receiver warps it to its
frame, generates a feature in its own semantic space with its Spatial-Aware
Feature Generator, and refines it with its Channel Enhancer.

In evaluation (``not self.training``) every collaborator's payload really goes
through :mod:`opencood_ext.comm` (encode -> bytes -> decode); a rejected packet
drops that collaborator and the receiver carries on.
"""
from __future__ import annotations

from typing import Dict, List, Literal, Optional

import torch
from torch import Tensor, nn

from opencood_ext.models.links import LINKS, LinkOutput, _ego_mask, _through_wire
from opencood_ext.models.warp import warp_mask, warp_to_ego

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
        self.message_channels = msg_ch
        self.warp_before_generation = warp_before_generation
        self.generation_weight = float(generation_weight)
        self.wire_dtype = wire_dtype

    def add_type(self, name: str, channels: int, message: Optional[dict] = None) -> None:
        """Give a NEW agent type a message extractor (stage-2 onboarding)."""
        if name in self.dme:
            raise ValueError(f"agent type {name} already has a message extractor")
        self.dme[name] = DeformableMessageExtractor(in_channels=channels, **dict(message or {}))

    def messages(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """(N, C, H, W) sender features -> (N, m, H, W) messages, each by its type's DME."""
        out = features.new_zeros(features.shape[0], self.message_channels, *features.shape[-2:])
        for t in dict.fromkeys(agent_types):
            if t not in self.dme:
                raise KeyError(f"agent type {t} has no message extractor; known: {sorted(self.dme)}")
            idx = torch.as_tensor([i for i, a in enumerate(agent_types) if a == t], device=features.device)
            out[idx] = self.dme[t](features[idx])
        return out

    def generate(self, messages: Tensor, T_ego_from_sender: Tensor, ego_feature: Tensor,
                 receiver_types: List[str]) -> Tensor:
        """The receiver side, batched over collaborators.

        messages: (n, m, H, W) as sent, each in its sender's frame.
        T_ego_from_sender: (n, 4, 4); ego_feature: (n, C, H, W) the receiving ego's own
        feature (ego frame) for each message; receiver_types: (n,) the ego's type.
        Returns (n, C, H, W) generated, enhanced features in the ego frame.
        """
        n, _, H, W = messages.shape
        gen = ego_feature.new_zeros(n, ego_feature.shape[1], H, W)
        cond = warp_to_ego(messages, T_ego_from_sender, self.lidar_range) if self.warp_before_generation \
            else messages
        for r in dict.fromkeys(receiver_types):
            if r not in self.safg:
                raise KeyError(f"receiver type {r} has no feature generator; known: {sorted(self.safg)}")
            sel = torch.as_tensor([k for k, t in enumerate(receiver_types) if t == r], device=messages.device)
            gen[sel] = self.enhancer[r](self.safg[r](cond[sel], ego_feature[sel]).feature)
        if not self.warp_before_generation:
            gen = warp_to_ego(gen, T_ego_from_sender, self.lidar_range)
        return gen

    def forward(self, features: Tensor, batch) -> LinkOutput:
        n, C, H, W = features.shape
        device = features.device
        T = batch.T_ego_from_agent
        ego_index = batch.ego_index.to(device)
        ego = _ego_mask(n, ego_index, device)
        sample = batch.sample_index.to(device)
        collab = (~ego).nonzero().flatten()
        # only collaborators send: the egos' rows stay zero (and never reach the DMEs' BatchNorm)
        msg = features.new_zeros(n, self.message_channels, H, W)
        if len(collab):
            msg = msg.index_copy(0, collab, self.messages(
                features[collab], [batch.agent_types[int(i)] for i in collab]))
        nbytes, dropped = torch.zeros(n, dtype=torch.long), []
        if not self.training:
            rows = [i for i in range(n) if not ego[i]]
            msg, nbytes, dropped = _through_wire(msg, batch.agent_ids, batch.agent_types, rows, T, self.wire_dtype)
        valid = warp_mask(T, self.lidar_range, (H, W), device=device)
        for r in dropped:
            valid[r] = 0
        # the ego keeps its real feature (warped only when augmentation rotated a camera ego)
        ego_feat_b = warp_to_ego(features[ego_index], T[ego_index], self.lidar_range)  # (B, C, H, W)
        out = features.index_copy(0, ego_index, ego_feat_b)
        losses: Dict[str, Tensor] = {}
        if len(collab):
            receiver_of = [batch.agent_types[int(ego_index[int(sample[i])])] for i in collab]
            ego_feat = ego_feat_b[sample[collab]]  # (n_c, C, H, W) receiver's own feature, ego frame
            gen = self.generate(msg[collab], T[collab], ego_feat, receiver_of) * valid[collab]
            out = out.index_copy(0, collab, gen)
            if self.generation_weight > 0 and self.training:
                target = warp_to_ego(features[collab].detach(), T[collab], self.lidar_range)
                losses["generation"] = self.generation_weight * generation_loss(gen, target, valid[collab])
        return LinkOutput(out, valid, losses, nbytes, dropped)
