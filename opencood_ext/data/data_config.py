"""The ``data:`` section of an experiment: :class:`DataConfig` and the per-type
:class:`AgentTypeData` (also importable from :mod:`opencood_ext.data.dataset`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, Tuple

from ..config import FieldError
from .augment import AugmentConfig
from .frame import VEHICLE_CLASSES


@dataclass
class AgentTypeData:
    """How one agent type (modality) turns its sensors into model input.

    sensor: "lidar" or "camera".
    lidar_beams: 64 uses the main scan, 32/16 use OPV2V-H's reduced scans.
    image_size: (H, W) the four cameras are resized to (intrinsics scaled).
    """

    sensor: Literal["lidar", "camera"] = "lidar"
    lidar_beams: Literal[64, 32, 16] = 64
    max_points_per_voxel: int = 32
    max_voxels: int = 32000
    image_size: Tuple[int, int] = (128, 160)
    use_depth: bool = False

    def __post_init__(self):
        for name in ("max_points_per_voxel", "max_voxels"):
            if getattr(self, name) < 1:
                raise FieldError(f"{name} must be >= 1 (a voxel holds at least one point, a scan at least one "
                                 f"voxel), got {getattr(self, name)!r}", name)


@dataclass
class DataConfig:
    """The ``data:`` section of an experiment.

    modality: assignment of agent types: "in_order", a JSON path (relative to
        ``root``), "all:<type>" (every agent is that type: stage-1 training) or
        "cycle:<t1>,<t2>" (t1, t2, t1, ... over the sorted agents).
    agent_types: the alliance; agents of other types are left out.
    ego_types: ``protocol: reference`` only: the types an ego may have (the reference's
        ``heter.ego_modality``): where the data assigns types, a sample's ego is the first agent
        of such a type in the reference's order (:mod:`~opencood_ext.data.reference`), in training
        and evaluation. None (default): the alliance's types minus the experiment's
        ``stage.new_types`` (a stage-2 alliance's old types, the reference's stage-2 ego), else
        every alliance type. Under ``native`` / ``equalized`` the ego is the first agent.
    type_mapping: the type each agent runs as, by the type the assignment (``modality``: a JSON
        path or "in_order") names: ``{m1: m1, m2: m1, m3: m3, m4: m3}`` runs m2 agents on m1's
        stack (the reference's ``heter.mapping_dict``). Every assigned type must be a key (the
        reader refuses a frame's other types, naming the assignment file, scenario and agent);
        agents mapped outside ``agent_types`` are left out. Under ``protocol: reference`` the
        ego test of a scenario's first agent reads its type BEFORE the mapping, as the
        reference's does (:mod:`~opencood_ext.data.reference`). None: the assigned types as they are.
    lidar_range: (xmin, ymin, zmin, xmax, ymax, zmax) of the ego's detection area.
    classes: object types kept as one class (single-class detection).
    reader_options: extra reader arguments, e.g. ``{mode: vc}`` for V2X-Real or
        ``{hetero_root: ...}`` for OPV2V-H.
    class_groups: multi-class detection instead: ``{class_name: [object types]}``;
        the class index is the group's position (V2X-Real's super-classes).
    collaborator_frame: where a LiDAR collaborator encodes its scan. "own" (the
        field's intermediate fusion): in its own sensor frame; the receiver warps
        the BEV feature to the ego grid. "ego": the collaborator first moves its
        points into the ego frame, so its feature already lies on the ego grid and
        nothing is resampled (needs the receiver's pose at the sender; used to
        measure what warping a feature map costs, see README).
    skip_bad_frames: log and leave out each frame whose files are bad (once), instead of failing.
    strict: data faults (an agent's yaml or point cloud missing inside its recording span,
        a timestamp only some agents have, NaN/inf points; ``opencood_ext.data.faults``)
        are errors naming the file instead of warnings: the dataset refuses a split with
        layout faults, or with ``skip_bad_frames`` leaves out the frames they concern.
        Default False: warned about by file (DataFaultWarning and a logged WARNING), the
        affected agent or points left out; agents entering or leaving a scenario are not faults.
    cache_dir: None (default) parses the source files every epoch; a folder keeps
        each decoded point cloud and yaml's labels there as numpy arrays, checked
        against the source's modification time and size, so later epochs read no
        text (``opencood_ext.data.formats.decode_cache``).
    shuffle_points: permute each LiDAR scan before voxelising, as the reference's ``shuffle_points``
        (GenComm / HEAL ``pcd_utils.py``; it decides the points a voxel past ``max_points_per_voxel``
        keeps and, past ``max_voxels``, the voxels kept). Seeded by (dataset seed, frame index,
        agent id) and, in training, torch's RNG, so an evaluation repeats; the reference's is unseeded.
        Default None: the protocol's rule, on under ``protocol: reference`` (the reference shuffles
        every scan; its file order is farther from any reference run than two runs are from each
        other, docs/protocol.md "point order"), off otherwise (the file's order); true / false win.
    """

    def class_table(self) -> Dict[str, int]:
        """Object type -> class index."""
        if self.class_groups:
            return {t: k for k, types in enumerate(self.class_groups.values()) for t in types}
        return {t: 0 for t in self.classes}

    format: Literal["opv2v", "dairv2x", "v2xreal"] = "opv2v"
    root: str = "data/sim"
    train_split: str = "train"
    val_split: str = "validate"
    test_split: str = "test"
    modality: str = "in_order"
    agent_types: Dict[str, AgentTypeData] = field(default_factory=lambda: {"m1": AgentTypeData()})
    ego_types: Optional[List[str]] = None
    type_mapping: Optional[Dict[str, str]] = None
    lidar_range: Tuple[float, float, float, float, float, float] = (-51.2, -51.2, -3.0, 51.2, 51.2, 1.0)
    comm_range: float = 70.0
    max_agents: int = 5
    classes: List[str] = field(default_factory=lambda: list(VEHICLE_CLASSES))
    class_groups: Optional[Dict[str, List[str]]] = None
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    random_ego: bool = False
    skip_bad_frames: bool = False
    strict: bool = False
    max_frames: Optional[int] = None
    reader_options: Dict[str, Any] = field(default_factory=dict)
    collaborator_frame: Literal["own", "ego"] = "own"
    cache_dir: Optional[str] = None
    shuffle_points: Optional[bool] = None

    def __post_init__(self):
        inverted = [axis for axis, lo, hi in zip("xyz", self.lidar_range[:3], self.lidar_range[3:]) if not hi > lo]
        if inverted:
            raise FieldError(f"lidar_range is (xmin, ymin, zmin, xmax, ymax, zmax) with each max > min; got "
                             f"{list(self.lidar_range)} (max <= min on {', '.join(inverted)})", "lidar_range")
        if not self.comm_range > 0:  # also refuses NaN
            raise ValueError(f"DataConfig.comm_range must be > 0 metres (collaborators farther from the ego "
                             f"are left out), got {self.comm_range!r}")
        if self.max_agents < 1:
            raise ValueError(f"DataConfig.max_agents must be >= 1 (it counts the ego; 1 = the ego alone), "
                             f"got {self.max_agents!r}")
        if self.ego_types is not None and (not self.ego_types or not set(self.ego_types) <= set(self.agent_types)):
            raise ValueError(f"DataConfig.ego_types must name one or more of data.agent_types "
                             f"{sorted(self.agent_types)}, got {self.ego_types!r}")
        if self.type_mapping is not None:
            self._check_type_mapping()

    def _check_type_mapping(self):
        mapping = self.type_mapping
        if not mapping or not all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in mapping.items()):
            raise FieldError(f"data.type_mapping must map each assigned type to the type it runs as "
                             f"({{m2: m1, ...}}), got {mapping!r}", "type_mapping")
        if self.format != "opv2v" or self.modality.startswith(("all:", "cycle:")):
            raise FieldError(f"data.type_mapping maps the types of an OPV2V-format assignment (data.modality a "
                             f"JSON path or 'in_order'); with format {self.format!r} and modality {self.modality!r} "
                             f"there is none to map: remove it", "type_mapping", "modality")
        if not set(mapping.values()) & set(self.agent_types):
            raise FieldError(f"data.type_mapping {mapping} maps every type outside data.agent_types "
                             f"{sorted(self.agent_types)}: every agent would be left out", "type_mapping", "agent_types")


def type_override(modality: str) -> Optional[List[str]]:
    """Types forced on agents by ``modality``, cycled over the sorted agents, or None.

    "all:m1" -> ["m1"] (every agent is m1: stage-1 training); "cycle:m1,m3" ->
    ["m1", "m3"] (m1, m3, m1, ... by sorted id). Anything else is left to the reader.
    """
    for prefix in ("all:", "cycle:"):
        if modality.startswith(prefix):
            types = [t.strip() for t in modality[len(prefix):].split(",") if t.strip()]
            if not types or (prefix == "all:" and len(types) != 1):
                raise ValueError(f"data.modality {modality!r}: expected 'all:<type>' or 'cycle:<t1>,<t2>,...'")
            return types
    return None
