"""Collate :class:`Sample` lists into a typed :class:`Batch`.

Agents of all samples are flattened into one list (``N = sum(agents_per_sample)``),
ego first within each sample. Inputs are grouped by agent TYPE, because each type
has its own encoder: ``type_index[t]`` holds the positions (in the flattened
list) of that type's agents, in the same order as the rows of ``lidar[t]`` /
``camera[t]``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

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
    T_world_from_agent: (N, 4, 4) float64, each agent's input frame in the world: the pose its
        messages carry.
    T_ego_from_world: (B, 4, 4) float64, each sample's (augmented) ego frame from the world: the
        receiver's own pose.
    inputs: per type, a LidarInput or CameraInput of that type's agents (empty for early fusion).
    type_index: per type, (n_t,) long positions in the flattened agent list.
    gt_boxes: B tensors (G_b, 7) in the ego frame; gt_classes: B tensors (G_b,) long.
    num_points: (N,) points each agent's sensor produced (LiDAR) or 0.
    agent_times: (N,) the timestamp each agent's data was taken at (its messages carry it).
    points: early fusion: (N,) raw (P_i, 4) LiDAR points in each agent's own frame (None for a
        camera agent); empty otherwise.
    ego_type_inputs: training with GenComm's ego-encoder target only: per EGO type r, a LidarInput of
        the collaborators (of other types) of the samples whose ego is of type r, each agent's own scan
        as type r reads it, in the frame of that agent's own input; ego_type_index[r]: (n_r,) long
        their positions in the flattened agent list, in the LidarInput's row order. Empty otherwise.
    """

    agent_types: List[str]
    agent_ids: List[int]
    agents_per_sample: List[int]
    T_world_from_agent: torch.Tensor
    T_ego_from_world: torch.Tensor
    inputs: Dict[str, Union[LidarInput, CameraInput]]
    type_index: Dict[str, torch.Tensor]
    gt_boxes: List[torch.Tensor]
    num_points: torch.Tensor
    gt_classes: List[torch.Tensor] = field(default_factory=list)
    scenarios: List[str] = field(default_factory=list)
    timestamps: List[str] = field(default_factory=list)
    agent_times: List[float] = field(default_factory=list)
    points: List[Optional[torch.Tensor]] = field(default_factory=list)
    ego_type_inputs: Dict[str, LidarInput] = field(default_factory=dict)
    ego_type_index: Dict[str, torch.Tensor] = field(default_factory=dict)

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
    def T_ego_from_agent(self) -> torch.Tensor:
        """(N, 4, 4) float32: each agent's input frame seen from its sample's ego (derived from the
        poses; what a receiver computes from a message header and its own pose)."""
        T = self.T_ego_from_world[self.sample_index.to(self.T_ego_from_world.device)] @ self.T_world_from_agent
        return T.float()

    @property
    def sample_index(self) -> torch.Tensor:
        """(N,) which sample each flattened agent belongs to."""
        return torch.repeat_interleave(torch.arange(self.batch_size),
                                       torch.as_tensor(self.agents_per_sample))

    def to(self, device) -> "Batch":
        return Batch(
            agent_types=self.agent_types, agent_ids=self.agent_ids,
            agents_per_sample=self.agents_per_sample,
            T_world_from_agent=self.T_world_from_agent.to(device), T_ego_from_world=self.T_ego_from_world.to(device),
            inputs={k: v.to(device) for k, v in self.inputs.items()},
            type_index={k: v.to(device) for k, v in self.type_index.items()},
            gt_boxes=[g.to(device) for g in self.gt_boxes],
            num_points=self.num_points.to(device), gt_classes=[g.to(device) for g in self.gt_classes],
            scenarios=self.scenarios, timestamps=self.timestamps, agent_times=self.agent_times,
            points=[None if p is None else p.to(device) for p in self.points],
            ego_type_inputs={k: v.to(device) for k, v in self.ego_type_inputs.items()},
            ego_type_index={k: v.to(device) for k, v in self.ego_type_index.items()})


def collate_samples(samples: List[Optional[Sample]]) -> Optional[Batch]:
    """Group agents by type; see :class:`Batch`. ``None`` samples (bad frames a dataset with
    ``skip_bad_frames`` left out) are dropped; a batch of nothing but them collates to None,
    which the training and evaluation loops skip."""
    if not samples:
        raise ValueError("collate_samples got an empty list")
    samples = [s for s in samples if s is not None]
    if not samples:
        return None
    flat = [a for s in samples for a in s.agents]
    types = [a.agent_type for a in flat]
    inputs: Dict[str, Union[LidarInput, CameraInput]] = {}
    type_index: Dict[str, torch.Tensor] = {}
    for t in dict.fromkeys(types):  # first-seen order, deterministic
        idx = [i for i, a in enumerate(flat) if a.agent_type == t and a.points is None]
        if not idx:
            continue  # early fusion: raw points, voxelised by the receiver
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
    ego_type_inputs, ego_type_index = _ego_type_inputs(samples)
    return Batch(
        agent_types=types,
        agent_ids=[a.agent_id for a in flat],
        agents_per_sample=[len(s.agents) for s in samples],
        T_world_from_agent=torch.from_numpy(np.stack([a.T_world_from_agent for a in flat]).astype(np.float64)),
        T_ego_from_world=torch.from_numpy(np.stack([s.T_ego_from_world for s in samples]).astype(np.float64)),
        inputs=inputs, type_index=type_index,
        gt_boxes=[torch.from_numpy(s.gt_boxes) for s in samples],
        num_points=torch.as_tensor([a.num_points for a in flat], dtype=torch.long),
        gt_classes=[torch.from_numpy(s.gt_classes) for s in samples],
        scenarios=[s.scenario for s in samples], timestamps=[s.timestamp for s in samples],
        agent_times=[float(a.timestamp) for a in flat],
        points=[None if a.points is None else torch.from_numpy(a.points) for a in flat]
        if any(a.points is not None for a in flat) else [],
        ego_type_inputs=ego_type_inputs, ego_type_index=ego_type_index)


def _ego_type_inputs(samples: List[Sample]):
    """(per ego type r: LidarInput of the agents' ``ego_type_voxels`` in samples of an r ego, per r:
    (n_r,) long positions of those agents in the flattened list); ({}, {}) when no agent has one."""
    rows: Dict[str, List[int]] = {}
    voxels: Dict[str, list] = {}
    pos = 0
    for s in samples:
        r = s.agents[0].agent_type
        for a in s.agents:
            if a.ego_type_voxels is not None:
                rows.setdefault(r, []).append(pos)
                voxels.setdefault(r, []).append(a.ego_type_voxels)
            pos += 1
    return ({r: LidarInput.from_batch(collate_voxels(v), len(v)) for r, v in voxels.items()},
            {r: torch.as_tensor(i, dtype=torch.long) for r, i in rows.items()})
