"""The World protocol every co-simulation backend implements, and the
backend-neutral sensor specs.

Two backends exist: :class:`opencood_ext.sim.builtin.BuiltinWorld` (procedural
town, Embree ray casting, no download) and a CARLA bridge. The recorder
(:mod:`opencood_ext.sim.recorder`) and the live demo consume either through this
protocol only.

Frames and conventions (the same as CARLA / OPV2V, see docs/formats.md):

* World and sensor frames are LEFT-handed: x forward, y right, z up; a yaw
  turns +x toward +y. Poses are ``[x, y, z, roll, yaw, pitch]`` (m, degrees)
  and become matrices with :func:`opencood_ext.geometry.pose_to_matrix`.
* A sensor ``mount`` is its pose relative to the parent actor (a vehicle's
  reference point on the ground, or the foot of a roadside pole), i.e.
  ``T_parent_from_sensor = pose_to_matrix(mount)`` -- CARLA's attach
  transform.
* Camera frames are UE4-style like the rest: x forward (optical axis), y
  right, z up. A point ``p = (x, y, z)`` in a camera frame projects to pixel
  coordinates ``(u, v) = (cx + fx * y / x, cy - fy * z / x)``, i.e.
  ``K @ [y, -z, x]`` divided by ``x``; the pixel with integer index
  ``(col, row)`` covers ``[col, col + 1) x [row, row + 1)``, so ``p`` lands in
  pixel ``(floor(u), floor(v))``. :func:`project_points` implements exactly
  this and the built-in renderer casts its rays through pixel centres
  ``(col + 0.5, row + 0.5)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol, Tuple, runtime_checkable

import numpy as np

from opencood_ext.data.frame import Frame

Pose = Tuple[float, float, float, float, float, float]


@dataclass
class LidarSpec:
    """A spinning LiDAR with CARLA ``sensor.lidar.ray_cast`` parameters.

    Every field but ``mount`` and ``keep_every`` is the CARLA attribute of the
    same name (``carla_attributes`` gives them as CARLA wants them). One sweep
    covers ``360 * rotation_frequency * tick_seconds`` degrees; the built-in
    world ticks 0.05 s, so the default 20 Hz gives one full sweep a tick with
    ``points_per_second / rotation_frequency`` rays (65,000 here).
    ``keep_every`` > 1 keeps every n-th ring of that sweep (OPV2V-H's 32- and
    16-beam scans are the 64-beam scan with every 2nd / 4th ring).
    """

    channels: int = 64
    range: float = 120.0
    points_per_second: int = 1_300_000
    rotation_frequency: float = 20.0
    upper_fov: float = 2.0
    lower_fov: float = -25.0
    horizontal_fov: float = 360.0
    atmosphere_attenuation_rate: float = 0.004
    dropoff_general_rate: float = 0.1
    dropoff_intensity_limit: float = 0.7
    dropoff_zero_intensity: float = 0.15
    noise_stddev: float = 0.02
    mount: Pose = (-0.5, 0.0, 1.9, 0.0, 0.0, 0.0)
    keep_every: int = 1

    def __post_init__(self):
        if self.channels < 1 or self.points_per_second < self.channels:
            raise ValueError(f"LidarSpec: channels={self.channels}, points_per_second="
                             f"{self.points_per_second}: need 1 <= channels <= points_per_second")
        if not self.upper_fov > self.lower_fov:
            raise ValueError(f"LidarSpec: upper_fov {self.upper_fov} must exceed lower_fov {self.lower_fov}")
        if self.range <= 0 or self.rotation_frequency <= 0:
            raise ValueError("LidarSpec: range and rotation_frequency must be positive")
        if self.keep_every < 1 or self.channels % self.keep_every:
            raise ValueError(f"LidarSpec: keep_every={self.keep_every} must divide channels={self.channels}")

    @property
    def rings(self) -> int:
        """Number of rings actually returned (channels / keep_every)."""
        return self.channels // self.keep_every

    def rays_per_channel(self, tick_seconds: float = 0.05) -> int:
        """Rays one channel casts in one tick (CARLA: points_per_second * dt / channels)."""
        return max(1, int(round(self.points_per_second * tick_seconds / self.channels)))

    def swept_degrees(self, tick_seconds: float = 0.05) -> float:
        """Horizontal angle one tick covers: 360 * rotation_frequency * dt, at most horizontal_fov."""
        return min(self.horizontal_fov, 360.0 * self.rotation_frequency * tick_seconds)

    def carla_attributes(self) -> Dict[str, str]:
        """Blueprint attributes for ``sensor.lidar.ray_cast`` (``keep_every`` and
        ``mount`` are applied by the bridge, not by CARLA)."""
        names = ("channels", "range", "points_per_second", "rotation_frequency", "upper_fov",
                 "lower_fov", "horizontal_fov", "atmosphere_attenuation_rate",
                 "dropoff_general_rate", "dropoff_intensity_limit", "dropoff_zero_intensity",
                 "noise_stddev")
        return {n: str(getattr(self, n)) for n in names}


@dataclass
class CameraSpec:
    """A pinhole RGB (+ depth) camera.

    ``fov`` is CARLA's horizontal field of view in degrees; with square pixels
    ``fx = fy = width / (2 tan(fov / 2))``, ``cx = width / 2``, ``cy = height / 2``
    (OPV2V: 800 x 600, fov 100 -> fx = fy = 335.64, cx = 400, cy = 300).
    """

    name: str = "camera0"
    width: int = 800
    height: int = 600
    fov: float = 100.0
    mount: Pose = (2.5, 0.0, 1.0, 0.0, 0.0, 0.0)

    def __post_init__(self):
        if self.width < 1 or self.height < 1 or not 0 < self.fov < 180:
            raise ValueError(f"CameraSpec {self.name}: need width, height >= 1 and 0 < fov < 180, "
                             f"got {self.width}x{self.height}, fov {self.fov}")

    @property
    def K(self) -> np.ndarray:
        """(3, 3) float64 intrinsic matrix."""
        f = self.width / (2.0 * math.tan(math.radians(self.fov) / 2.0))
        return np.array([[f, 0.0, self.width / 2.0], [0.0, f, self.height / 2.0], [0.0, 0.0, 1.0]])

    def carla_attributes(self) -> Dict[str, str]:
        """Blueprint attributes for ``sensor.camera.rgb`` / ``sensor.camera.depth``."""
        return {"image_size_x": str(self.width), "image_size_y": str(self.height), "fov": str(self.fov)}


def project_points(K: np.ndarray, points_camera: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Project (N, 3) points in a UE4-style camera frame (x forward) to pixels.

    Returns ``uv`` (N, 2) float64 and ``in_front`` (N,) bool (x > 1e-6); a point
    lies in pixel ``floor(uv)``.
    """
    p = np.asarray(points_camera, dtype=np.float64).reshape(-1, 3)
    in_front = p[:, 0] > 1e-6
    depth = np.where(in_front, p[:, 0], 1.0)
    cv = np.stack([p[:, 1], -p[:, 2], p[:, 0]], axis=1) / depth[:, None]
    uv = cv @ np.asarray(K, dtype=np.float64).T
    return uv[:, :2], in_front


