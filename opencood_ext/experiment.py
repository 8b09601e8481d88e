"""The experiment schema and the builders that turn it into model and datasets.

An experiment yaml has these sections (each a typed dataclass, see
:mod:`opencood_ext.config` for loading rules)::

    name: sim_m1_pointpillars
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
from opencood_ext.config import ConfigError, config_to_dict, load_config
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import CooperativeDataset, DataConfig
from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.formats import get_reader
from opencood_ext import methods  # noqa: F401  (registers the heterogeneous baselines' links)
from opencood_ext.models import build, voxel_sizes
from opencood_ext.models.fusion_methods import FUSION_METHODS, FusionMethod

from .models.detector import CooperativeDetector
from .training.trainer import TrainConfig

log = logging.getLogger(__name__)


@dataclass
class EvalConfig:
    """Evaluation settings. plot_every: write a BEV image every N frames (0 = never)."""

    split: str = "test"
    plot_every: int = 20
    max_frames: Optional[int] = None


@dataclass
class StageConfig:
    """Stage-2 onboarding: which types are new, and the onboarding method that trains them
    (a name in :data:`opencood_ext.training.onboarding.ONBOARDING`: what trains for a new type)."""

    new_types: List[str] = field(default_factory=list)
    method: str = "gencomm"


@dataclass
class ExperimentConfig:
    name: str
    data: DataConfig = field(default_factory=DataConfig)
    model: dict = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    stage: StageConfig = field(default_factory=StageConfig)
    receiver: ReceiverConfig = field(default_factory=ReceiverConfig)

    def __post_init__(self):
        model_types = set(self.model.get("agent_types", {}))
        data_types = set(self.data.agent_types)
        early = self.model.get("fusion") == "early"
        if model_types and (not model_types <= data_types if early else model_types != data_types):
            raise ValueError(f"data.agent_types {sorted(data_types)} and model.agent_types "
                             f"{sorted(model_types)} must name the same types (early fusion: the "
                             f"model's types are the egos', a subset of the data's)")


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
    of each LiDAR type (where the receiver voxelises) are derived from ``data:``."""
    caps = {t: (s.max_points_per_voxel, s.max_voxels) for t, s in cfg.data.agent_types.items()
            if s.sensor == "lidar"}
    try:
        model = build(cfg.model, {"cooperative": CooperativeDetector}, "model", default_type="cooperative",
                      lidar_range=list(cfg.data.lidar_range), voxel_caps=caps)
        model.receiver = cfg.receiver  # loads the alliance key it names
        return model
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"experiment '{cfg.name}': {exc}") from None


def fusion_method(cfg: ExperimentConfig, name: Optional[str] = None) -> FusionMethod:
    """The registered fusion method ``name`` (default: the config's ``model.fusion``)."""
    name = name or cfg.model.get("fusion", "intermediate")
    try:
        return FUSION_METHODS.get_class(name, "model.fusion")()
    except ValueError as exc:
        raise ConfigError(f"experiment '{cfg.name}': {exc}") from None


def cooperation_for(fusion: str, train: bool) -> str:
    """Which agents a dataset sample holds for fusion method ``fusion``: "ego_only", "all" or "early"."""
    return FUSION_METHODS.get_class(fusion, "model.fusion")().dataset_agents(train)


def reader_kwargs(data: DataConfig) -> Dict[str, object]:
    kw: Dict[str, object] = {"skip_bad": data.skip_bad_frames, **data.reader_options}
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
    its own view) gets ``data.random_ego`` for its training set, said in the log."""
    method = fusion_method(cfg, fusion)
    data = cfg.data
    if method.random_ego_in_training and train and not data.random_ego:
        log.info("%s fusion trains with a random vehicle ego per sample (data.random_ego)", method.name)
        data = dataclasses.replace(data, random_ego=True)
    try:
        reader = get_reader(data.format, data.root, split, **reader_kwargs(data))
    except TypeError as exc:
        raise ConfigError(f"experiment '{cfg.name}': data.reader_options: {exc}") from None
    try:
        sizes = voxel_sizes(cfg.model)
        return CooperativeDataset(reader, data, sizes, train=train, cooperation=method.dataset_agents(train),
                                  seed=cfg.train.seed, latency_frames=latency_frames)
    except DataFormatError:
        raise
    except ValueError as exc:  # the data section does not fit the model (e.g. a LiDAR type without encoder)
        raise ConfigError(f"experiment '{cfg.name}': {exc}") from None


collate = collate_samples
