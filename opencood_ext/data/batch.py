"""Collate :class:`Sample` lists into a typed :class:`Batch`.

Agents of all samples are flattened into one list (``N = sum(agents_per_sample)``),
ego first within each sample. Inputs are grouped by agent TYPE, because each type
has its own encoder: ``type_index[t]`` holds the positions (in the flattened
list) of that type's agents, in the same order as the rows of ``lidar[t]`` /
``camera[t]``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Union

import numpy as np
import torch

from .inputs import CameraInput, LidarInput
from .dataset import Sample
from .voxelize import collate_voxels


@dataclass
class Batch:
    """A collated batch.

    agent_types: (N,) type name per flattened agent.
    agent_ids: (N,) dataset agent ids.
    agents_per_sample: (B,) how many agents each sample has; ego first.
    T_ego_from_agent: (N, 4, 4) float32, agent frame -> its sample's ego frame.
    inputs: per type, a LidarInput or CameraInput of that type's agents.
    type_index: per type, (n_t,) long positions in the flattened agent list.
    gt_boxes: B tensors (G_b, 7) in the ego frame; gt_classes: B tensors (G_b,) long.
    num_points: (N,) points each agent's sensor produced (LiDAR) or 0.
    """

    agent_types: List[str]
    agent_ids: List[int]
    agents_per_sample: List[int]
    T_ego_from_agent: torch.Tensor
    inputs: Dict[str, Union[LidarInput, CameraInput]]
    type_index: Dict[str, torch.Tensor]
    gt_boxes: List[torch.Tensor]
    num_points: torch.Tensor
    gt_classes: List[torch.Tensor] = field(default_factory=list)
    scenarios: List[str] = field(default_factory=list)
    timestamps: List[str] = field(default_factory=list)
    early_sent_bytes: List[List[int]] = field(default_factory=list)  # per sample, per collaborator

    @property
    def batch_size(self) -> int:
        return len(self.agents_per_sample)

    @property
    def num_agents(self) -> int:
        return len(self.agent_types)

    @property
    def ego_index(self) -> torch.Tensor:
        """(B,) position of each sample's ego in the flattened agent list."""
        starts = np.concatenate([[0], np.cumsum(self.agents_per_sample)[:-1]])
        return torch.as_tensor(starts, dtype=torch.long)

    @property
    def sample_index(self) -> torch.Tensor:
        """(N,) which sample each flattened agent belongs to."""
        return torch.repeat_interleave(torch.arange(self.batch_size),
                                       torch.as_tensor(self.agents_per_sample))

    def to(self, device) -> "Batch":
        return Batch(
            agent_types=self.agent_types, agent_ids=self.agent_ids,
            agents_per_sample=self.agents_per_sample,
            T_ego_from_agent=self.T_ego_from_agent.to(device),
            inputs={k: v.to(device) for k, v in self.inputs.items()},
            type_index={k: v.to(device) for k, v in self.type_index.items()},
            gt_boxes=[g.to(device) for g in self.gt_boxes],
            num_points=self.num_points.to(device), gt_classes=[g.to(device) for g in self.gt_classes],
            scenarios=self.scenarios, timestamps=self.timestamps, early_sent_bytes=self.early_sent_bytes)


def collate_samples(samples: List[Sample]) -> Batch:
    """Group agents by type; see :class:`Batch`."""
    if not samples:
        raise ValueError("collate_samples got an empty list")
    flat = [a for s in samples for a in s.agents]
    types = [a.agent_type for a in flat]
    inputs: Dict[str, Union[LidarInput, CameraInput]] = {}
    type_index: Dict[str, torch.Tensor] = {}
    for t in dict.fromkeys(types):  # first-seen order, deterministic
        idx = [i for i, a in enumerate(flat) if a.agent_type == t]
        members = [flat[i] for i in idx]
        type_index[t] = torch.as_tensor(idx, dtype=torch.long)
        if members[0].voxels is not None:
            vb = collate_voxels([m.voxels for m in members])
            inputs[t] = LidarInput.from_batch(vb, len(members))
        else:
            depth = None
            if all(m.depth is not None for m in members):
                depth = torch.from_numpy(np.stack([m.depth for m in members]))
            inputs[t] = CameraInput(
                images=torch.from_numpy(np.stack([m.images for m in members])),
                K=torch.from_numpy(np.stack([m.K for m in members])),
                T_lidar_from_camera=torch.from_numpy(np.stack([m.T_lidar_from_camera for m in members])),
                depth=depth)
    return Batch(
        agent_types=types,
        agent_ids=[a.agent_id for a in flat],
        agents_per_sample=[len(s.agents) for s in samples],
        T_ego_from_agent=torch.from_numpy(np.stack([a.T_ego_from_agent for a in flat]).astype(np.float32)),
        inputs=inputs, type_index=type_index,
        gt_boxes=[torch.from_numpy(s.gt_boxes) for s in samples],
        num_points=torch.as_tensor([a.num_points for a in flat], dtype=torch.long),
        gt_classes=[torch.from_numpy(s.gt_classes) for s in samples],
        scenarios=[s.scenario for s in samples], timestamps=[s.timestamp for s in samples],
        early_sent_bytes=[list(s.sent_bytes) for s in samples])
