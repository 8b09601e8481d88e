"""Agent types (modalities m1..m4) and the sensor rig; the default is
``agent_types.yaml`` beside this module (package data, so an installed wheel has it).

Like OPV2V-H, EVERY agent records the same rig -- the 64-beam sweep, its
ring reductions (``beam_variants``: 32 keeps every 2nd ring, 16 every 4th)
and the four cameras with depth -- and the modality assignment JSON says
which type each agent is. A type names the sensor its perception stack
uses (``sensor: lidar`` with ``beams``, or ``sensor: camera``); a backend
that simulates only each agent's own sensor (a live demo) reads that.

Camera mounts are vehicle-frame poses ``[x, y, z, roll, yaw, pitch]`` (m,
deg; left-handed x forward, y right, z up), OPV2V's rig: front (2.5, 0, 1.0),
right-rear (0, 0.3, 1.8, yaw 100), left-rear (0, -0.3, 1.8, yaw -100), back
(-2.0, 0, 1.5, yaw 180); the LiDAR sits at (-0.5, 0, 1.9). These reproduce the
fixture's ``cords`` relative to its ``lidar_pose`` exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Literal, Optional, Sequence, Tuple

import numpy as np

from opencood_ext.config import load_config
from opencood_ext.data.frame import sort_agent_ids

from .world import CameraSpec, LidarSpec, Pose

DEFAULT_PATH = Path(__file__).resolve().with_name("agent_types.yaml")


def _opv2v_mounts() -> Dict[str, Pose]:
    return {"camera0": (2.5, 0.0, 1.0, 0.0, 0.0, 0.0), "camera1": (0.0, 0.3, 1.8, 0.0, 100.0, 0.0),
            "camera2": (0.0, -0.3, 1.8, 0.0, -100.0, 0.0), "camera3": (-2.0, 0.0, 1.5, 0.0, 180.0, 0.0)}


@dataclass
class CameraRig:
    """Cameras shared by all agents: size, horizontal FOV (deg), vehicle-frame mounts."""

    width: int = 800
    height: int = 600
    fov: float = 100.0
    mounts: Dict[str, Pose] = field(default_factory=_opv2v_mounts)

    def specs(self, size: Optional[Tuple[int, int]] = None) -> List[CameraSpec]:
        """One CameraSpec per mount; ``size=(W, H)`` overrides the resolution
        (the FOV is kept, so the intrinsics scale with the width)."""
        w, h = size if size is not None else (self.width, self.height)
        return [CameraSpec(name, int(w), int(h), self.fov, tuple(m)) for name, m in self.mounts.items()]


@dataclass
class RsuRig:
    """Roadside units: LiDAR on a pole (height drawn in ``lidar_height``), the
    camera rig's yaws looking down by ``camera_pitch`` deg from just below it."""

    lidar_height: Tuple[float, float] = (4.0, 6.0)
    camera_pitch: float = -20.0
    camera_offset: float = 0.3


@dataclass
class AgentType:
    """A modality: ``sensor`` its perception uses; ``beams`` for a LiDAR type."""

    sensor: Literal["lidar", "camera"]
    beams: int = 64
    description: str = ""


def _default_types() -> Dict[str, AgentType]:
    return {"m1": AgentType("lidar", 64, "PointPillars, 64-beam LiDAR"),
            "m2": AgentType("camera", 64, "Lift-Splat-Shoot, 4 cameras"),
            "m3": AgentType("lidar", 32, "SECOND, 32-beam LiDAR"),
            "m4": AgentType("camera", 64, "Lift-Splat-Shoot, 4 cameras")}


@dataclass(frozen=True)
class TypeRig:
    """What an agent of one type records: ``lidar`` (the 64-beam sweep),
    ``lidar_variants`` ({beams: keep_every}), ``cameras``; plus the type's own
    ``sensor`` / ``beams`` / ``description``."""

    name: str
    sensor: str
    beams: int
    description: str
    lidar: LidarSpec
    cameras: Tuple[CameraSpec, ...]
    lidar_variants: Dict[int, int]


@dataclass
class AgentTypesConfig:
    """Schema of ``agent_types.yaml`` (the default: :data:`DEFAULT_PATH`).

    Also a read-only mapping ``{type name: TypeRig}`` (``cfg["m2"].cameras``,
    ``dict(cfg)``), the per-type sensor specs a backend attaches.
    """

    lidar: LidarSpec = field(default_factory=LidarSpec)
    beam_variants: List[int] = field(default_factory=lambda: [32, 16])
    cameras: CameraRig = field(default_factory=CameraRig)
    rsu: RsuRig = field(default_factory=RsuRig)
    types: Dict[str, AgentType] = field(default_factory=_default_types)
    assignment: Literal["in_order", "random"] = "in_order"

    def __post_init__(self):
        ch = self.lidar.channels
        for b in self.beam_variants:
            if b < 1 or b >= ch or ch % b:
                raise ValueError(f"beam_variants: {b} must divide lidar.channels={ch} and be smaller")
        if not self.types:
            raise ValueError("types: at least one agent type is needed")
        for name, t in self.types.items():
            if t.sensor == "lidar" and t.beams != ch and t.beams not in self.beam_variants:
                raise ValueError(f"types.{name}.beams={t.beams}: not recorded; use {ch} or one of "
                                 f"beam_variants {self.beam_variants}")

    def __getitem__(self, name: str) -> TypeRig:
        if name not in self.types:
            raise KeyError(f"unknown agent type {name!r}; known: {sorted(self.types)}")
        t = self.types[name]
        return TypeRig(name, t.sensor, t.beams, t.description, self.lidar, tuple(self.cameras.specs()),
                       self.variant_keep())

    def __iter__(self):
        return iter(self.types)

    def __len__(self) -> int:
        return len(self.types)

    def keys(self):
        return self.types.keys()

    def variant_keep(self) -> Dict[int, int]:
        """``{beams: keep_every}`` for the recorded ring reductions."""
        return {b: self.lidar.channels // b for b in self.beam_variants}

    def assign(self, agent_ids: Sequence[int], rng: np.random.Generator) -> Dict[int, str]:
        """Agent id -> type name: ``in_order`` cycles through the types over
        ids sorted vehicles-first (HEAL's in-order JSON), ``random`` draws one each."""
        names = list(self.types)
        ids = sort_agent_ids(agent_ids)
        if self.assignment == "in_order":
            return {a: names[k % len(names)] for k, a in enumerate(ids)}
        return {a: names[int(rng.integers(len(names)))] for a in ids}


def load_agent_types(path=None) -> AgentTypesConfig:
    """Read and validate an agent-types yaml (errors name the file and key)."""
    return load_config(Path(path) if path is not None else DEFAULT_PATH, AgentTypesConfig)
