"""GenComm's link: each sender type's Deformable Message Extractor makes a
``message_channels``-channel spatial message; the receiver warps it to its
frame, generates a feature in its own semantic space with its Spatial-Aware
Feature Generator, and refines it with its Channel Enhancer.

The sender / receiver interface is :mod:`opencood_ext.models.links`'s; the
fusion method (:mod:`opencood_ext.models.fusion_methods`) moves the messages
between them, over the wire at inference.
"""
from __future__ import annotations

from typing import Dict, List, Literal, Optional, Tuple

import torch
from torch import Tensor, nn

from opencood_ext.models.encoder_stack import center_crop
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
        receiver's unwarped feature, then warp the generated feature); None (the
        default): the protocol's order (:meth:`warps_first`): generate first under
        ``reference`` and ``equalized``, warp first under ``native`` (the order of the
        archived native runs), so one config runs under any protocol.
    generation_weight: weight of the generation loss (:meth:`losses`; the reference's
        ``loss.args.generate_weight``), an MSE between generated and real features
        (stage 1; 0 in stage 2, where sender and receiver live in different semantic spaces).
    generation_target: what a message from a sender of ANOTHER type than its receiver (stage 2: a new
        type's) is trained to make the receiver's generator regenerate. ``none`` (the paper): nothing,
        stage 2 trains on the detection loss alone. ``ego_encoder`` (beyond the paper, training only):
        the sender's own scan encoded by the RECEIVER type's frozen encoder (the data gives every agent
        every sensor: :mod:`opencood_ext.data.ego_type_input`), compared with the received feature as the
        stage-1 generation loss compares it (generated, enhanced, warped; the target warped alike, over
        the cells the sender covers), times ``generation_target_weight``; loss part
        ``generation_ego_encoder``. Refused under protocol reference. Messages of the receiver's own
        type get no such term. At evaluation nothing changes: the message stays the DME's.
    generation_target_weight: that term's weight.
    wire_dtype: payload dtype on the wire in evaluation: float32, float16, int8.
    missing_message: in evaluation only, each element of every received message (channel, row,
        column) is zeroed with this probability, independently, before generation; the receiver's
        own message is kept (the reference's ``missing_message`` inference: its stage-1 model
        zeroes 0.4, its stage-2 model 0.1, with ``torch.rand(C, H, W) > p`` per collaborator).
    """

    kind = "bev"

    def __init__(self, channels: int, agent_types: List[str], lidar_range,
                 message: Optional[dict] = None, generator: Optional[dict] = None,
                 enhancer: Optional[dict] = None, warp_before_generation: Optional[bool] = None,
                 generation_weight: float = 1.0, generation_target: Literal["none", "ego_encoder"] = "none",
                 generation_target_weight: float = 1.0,
                 wire_dtype: Literal["float32", "float16", "int8"] = "float16", missing_message: float = 0.0):
        super().__init__()
        if not 0.0 <= float(missing_message) <= 1.0:
            raise ValueError(f"model.link.missing_message must be a probability in [0, 1] (the share of each received "
                             f"message's elements zeroed in evaluation), got {missing_message!r}")
        self.missing_message = float(missing_message)
        if generation_target not in ("none", "ego_encoder"):
            raise ValueError(f"model.link.generation_target must be none or ego_encoder, got {generation_target!r}")
        if generation_target_weight < 0:
            raise ValueError(f"model.link.generation_target_weight must be >= 0, got {generation_target_weight!r}")
        self.generation_target = generation_target
        self.generation_target_weight = float(generation_target_weight)
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
        # the model's protocol, which decides the generation order when warp_before_generation is None
        # (:meth:`use_protocol`, set by the detector; None: the arrival's computation, native or reference)
        self.model_protocol: Optional[str] = None
        # protocol reference, training: this forward pass's generations before the enhancer (own, receive)
        self._reference_record: Optional[dict] = None
        # protocol reference: per sender type whose stack zero-pads its feature to the grid, the
        # feature's own (h, w) before the pad (:meth:`extract_before_padding`)
        self.unpadded: Dict[str, Tuple[int, int]] = {}

    def use_protocol(self, protocol: str) -> None:
        """The detector's protocol (native, equalized or reference; set by the detector): with
        ``warp_before_generation`` None it decides the generation order (:meth:`warps_first`). Arrivals
        carry only the computation, which is native under equalized too. A true
        ``warp_before_generation`` under reference is refused here, at build time, naming the key."""
        self.warps_first(protocol)
        if protocol == "reference" and self.needs_ego_type_features:
            raise ValueError("model.link.generation_target: ego_encoder is beyond the paper and refused under "
                             "protocol reference (the reference GenComm trains stage 2 on the detection loss only); "
                             "set it to none")
        self.model_protocol = protocol

    @property
    def needs_ego_type_features(self) -> bool:
        """Whether training reads :attr:`Arrival.ego_type_features` (``generation_target: ego_encoder``)."""
        return self.generation_target == "ego_encoder"

    @staticmethod
    def needs_ego_type_inputs(spec: dict) -> bool:
        """Whether a training set for the link spec ``spec`` (``model.link``) must carry each collaborator's
        scan as its ego type reads it (``CooperativeDataset(ego_type_inputs=True)``)."""
        return spec.get("generation_target", "none") == "ego_encoder"

    def extract_before_padding(self, shapes: Dict[str, Tuple[Tuple[int, int], Tuple[int, int]]]) -> None:
        """Protocol ``reference`` (set by the detector, derived from the agent types' stacks): per type
        whose encoder stack centre-pads its feature from ``(h, w)`` to the grid's ``(H, W)`` (a camera
        grid smaller than the detection range), ``{type: ((h, w), (H, W))}``. :meth:`send` then extracts
        that type's message from the feature before the pad and pads the message with zeros the same
        way, as the reference GenComm (``heter_model_baseline_w_gencomm_stage2.forward``: the message
        extractor, then ``CenterCrop`` of the feature and the message alike). A stack that cuts its
        feature (a camera grid past the range) is refused: the reference's message reads the cut part."""
        out = {}
        for t, (before, after) in shapes.items():
            if t not in self.dme:
                raise KeyError(f"agent type {t} has no message extractor; known: {sorted(self.dme)}")
            if before[0] > after[0] or before[1] > after[1]:
                raise ValueError(f"model.agent_types.{t}.encoder: its feature {tuple(before)} is cut to the grid "
                                 f"{tuple(after)} (a camera xbound / ybound past the detection range); protocol "
                                 f"reference with the gencomm link extracts the message before the cut, from cells "
                                 f"the stack drops; make the camera grid at most the detection range")
            out[t] = (int(before[0]), int(before[1]))
        self.unpadded = out

    def _extract(self, t: str, features: Tensor) -> Tensor:
        """Type ``t``'s DME message of (n, C, H, W) features; for a type in :attr:`unpadded`, of the
        centre (h, w) before the stack's zero pad, then zero-padded back to (H, W) (``center_crop``)."""
        if t not in self.unpadded:
            return self.dme[t](features)
        h, w = self.unpadded[t]
        H, W = features.shape[-2:]
        top, left = (H - h) // 2, (W - w) // 2  # center_crop pads (H - h) // 2 rows before
        return center_crop(self.dme[t](features[..., top:top + h, left:left + w]), (H, W))

    def send(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """Sender side: (n, C, H, W) features -> (n, m, H, W) messages, each by its type's DME
        (under protocol reference, from the feature before its stack's pad: :meth:`extract_before_padding`)."""
        types = list(dict.fromkeys(agent_types))
        for t in types:
            if t not in self.dme:
                raise KeyError(f"agent type {t} has no message extractor; known: {sorted(self.dme)}")
        if len(types) == 1:  # one type (every stage 1): no gather and scatter copies of the maps
            return self._extract(types[0], features).to(features.dtype)
        out = features.new_zeros(features.shape[0], self.payload_channels, *features.shape[-2:])
        for t in types:
            idx = torch.as_tensor([i for i, a in enumerate(agent_types) if a == t], device=features.device)
            out[idx] = self._extract(t, features[idx]).to(out.dtype)  # autocast: the DME may compute in bf16
        return out

    def _generate(self, cond: Tensor, init: Tensor, receiver_types: List[str]) -> Tuple[Tensor, Tensor]:
        """Row k: the receiver type's SAFG from message ``cond[k]`` and init ``init[k]``, then its
        enhancer. (n, m, H, W), (n, C, H, W) -> (enhanced, generated before the enhancer), each
        (n, C, H, W) in the frame of ``cond``."""
        types = list(dict.fromkeys(receiver_types))
        for r in types:
            if r not in self.safg:
                raise KeyError(f"receiver type {r} has no feature generator; known: {sorted(self.safg)}")
        if len(types) == 1:  # one receiver type (batch of one ego type): no gather and scatter copies
            raw = self.safg[types[0]](cond, init).feature
            return self.enhancer[types[0]](raw).to(init.dtype), raw
        gen, raw = init.new_zeros(init.shape), init.new_zeros(init.shape)
        for r in types:
            sel = torch.as_tensor([k for k, t in enumerate(receiver_types) if t == r], device=init.device)
            raw_r = self.safg[r](cond[sel], init[sel]).feature
            raw[sel] = raw_r.to(raw.dtype)
            gen[sel] = self.enhancer[r](raw_r).to(gen.dtype)
        return gen, raw

    def receive(self, payload: Tensor, arrival: Arrival) -> Tensor:
        """Receiver side, batched over messages (:mod:`opencood_ext.models.links`): warp each
        message into the receiver's frame, generate a feature in the receiver's own space from
        it and the receiver's own feature, enhance; zero outside the cells the sender covers.
        Protocol ``reference`` (needs ``warp_before_generation: false``): generate from the
        unwarped message, enhance, warp, and mask nothing, as the reference GenComm does."""
        reference = arrival.protocol == "reference"
        first = self.warps_first(self.model_protocol or arrival.protocol)
        T_ego_from_sender = arrival.T_ego_from_sender
        if self.missing_message > 0 and not self.training:  # elements lost at random (class docstring)
            payload = payload * (torch.rand(payload.shape, device=payload.device) > self.missing_message)
        cond = warp_to_ego(payload, T_ego_from_sender, self.lidar_range) if first else payload
        gen, raw = self._generate(cond, arrival.receiver_features, arrival.receiver_types)
        if reference and self.training:
            if self._reference_record is None:
                raise RuntimeError("gencomm link: protocol reference in training generates the receiver's own "
                                   "feature (own) before the messages (receive); own was not called")
            self._reference_record["received"] = raw
        if not first:
            gen = warp_to_ego(gen, T_ego_from_sender, self.lidar_range)
        return gen if reference else gen * arrival.valid

    def warps_first(self, protocol: str = "native") -> bool:
        """Whether messages are warped before generation under ``protocol`` (``warp_before_generation``,
        or the protocol's order when it is None). Reference with true is refused, naming the key.

        The protocol's order: only ``native`` warps first. ``equalized`` generates first, as the reference
        does, because that order was the better one under it (issue 31: stage 1 of m1, training seed 0,
        230 test scenes, generate first minus warp first +0.046 [+0.028, +0.066] AP@0.5 and +0.076
        [+0.050, +0.100] AP@0.7, paired; docs/protocol.md)."""
        reference = protocol == "reference"
        if self.warp_before_generation is None:
            return protocol == "native"
        if reference and self.warp_before_generation:
            raise ValueError("model.link.warp_before_generation: protocol reference generates in the sender's "
                             "frame and warps afterwards, as the reference GenComm does; set it false or leave "
                             "it out")
        return bool(self.warp_before_generation)

    def own(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """Protocol ``reference``: the receiver's own (n, C, H, W) features, ego frame, replaced as the
        reference GenComm replaces the ego's: its type's DME message of the feature, generated
        into a feature from that message and the feature itself, enhanced. In training the
        generations before the enhancer are kept for :meth:`losses` (with those :meth:`receive`
        makes next), which reads them in the same forward pass."""
        gen, raw = self._generate(self.send(features, agent_types), features, agent_types)
        self._reference_record = {"own": (raw, features), "received": None} if self.training else None
        return gen

    def losses(self, received: Tensor, sender_features: Tensor, arrival: Arrival) -> Dict[str, Tensor]:
        """Stage 1, ``generation_weight`` times a mean squared error.

        Protocol ``native``: between each received feature (generated, enhanced, warped) and the
        sender's real one warped to the ego (detached), over the cells the sender covers.
        Protocol ``reference`` (GenComm ``point_pillar_gencomm_loss.py``): ``nn.MSELoss`` over every
        agent of the batch, the receivers included, between the generated feature BEFORE the
        enhancer and the agent's own real feature, both in the agent's own frame, every element
        weighted alike, the real feature not detached (the encoders learn from it too).
        sender_features: (n, C, H, W) the senders' real features, own frames, in ``received``'s order."""
        if arrival.protocol == "reference":
            record, self._reference_record = self._reference_record, None
            if self.generation_weight <= 0:
                return {}
            return {"generation": self.generation_weight * self._reference_generation_loss(record, sender_features)}
        out: Dict[str, Tensor] = {}
        if self.generation_weight > 0 and len(received):
            target = warp_to_ego(sender_features.detach(), arrival.T_ego_from_sender, self.lidar_range)
            out["generation"] = self.generation_weight * generation_loss(received, target, arrival.valid)
        if self.needs_ego_type_features and len(received):
            out.update(self._ego_encoder_loss(received, arrival))
        return out

    def _ego_encoder_loss(self, received: Tensor, arrival: Arrival) -> Dict[str, Tensor]:
        """``generation_target: ego_encoder``: over the messages whose sender type differs from the
        receiver's, the stage-1 generation loss's MSE between ``received`` (n, C, H, W: generated,
        enhanced, ego frame) and the sender's scan as the receiver type's frozen encoder reads it
        (``arrival.ego_type_features``, sender frame, warped to the ego here, detached), over the cells
        the sender covers; {} when every message is of its receiver's type."""
        cross = [k for k, (s, r) in enumerate(zip(arrival.sender_types, arrival.receiver_types)) if s != r]
        if not cross:
            return {}
        has = arrival.has_ego_type_feature
        if arrival.ego_type_features is None or has is None or not bool(has[cross].all()):
            raise ValueError("model.link.generation_target ego_encoder: a message from a sender of another type "
                             "than its receiver arrived without that sender's scan as the receiver type reads it; "
                             "train on a dataset built with ego_type_inputs (experiment.build_dataset does it "
                             "for this link)")
        idx = torch.as_tensor(cross, device=received.device)
        target = warp_to_ego(arrival.ego_type_features[idx].detach(), arrival.T_ego_from_sender[idx],
                             self.lidar_range)
        loss = generation_loss(received[idx], target, arrival.valid[idx])
        return {"generation_ego_encoder": self.generation_target_weight * loss}

    @staticmethod
    def _reference_generation_loss(record: Optional[dict], sender_features: Tensor) -> Tensor:
        """Mean of (generated - real)^2 over the receivers' own rows and the senders' rows together."""
        if record is None:
            raise RuntimeError("gencomm link: protocol reference's generation loss needs this forward pass's "
                               "generations (own, then receive, in training)")
        raw_own, real_own = record["own"]
        raw_got = record["received"]
        n = 0 if raw_got is None else raw_got.shape[0]
        if n != sender_features.shape[0]:
            raise ValueError(f"gencomm link: {n} generated messages but {sender_features.shape[0]} sender features")
        preds = [raw_own] + ([raw_got] if n else [])
        reals = [real_own] + ([sender_features] if n else [])
        return generation_loss(torch.cat(preds).float(), torch.cat(reals).float())
