"""The one data model every source yields and every sink consumes.

Readers (OPV2V / OPV2V-H / V2XSet, DAIR-V2X-C, V2X-Real), the built-in
simulator and the CARLA bridge all produce :class:`Frame`; the dataset writer,
training and the live demo all consume it.

Frames and units
----------------
* Poses are 4x4 float64 homogeneous matrices named ``T_<to>_from_<from>``:
  ``T_world_from_lidar @ p_lidar = p_world``.
* OPV2V-family data is in CARLA's LEFT-handed frame (x forward, y right, z up);
  DAIR-V2X is right-handed. Nothing is flipped: each dataset stays in its own
  frame end to end, only plots flip y.
* Object labels keep OPV2V's world semantics (see :class:`ObjectLabel`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

# Object classes kept by the vehicle-detection task.
VEHICLE_CLASSES = ("Car", "Van", "Truck", "Bus")


@dataclass
class CameraObs:
    """One camera of one agent.

    image: (H, W, 3) uint8 RGB.
    depth: (H, W) float32 raw depth-image values, or None.
    K: (3, 3) float64 intrinsic matrix.
    T_lidar_from_camera: (4, 4) float64 camera pose in the LiDAR frame. OPV2V's yaml
        ``extrinsic`` is the INVERSE of this (it maps LiDAR points into the camera
        frame; checked on the V2XSet fixture against ``cords``), so readers invert it.
        The camera frame is CARLA's body frame: x forward (optical axis), y right, z up.
    T_world_from_camera: (4, 4) float64 from OPV2V's ``cords`` when known, else None.
    name: "camera0".."camera3" (front, right-rear, left-rear, back).
    """

    name: str
    image: Optional[np.ndarray]
    K: np.ndarray
    T_lidar_from_camera: np.ndarray
    depth: Optional[np.ndarray] = None
    T_world_from_camera: Optional[np.ndarray] = None
    cords: Optional[np.ndarray] = None  # raw 6-vector pose when read from OPV2V


@dataclass
class ObjectLabel:
    """A labelled object in WORLD coordinates, with OPV2V semantics.

    location: (3,) world position of the object's reference point.
    center: (3,) offset ADDED IN WORLD AXES to ``location`` to reach the box centre.
    angle: (3,) [roll, yaw, pitch] in degrees.
    extent: (3,) HALF length, HALF width, HALF height in metres.
    """

    object_id: int
    location: np.ndarray
    center: np.ndarray
    angle: np.ndarray
    extent: np.ndarray
    obj_type: str = "Car"
    speed: float = 0.0

    def __post_init__(self):
        self.location = np.asarray(self.location, dtype=np.float64).reshape(3)
        self.center = np.asarray(self.center, dtype=np.float64).reshape(3)
        self.angle = np.asarray(self.angle, dtype=np.float64).reshape(3)
        self.extent = np.asarray(self.extent, dtype=np.float64).reshape(3)
        self.object_id = int(self.object_id)


@dataclass
class AgentObs:
    """One connected agent's observation at one timestamp.

    agent_id: integer id; negative ids are roadside units.
    agent_type: modality name such as "m1".."m4" (from the assignment JSON) or
        "" when the dataset has none.
    T_world_from_lidar: (4, 4) float64 LiDAR pose.
    lidar: (N, 4) float32 x, y, z, intensity in the LiDAR frame (intensity 0..1).
    lidar_beams: extra scans of the same sweep reduced to fewer beams,
        ``{32: (N32, 4), 16: (N16, 4)}`` (OPV2V-H ``_32.pcd`` / ``_16.pcd``).
    cameras: CameraObs list, possibly empty.
    visible_ids: ids of objects this agent's label file lists.
    lidar_pose: raw [x, y, z, roll, yaw, pitch] when read from OPV2V (degrees).
    meta: other per-agent values kept for writing back (ego_speed, true_ego_pos, ...).
    """

    agent_id: int
    agent_type: str
    T_world_from_lidar: np.ndarray
    lidar: np.ndarray
    cameras: List[CameraObs] = field(default_factory=list)
    lidar_beams: Dict[int, np.ndarray] = field(default_factory=dict)
    visible_ids: List[int] = field(default_factory=list)
    lidar_pose: Optional[np.ndarray] = None
    meta: Dict[str, object] = field(default_factory=dict)

    @property
    def is_rsu(self) -> bool:
        return self.agent_id < 0


@dataclass
class Frame:
    """All agents of one scenario at one timestamp plus the world ground truth.

    objects: ``{object_id: ObjectLabel}``, the union over agents by object id.
    agents: ordered as the evaluation protocol wants (vehicles by id, then RSUs);
        ``agents[0]`` is the default ego.
    side_labels: True when each agent's ``visible_ids`` are its OWN labels (DAIR-V2X's
        single-side files): an object two agents label appears twice, under two ids, and
        ground truth merges them by bird's-eye-view overlap
        (:func:`opencood_ext.data.reference.side_label_ground_truth`).
    """

    scenario: str
    timestamp: str
    agents: List[AgentObs]
    objects: Dict[int, ObjectLabel] = field(default_factory=dict)
    split: str = ""
    source: str = ""  # path or backend name, used in error messages
    side_labels: bool = False

    def agent(self, agent_id: int) -> AgentObs:
        for a in self.agents:
            if a.agent_id == agent_id:
                return a
        raise KeyError(f"frame {self.scenario}/{self.timestamp} has no agent {agent_id}; "
                       f"agents are {[a.agent_id for a in self.agents]}")


def sort_agent_ids(ids):
    """Vehicles (id >= 0) ascending, then roadside units (negative ids) by |id|."""
    ids = [int(i) for i in ids]
    return sorted([i for i in ids if i >= 0]) + sorted([i for i in ids if i < 0], key=abs)


def timestamp_value(ts) -> float:
    """A frame's timestamp as a number for message headers (0.0 when it is not numeric)."""
    try:
        value = float(ts)
    except (TypeError, ValueError):
        return 0.0
    return value if np.isfinite(value) else 0.0
