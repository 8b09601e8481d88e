"""The records a :class:`~opencood_ext.data.dataset.CooperativeDataset` yields: one
:class:`AgentInput` per agent, gathered in a :class:`Sample` (the ego first); collated into a
:class:`~opencood_ext.data.batch.Batch`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from .voxelize import VoxelData


@dataclass
class AgentInput:
    """One agent's preprocessed input, in the frame its sensor data is expressed in.

    T_world_from_agent: (4, 4) float64 pose of that frame in the world: what the agent puts in
    its messages' header (the receiver places them with it). The ego's LiDAR points (and with
    ``collaborator_frame: ego`` every LiDAR agent's) are already moved into the augmented ego
    frame, whose pose this then is. LiDAR types carry ``voxels``; early fusion carries the raw
    ``points`` (N, 4) instead (the receiver merges and voxelises); camera types carry images.
    timestamp: the frame's timestamp as a number (OPV2V's frame counter; 0 when not numeric);
    older than the sample's under ``latency_frames``.
    """

    agent_id: int
    agent_type: str
    T_world_from_agent: np.ndarray
    timestamp: float = 0.0
    voxels: Optional[VoxelData] = None
    points: Optional[np.ndarray] = None  # (P, 4) float32, early fusion only
    num_points: int = 0
    images: Optional[np.ndarray] = None  # (Ncam, 3, H, W) float32, normalised
    K: Optional[np.ndarray] = None  # (Ncam, 3, 3) scaled to image_size
    T_lidar_from_camera: Optional[np.ndarray] = None  # (Ncam, 4, 4)
    depth: Optional[np.ndarray] = None  # (Ncam, H, W) float32 metres or None
    # training with GenComm's ego-encoder target only: this collaborator's scan as its sample's EGO type
    # reads it (that type's beams and voxel size), in the same frame as ``voxels``
    # (:mod:`~opencood_ext.data.ego_type_input`); None otherwise
    ego_type_voxels: Optional[VoxelData] = None


@dataclass
class Sample:
    """One training/evaluation sample: the ego first in ``agents``.

    T_ego_from_world: (4, 4) float64 the ego's (augmented) frame from the world: the receiver's
    own pose, all it needs besides the messages' headers.
    gt_boxes: (G, 7) float32 in the (augmented) ego frame; gt_ids, gt_classes: (G,) int64.
    """

    scenario: str
    timestamp: str
    ego_id: int
    agents: List[AgentInput]
    T_ego_from_world: np.ndarray
    gt_boxes: np.ndarray
    gt_ids: np.ndarray
    gt_classes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
