"""Live cooperative detection on any World backend (built-in or CARLA).

Each tick: every agent of the ego's alliance encodes its own sensor data; the
collaborators' messages (GenComm's 2-channel map, or the full feature) are
serialised with :mod:`opencood_ext.comm` and pass through a channel with optional
latency, loss and pose noise; the ego decodes what arrived, places each message
with the POSE IN ITS HEADER (so pose noise and stale messages act as they
would on a road), generates features in its own space, fuses, and detects.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import CooperativeDataset
from opencood_ext.data.frame import Frame
from opencood_ext.eval.ap import APAccumulator
from opencood_ext.geometry import invert_transform
from opencood_ext.models.warp import warp_mask
from opencood_ext.postprocess import decode_detections

from ..comm import ChannelEffects, Message, encode, receive_all

log = logging.getLogger(__name__)


@dataclass
class TickResult:
    """One tick. boxes/scores: detections in the ego frame; gt_boxes likewise.
    bytes_sent: packet size per collaborator this tick; received/rejected: packets
    the ego accepted/refused this tick (with reasons)."""

    tick: int
    ego_id: int
    boxes: np.ndarray
    scores: np.ndarray
    gt_boxes: np.ndarray
    bytes_sent: List[int]
    received: int
    rejected: List[str] = field(default_factory=list)
    agent_ids: List[int] = field(default_factory=list)


class LiveCooperation:
    """Runs a trained intermediate-fusion (or no-fusion) model frame by frame."""

    def __init__(self, cfg, model, effects: Optional[ChannelEffects] = None, wire_dtype: Optional[str] = None):
        if model.fusion not in ("intermediate", "none"):
            raise ValueError(f"the live demo runs intermediate-fusion models (GenComm or full feature) or "
                             f"no fusion; this model is '{model.fusion}'")
        self.cfg = cfg
        self.model = model.eval()
        self.effects = effects or ChannelEffects()
        link = model.link
        self.wire_dtype = wire_dtype or getattr(link, "wire_dtype", "float32")
        self.acc = APAccumulator()
        self.ticks = 0
        self.total_bytes = 0
        self.total_messages = 0

    def _sample(self, frame: Frame):
        ds = CooperativeDataset([frame], self.cfg.data, self.model.voxel_sizes(), train=False,
                                cooperation="all" if self.model.fusion == "intermediate" else "ego_only")
        return ds.select_agents(ds.read_frame(0), np.random.default_rng(0)), ds[0]

    @torch.no_grad()
    def step(self, frame: Frame) -> TickResult:
        agents, sample = self._sample(frame)
        batch = collate_samples([sample])
        model = self.model
        feats, _ = model.encode(batch)
        ego_feat = feats[:1]
        ego = agents[0]
        ego_type = batch.agent_types[0]
        packets, sizes = [], []
        if model.fusion == "intermediate":
            msgs = model.link.messages(feats, batch.agent_types)
            for i in range(1, batch.num_agents):
                a = agents[i]
                packet = encode(Message(sender_id=a.agent_id, agent_type=a.agent_type,
                                        timestamp=float(frame.timestamp), pose=a.T_world_from_lidar,
                                        payload=msgs[i].cpu().numpy()), dtype=self.wire_dtype)
                packets.append(packet)
                sizes.append(len(packet))
        delivered = self.effects.step(packets)
        received, rejected = receive_all(delivered)
        received = [m for m in received if m.sender_id != ego.agent_id]
        if received:
            T_ego_from_world = invert_transform(ego.T_world_from_lidar)
            T = torch.as_tensor(np.stack([T_ego_from_world @ m.pose for m in received]), dtype=torch.float32)
            payload = torch.stack([torch.as_tensor(m.payload, dtype=torch.float32) for m in received])
            H, W = model.grid.shape
            valid = warp_mask(T, model.lidar_range, (H, W))
            gen = model.link.generate(payload, T, ego_feat.expand(len(received), -1, -1, -1),
                                      [ego_type] * len(received)) * valid
            fused = model.fuse(torch.cat([ego_feat, gen]), [1 + len(received)],
                               torch.cat([torch.ones(1, 1, H, W), valid]))
        else:
            fused = ego_feat
        det = decode_detections(model.detect(fused), model.anchors, coder=model.coder,
                                gt_range=model.lidar_range, **model.post)[0]
        self.acc.add(det.boxes, det.scores, sample.gt_boxes)
        self.ticks += 1
        self.total_bytes += sum(sizes)
        self.total_messages += len(sizes)
        return TickResult(self.ticks, ego.agent_id, det.boxes.numpy(), det.scores.numpy(), sample.gt_boxes,
                          sizes, len(received), [f"packet {i}: {r}" for i, r in rejected],
                          [a.agent_id for a in agents])

    def running_ap(self) -> dict:
        """AP so far (global order) at 0.3 / 0.5 / 0.7."""
        return self.acc.result(global_sort=True).ap

    @property
    def bytes_per_message(self) -> float:
        return self.total_bytes / max(self.total_messages, 1)
