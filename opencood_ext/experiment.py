"""The experiment schema and the builders that turn it into model and datasets.

An experiment yaml has these sections (each a typed dataclass, see
:mod:`opencood_ext.config` for loading rules)::

    name: sim_m1_pointpillars
    protocol: native  # or reference, equalized: whose computation model and evaluation follow (PROTOCOLS)
    data:  {...}      # opencood_ext.data.dataset.DataConfig
    model: {...}      # opencood_ext.models.detector.CooperativeDetector constructor arguments
    train: {...}      # opencood_ext.training.trainer.TrainConfig
    eval:  {...}      # EvalConfig below
    stage: {...}      # StageConfig below (stage-2 onboarding only)
    receiver: {...}   # opencood_ext.comm.receiver.ReceiverConfig: what a receiver accepts, the alliance key

To add a section, add a field here.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from opencood_ext.comm.receiver import ReceiverConfig
from opencood_ext.config import ConfigError, FieldError, check_plain_name, config_error, config_to_dict, load_config
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import CooperativeDataset, DataConfig
from opencood_ext.data.ego_type_input import check_ego_type_inputs
from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.formats import get_reader
from opencood_ext import methods  # noqa: F401  (registers the heterogeneous baselines' links)
from opencood_ext.models import build, voxel_sizes
from opencood_ext.models.fusion_methods import FUSION_METHODS, FusionMethod
from opencood_ext.models.links import LINKS

from .experiment_checks import check_choices
from .models.detector import CooperativeDetector
from .protocol import Protocol, computation_of
from .training.trainer import TrainConfig

log = logging.getLogger(__name__)


@dataclass
class EvalConfig:
    """Evaluation settings. plot_every: write a BEV image every N frames (0 = never). range: [X, Y],
    the evaluated detection area x in [-X, X], y in [-Y, Y] metres (``gencomm-infer --range`` overrides
    it); None: the protocol's (the reference script's default under ``reference``, else
    ``data.lidar_range``; :func:`~opencood_ext.eval.detection_range.evaluation_range`)."""

    split: str = "test"
    plot_every: int = 20
    max_frames: Optional[int] = None
    range: Optional[List[float]] = None

    def __post_init__(self):
        if self.range is not None:
            from .eval.detection_range import parse_range
            try:
                parse_range(",".join(str(v) for v in self.range) if isinstance(self.range, (list, tuple)) else "")
            except ValueError:
                raise ValueError(f"eval.range: expected [X, Y], two positive numbers of metres, got {self.range!r}") \
                    from None
            self.range = [float(v) for v in self.range]


@dataclass
class StageConfig:
    """Stage-2 onboarding: which types are new, and the onboarding method that trains them
    (a name in :data:`opencood_ext.training.onboarding.ONBOARDING`: what trains for a new type)."""

    new_types: List[str] = field(default_factory=list)
    method: str = "gencomm"


# ``protocol:`` values. "native": this project's own computation, what every archived sim run used
# (GenComm warps the message before generating, the ego keeps its own feature, fusion masks cells
# outside a collaborator's coverage, rotated-IoU anchor targets, our post-processing and ground-truth
# rules). "reference": exactly the GenComm reference / HEAL code's computation, so an imported
# checkpoint gives the reference's outputs and AP (docs/protocol.md lists what remains different).
# "equalized": native's computation, and every fusion method (no fusion and late fusion too) gets the
# same block between fusion and the head, the simulator benchmark's fair comparison.
# (Defined with the model that runs them: opencood_ext.models.detector.)


@dataclass
class ExperimentConfig:
    name: str
    protocol: Protocol = "native"
    data: DataConfig = field(default_factory=DataConfig)
    model: dict = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    stage: StageConfig = field(default_factory=StageConfig)
    receiver: ReceiverConfig = field(default_factory=ReceiverConfig)

    def __post_init__(self):
        try:
            check_plain_name(self.name, "name (the run folder is named after it)")
        except ValueError as exc:
            raise FieldError(str(exc), "name") from None
        if not isinstance(self.model, dict):
            raise FieldError(f"model must be a mapping, got {self.model!r}", "model")
        model_types = set(self.model.get("agent_types") or {})
        data_types = set(self.data.agent_types)
        early = self.model.get("fusion") == "early"
        if model_types and (not model_types <= data_types if early else model_types != data_types):
            raise FieldError(f"data.agent_types {sorted(data_types)} and model.agent_types "
                             f"{sorted(model_types)} must name the same types (early fusion: the "
                             f"model's types are the egos', a subset of the data's)",
                             ("model", "agent_types"), ("data", "agent_types"))
        if self.data.ego_types is not None and self.protocol != "reference":
            raise FieldError(f"data.ego_types chooses the reference's ego (the agent of an ego type) under protocol "
                             f"reference; under {self.protocol} the ego is the first agent: remove it",
                             ("data", "ego_types"), ("protocol",))
        new = set(self.stage.new_types)
        if self.data.ego_types is not None and new & set(self.data.ego_types):
            raise FieldError(f"data.ego_types {self.data.ego_types} names stage.new_types {sorted(new)}: a stage-2 "
                             f"ego is of the alliance's old types", ("data", "ego_types"), ("stage", "new_types"))
        check_choices(self)  # the closed choices and sizes (experiment_checks.py)


def reference_ego_types(cfg: "ExperimentConfig") -> Optional[List[str]]:
    """The types a sample's ego may have under ``protocol: reference`` (``data.ego_types``; unset: the
    alliance's types less ``stage.new_types``, the reference's stage-2 ``ego_modality``); None: any
    alliance type (and under the other protocols, whose ego is the first agent)."""
    if cfg.protocol != "reference":
        return None
    if cfg.data.ego_types is not None:
        return list(cfg.data.ego_types)
    old = [t for t in cfg.data.agent_types if t not in cfg.stage.new_types]
    return old if cfg.stage.new_types and old else None


def load_experiment(path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    return load_config(path, ExperimentConfig, overrides)


def join_types(ego: ExperimentConfig, others: Dict[str, ExperimentConfig]) -> dict:
    """The ego's experiment as a plain dict with the agent types of ``others`` ({type: the experiment
    of a run that holds it}) added to ``data`` and ``model``, assigned ego, then each new type in
    turn, over the sorted agents: the alliance of separately trained runs."""
    d = copy.deepcopy(config_to_dict(ego))
    ego_types = list(d["model"].get("agent_types", {}))
    for t, cfg in others.items():
        nd = config_to_dict(cfg)
        d["data"]["agent_types"][t] = nd["data"]["agent_types"][t]
        d["model"]["agent_types"][t] = nd["model"]["agent_types"][t]
    d["data"]["modality"] = "cycle:" + ",".join([*ego_types, *others])
    return d


def build_model(cfg: ExperimentConfig) -> CooperativeDetector:
    """The ``model:`` section built through the registry; the detection area and the voxel caps
    of each LiDAR type (where the receiver voxelises) are derived from ``data:``, the computation
    it follows from the top-level ``protocol:``."""
    caps = {t: (s.max_points_per_voxel, s.max_voxels) for t, s in cfg.data.agent_types.items()
            if s.sensor == "lidar"}
    try:
        model = build(cfg.model, {"cooperative": CooperativeDetector}, "model", default_type="cooperative",
                      lidar_range=list(cfg.data.lidar_range), voxel_caps=caps, protocol=cfg.protocol)
        model.receiver = cfg.receiver  # loads the alliance key it names
        return model
    except (ValueError, TypeError, KeyError) as exc:
        raise config_error(cfg, ("model",), exc) from None


def fusion_method(cfg: ExperimentConfig, name: Optional[str] = None) -> FusionMethod:
    """The registered fusion method ``name`` (default: the config's ``model.fusion``)."""
    name = name or cfg.model.get("fusion", "intermediate")
    try:
        return FUSION_METHODS.get_class(name, "model.fusion")()
    except ValueError as exc:
        if name is None:
            raise config_error(cfg, ("model", "fusion"), exc) from None
        raise ConfigError(str(exc)) from None  # a name given on the command line (--fusion_method)


def cooperation_for(fusion: str, train: bool) -> str:
    """Which agents a dataset sample holds for fusion method ``fusion``: "ego_only", "all" or "early"."""
    return FUSION_METHODS.get_class(fusion, "model.fusion")().dataset_agents(train)


def reader_kwargs(data: DataConfig) -> Dict[str, object]:
    kw: Dict[str, object] = {"skip_bad": data.skip_bad_frames, **data.reader_options}
    if data.strict:  # the reader raises its index-time faults itself, rather than warning first
        kw["strict"] = True
    if data.cache_dir is not None:
        kw["cache_dir"] = data.cache_dir
    if data.format == "opv2v":
        modality = data.modality
        if modality.startswith(("all:", "cycle:")):
            modality = "in_order"  # the dataset overrides the types
        elif modality != "in_order":
            p = Path(modality)
            modality = str(p if p.is_absolute() else Path(data.root) / p)
        kw["modality"] = modality
        if data.type_mapping:  # the reader refuses an assigned type the mapping lacks, naming file and agent
            kw["allowed_types"] = list(data.type_mapping)
        specs = data.agent_types.values()
        kw["load_cameras"] = any(s.sensor == "camera" for s in specs)
        kw["load_depth"] = any(s.sensor == "camera" and s.use_depth for s in specs)
        kw["load_beams"] = any(s.sensor == "lidar" and s.lidar_beams != 64 for s in specs)
    return kw


def build_dataset(cfg: ExperimentConfig, split: str, train: bool, fusion: Optional[str] = None,
                  latency_frames: int = 0) -> CooperativeDataset:
    """Dataset of ``split`` for the config's model (or for fusion method ``fusion``): which agents
    a sample holds comes from the fusion method, voxel sizes from ``model.agent_types`` (no model
    is built). A method that trains with a random ego (late fusion: each agent's detector learns
    its own view) gets ``data.random_ego`` for its training set, said in the log. The experiment's
    ``protocol`` decides whose agent selection, ground truth and point rules it follows."""
    method = fusion_method(cfg, fusion)
    data = cfg.data
    if method.random_ego_in_training and train and not data.random_ego:
        log.info("%s fusion trains with a random vehicle ego per sample (data.random_ego)", method.name)
        data = dataclasses.replace(data, random_ego=True)
    data = dataclasses.replace(data, ego_types=reference_ego_types(cfg))
    kw = reader_kwargs(data)
    if data.format == "dairv2x" and computation_of(cfg.protocol) == "reference":
        kw.setdefault("labels", "sides")  # the reference merges each side's own labels (data/reference.py)
    assignment = kw.get("modality")
    if assignment not in (None, "in_order") and Path(data.root).is_dir() and not Path(assignment).is_file():
        raise config_error(cfg, ("data", "modality"), f"no modality assignment file {assignment} (data.modality is "
                           f"'in_order', 'all:<type>', 'cycle:<t1>,<t2>,...' or a file path relative to data.root)")
    try:
        reader = get_reader(data.format, data.root, split, **kw)
    except TypeError as exc:
        raise config_error(cfg, ("data", "reader_options"), exc) from None
    views = train and method.needs_link and needs_ego_type_inputs(cfg.model.get("link"))
    if views:  # GenComm's ego-encoder target (data/ego_type_input.py): refused where agents lack the ego's sensor
        try:
            check_ego_type_inputs(data.format, computation_of(cfg.protocol))
        except ValueError as exc:
            raise config_error(cfg, ("model", "link", "generation_target"), exc) from None
    try:
        sizes = voxel_sizes(cfg.model)
        return CooperativeDataset(reader, data, sizes, train=train, cooperation=method.dataset_agents(train),
                                  seed=cfg.train.seed, latency_frames=latency_frames,
                                  protocol=computation_of(cfg.protocol), ego_type_inputs=views)
    except DataFormatError:
        raise
    except ValueError as exc:  # the data section does not fit the model (e.g. a LiDAR type without encoder)
        raise config_error(cfg, ("data",), exc) from None


def needs_ego_type_inputs(link: Optional[dict]) -> bool:
    """Whether the ``model.link`` spec ``link`` trains on each collaborator's scan as its ego type reads
    it: the link class's ``needs_ego_type_inputs(spec)`` (GenComm's ``generation_target: ego_encoder``);
    False for a link without one, or an unregistered type (the model build names that)."""
    cls = LINKS.get(str((link or {}).get("type")))
    ask = getattr(cls, "needs_ego_type_inputs", None)
    return bool(ask is not None and ask(dict(link)))


collate = collate_samples
