"""Live cooperative detection on any World backend (built-in or CARLA).

Each tick: every agent of the ego's alliance encodes its own sensor data; the
collaborators' messages (whatever the model's fusion method sends: a GenComm
map, a full feature, boxes, points) go through the model's own transport,
:meth:`~opencood_ext.models.detector.CooperativeDetector.deliver` ->
:func:`~opencood_ext.comm.messages.transmit`, the path of dataset evaluation:
encoded to bytes in the run's wire dtype (the link's ``wire_dtype`` config
key; senders of ``model.blank_message_types`` send zeros), passed through a
live :class:`~opencood_ext.comm.channel.ChannelEffects` (latency in ticks,
loss, pose noise), decoded and checked by the receiver under the run's
``receiver:`` config (acceptance, the per-tick budget, one message per sender,
the alliance registry: every agent seen so far with its type, its ``now``:
this tick's frame time); what it cannot use is logged and counted, and the ego
keeps detecting. Each message is placed with the POSE IN ITS HEADER (so pose
noise and stale messages act as they would on a road). With an alliance key
every packet is signed and only signed packets are accepted; with per-sender
keys each sender signs with its own, and the ego refuses replayed sequences
(its replay window lives as long as the loop). ``tick_s``: the world's seconds
per timestamp unit, so ``receiver.max_age`` is seconds. The sender and
receiver are the fusion method's own ``send`` / ``detect``.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from opencood_ext.comm import ChannelEffects
from opencood_ext.comm.messages import rule_of
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import CooperativeDataset
from opencood_ext.data.frame import Frame
from opencood_ext.eval.ap import APAccumulator
from opencood_ext.models import voxel_sizes


@dataclass
class TickResult:
    """One tick. boxes/scores: detections in the ego frame; gt_boxes likewise.
    bytes_sent: packet size per collaborator this tick (signature included); received: packets the
    ego accepted this tick; rejected: the reason of each packet it refused (transmit logs them);
    rejected_counts: how many were refused by each rule (:func:`~opencood_ext.comm.messages.rule_of`)."""

    tick: int
    ego_id: int
    boxes: np.ndarray
    scores: np.ndarray
    gt_boxes: np.ndarray
    bytes_sent: List[int]
    received: int
    rejected: List[str] = field(default_factory=list)
    agent_ids: List[int] = field(default_factory=list)
    rejected_counts: Dict[str, int] = field(default_factory=dict)


class LiveCooperation:
    """Runs a trained model frame by frame (any fusion method) through ``effects``, the live channel.
    The wire dtype is the model's (its link's ``wire_dtype``, set in the run's config). ``tick_s``:
    seconds per unit of the frames' timestamps (the world's tick; default the receiver's ``tick_s``)."""

    def __init__(self, cfg, model, effects: Optional[ChannelEffects] = None, tick_s: Optional[float] = None):
        self.cfg = cfg
        self.model = model.eval()
        if tick_s is not None and tick_s != model.receiver.tick_s:
            model.receiver = dataclasses.replace(model.receiver, tick_s=float(tick_s))
        self.effects = effects or ChannelEffects()
        self.acc = APAccumulator()
        self.ticks = 0
        self.total_bytes = 0
        self.total_messages = 0
        self.total_rejected = 0
        self.rejected_reasons: Counter = Counter()  # rule -> messages refused by it, over all ticks
        self._registry: Dict[int, str] = {}  # the alliance's members seen so far: agent id -> type
        if model.authenticated:  # pose noise is the sender's own error: it signs the noisy pose
            self.effects.signing_key = model.security.channel_key
        self._sizes = voxel_sizes(cfg.model) if cfg.model else model.voxel_sizes()

    def _sample(self, frame: Frame):
        ds = CooperativeDataset([frame], self.cfg.data, self._sizes, train=False,
                                cooperation=self.model.method.dataset_agents(train=False))
        return ds.select_agents(ds.read_frame(0), np.random.default_rng(0)), ds[0]

    @torch.no_grad()
    def step(self, frame: Frame) -> TickResult:
        agents, sample = self._sample(frame)
        batch = collate_samples([sample])
        model, method = self.model, self.model.method
        feats = model.encode(batch).feats
        context = model.receiver_contexts(batch)[0]
        self._registry.update(context.registry or {})
        context = dataclasses.replace(context, registry=dict(self._registry))
        delivery = model.deliver(method.send(model, batch, feats), channel=self.effects, wire=True,
                                 contexts=[context])
        rejected = [reason for _, reason in delivery.rejected]
        counts = Counter(rule_of(reason) for reason in rejected)
        self.rejected_reasons.update(counts)
        det = method.detect(model, batch, feats, delivery.arrived)[0]
        self.acc.add(det.boxes, det.scores, sample.gt_boxes)
        self.ticks += 1
        self.total_bytes += sum(delivery.bytes_sent)
        self.total_messages += len(delivery.bytes_sent)
        self.total_rejected += len(rejected)
        return TickResult(self.ticks, sample.ego_id, det.boxes.numpy(), det.scores.numpy(), sample.gt_boxes,
                          list(delivery.bytes_sent), len(delivery.arrived), rejected,
                          [a.agent_id for a in agents], dict(counts))

    def running_ap(self) -> dict:
        """AP so far (global order) at 0.3 / 0.5 / 0.7."""
        return self.acc.result(global_sort=True).ap

    @property
    def bytes_per_message(self) -> float:
        return self.total_bytes / max(self.total_messages, 1)