@dataclass
class AgentInfo:
    """A connected agent as the world sets it up.

    agent_id: vehicle actor id (>= 0) or roadside unit (< 0).
    agent_type: modality name ("m1".."m4").
    lidar: the recorded sweep; ``lidar_variants`` the extra ring reductions
        (``{32: 2, 16: 4}`` = beams -> keep_every), empty when not recorded.
    cameras: recorded cameras (empty with cameras off).
    """

    agent_id: int
    agent_type: str
    lidar: Optional[LidarSpec]
    cameras: List[CameraSpec] = field(default_factory=list)
    lidar_variants: Dict[int, int] = field(default_factory=dict)

    @property
    def is_rsu(self) -> bool:
        return self.agent_id < 0


@runtime_checkable
class World(Protocol):
    """A running cooperative-driving world.

    ``reset(seed)`` builds a new scenario (town, traffic, connected agents);
    each ``tick()`` advances simulated time by one saved frame (0.1 s, two
    0.05 s physics ticks) and returns every connected agent's observation with
    labels in a :class:`Frame`; ``close()`` frees the backend.
    """

    def reset(self, seed: int) -> None: ...

    def tick(self) -> Frame: ...

    @property
    def agents(self) -> List[AgentInfo]: ...

    @property
    def scenario(self) -> str: ...

    def protocol(self) -> dict:
        """Simulation settings for ``data_protocol.yaml`` (plain YAML types)."""
        ...

    def close(self) -> None: ...
