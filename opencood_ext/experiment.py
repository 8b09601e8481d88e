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
import inspect
import logging
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Literal, Optional, Sequence

from opencood_ext.comm.receiver import ReceiverConfig
from opencood_ext.config import ConfigError, FieldError, check_plain_name, config_to_dict, load_config
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import CooperativeDataset, DataConfig
from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.formats import get_reader
from opencood_ext import methods  # noqa: F401  (registers the heterogeneous baselines' links)
from opencood_ext.models import build, check_args, voxel_sizes
from opencood_ext.models.fusion_methods import FUSION_METHODS, FusionMethod

from .models.detector import CooperativeDetector
from .protocol import PROTOCOLS, Protocol, computation_of
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
        check_choices(self)


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


_LINK_DERIVED = ("channels", "agent_types", "lidar_range")  # what CooperativeDetector passes every link
_WIDTH_KEY = re.compile(r"(^|_)(filters|channels|channel_mult|voxel_size)$")  # layer widths, voxel sizes: > 0
_STRIDE_KEY = re.compile(r"(^|_)strides$")  # > 0 (an upsample stride may be a fraction)
_COUNT_KEY = re.compile(r"^(layer_nums|blocks|num_res_blocks)$")  # layers per level: >= 0


def _literal_choices(tp) -> Optional[tuple]:
    """The allowed values of a ``Literal[...]`` (or ``Optional[Literal[...]]``) annotation, else None."""
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(inner) == 1 and typing.get_origin(inner[0]) is typing.Literal:
            return typing.get_args(inner[0]) + (None,)
    return None


def _check_spec(spec, registry, key: tuple, derived: Sequence[str] = (), default_type: Optional[str] = None,
                all_args: bool = True) -> type:
    """A component spec ``{type: name, **args}`` checked without building it: the type is registered,
    (``all_args``) every argument is one the class takes and none is derived, and every argument
    its constructor annotates with ``Literal`` (a closed choice, e.g. ``wire_dtype``) holds one of the
    choices. -> the class. FieldError at ``key`` otherwise."""
    where = ".".join(key)
    if not isinstance(spec, dict):
        raise FieldError(f"{where}: expected a mapping with a 'type' key, got {spec!r}", key)
    name = spec.get("type", default_type)
    if not isinstance(name, str):
        raise FieldError(f"{where}: 'type' must name one of {sorted(registry)}, got {name!r}", key + ("type",))
    try:
        cls = registry.get_class(name, f"{where}.type")
    except ValueError as exc:
        raise FieldError(str(exc), key + ("type",)) from None
    params = inspect.signature(cls.__init__).parameters
    try:
        hints = typing.get_type_hints(cls.__init__)
    except (NameError, TypeError, AttributeError):  # an annotation that names a TYPE_CHECKING-only import
        hints = {}
    for arg, value in spec.items():
        if arg == "type":
            continue
        if all_args and (arg in derived or arg not in params or arg == "self"):
            valid = sorted(k for k in params if k != "self" and k not in derived)
            raise FieldError(f"{where}.{arg}: not an argument of {name!r} (derived from the rest of the model, or "
                             f"unknown); valid keys are {valid}", key + (arg,))
        choices = _literal_choices(hints.get(arg))
        if choices is not None and value not in choices:
            raise FieldError(f"{where}.{arg}: {name!r} takes one of {[c for c in choices]}, got {value!r}",
                             key + (arg,))
    return cls


def _check_sizes(node, key: tuple) -> None:
    """Layer widths, strides and layer counts anywhere in the model section: a negative (or, for a
    width or stride, zero) size would fail deep inside torch while the model is built."""
    if isinstance(node, dict):
        for k, v in node.items():
            name = str(k)
            rule = (">= 0" if _COUNT_KEY.search(name) else "> 0" if _WIDTH_KEY.search(name) or
                    _STRIDE_KEY.search(name) else None)
            if rule is not None:
                values = [] if v is None else v if isinstance(v, (list, tuple)) else [v]  # None: the default
                ok = all(isinstance(x, (int, float)) and not isinstance(x, bool)
                         and (x >= 0 if rule == ">= 0" else x > 0) for x in values)
                if values and not ok:
                    raise FieldError(f"{'.'.join(key + (name,))}: sizes must be numbers {rule}, got {v!r}",
                                     key + (name,))
            else:
                _check_sizes(v, key + (name,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_sizes(v, key + (str(i),))


def check_choices(cfg: "ExperimentConfig") -> None:
    """Every closed choice of an experiment checked against what the code can run, when it is
    loaded (rather than when a model is built or a message first sent):

    * ``train.lr`` > 0; ``data.classes`` (or every ``data.class_groups`` group) not empty;
    * every type ``data.modality`` names (``all:``/``cycle:``) is in ``data.agent_types``; agents of
      other types would be left out silently. Only ``model.fusion: none`` (no collaborator takes
      part) may name others (configs/sim/m1_none.yaml: the m1 ego of the m1+m3 world);
    * a model (``model.agent_types`` given) names its ``fusion`` (no default); a method that sends
      over a link (intermediate) names its ``link``; fusion method, fusion op, link and encoder types
      are registered; the link's arguments are its own, and closed choices among them (``wire_dtype``)
      hold an allowed value; layer widths, strides and counts are not negative.
    """
    from .data.dataset import type_override
    from .models import ENCODERS
    from .models.detector import FUSION_OPS
    from .models.links import LINKS

    if not cfg.train.lr > 0:
        raise FieldError(f"train.lr must be > 0 (0 never moves the weights), got {cfg.train.lr!r}", ("train", "lr"))
    if cfg.data.class_groups:
        for group, members in cfg.data.class_groups.items():
            if not members:
                raise FieldError(f"data.class_groups.{group} is empty: name the object types of the class",
                                 ("data", "class_groups", str(group)))
    elif not cfg.data.classes:
        raise FieldError("data.classes is empty: no object would be a ground-truth box (name the object types "
                         "detected, e.g. [vehicle.car])", ("data", "classes"))
    model = cfg.model
    fusion = model.get("fusion")
    try:
        forced = type_override(cfg.data.modality)
    except ValueError as exc:
        raise FieldError(str(exc), ("data", "modality")) from None
    if forced:
        outside = [t for t in forced if t not in cfg.data.agent_types]
        if len(outside) == len(forced) or (outside and not (model.get("agent_types") and fusion == "none")):
            raise FieldError(f"data.modality {cfg.data.modality!r} names {outside}, not agent types of this "
                             f"experiment (data.agent_types: {sorted(cfg.data.agent_types)}): their agents would be "
                             f"left out silently; add the types (data and model agent_types) or leave them out "
                             f"of the modality", ("data", "modality"), ("data", "agent_types"))
    if not model.get("agent_types"):
        return  # no model described (a data-only experiment); building one says what is missing
    if not isinstance(model["agent_types"], dict):
        raise FieldError(f"model.agent_types must map type names to encoder stacks, got {model['agent_types']!r}",
                         ("model", "agent_types"))
    if "protocol" in model:
        raise FieldError(f"model.protocol: the protocol is the experiment's top-level key (protocol: "
                         f"{' | '.join(PROTOCOLS)}), which the model is built with", ("model", "protocol"))
    for key in model:  # a misspelt key first: "link is required" would hide the 'lnk' that meant it
        try:
            check_args(CooperativeDetector, "cooperative", {} if key == "type" else {key: model[key]}, "model")
        except ValueError as exc:
            raise FieldError(str(exc), ("model", str(key))) from None
    if fusion is None:
        raise FieldError(f"model.fusion is required (no default): one of {sorted(FUSION_METHODS)}",
                         ("model", "fusion"))
    if not isinstance(fusion, str) or not isinstance(model.get("fusion_op", ""), str):
        bad = "fusion" if not isinstance(fusion, str) else "fusion_op"
        raise FieldError(f"model.{bad} must be a name, got {model[bad]!r}", ("model", bad))
    try:
        method = FUSION_METHODS.get_class(fusion, "model.fusion")
    except ValueError as exc:
        raise FieldError(str(exc), ("model", "fusion")) from None
    if "fusion_op" in model:
        try:
            FUSION_OPS.get_class(model["fusion_op"], "model.fusion_op")
        except ValueError as exc:
            raise FieldError(str(exc), ("model", "fusion_op")) from None
    if method.needs_link:
        if model.get("link") is None:
            raise FieldError(f"model.link is required with model.fusion: {fusion} (no default): what collaborators "
                             f"send, e.g. {{type: full_feature, wire_dtype: float32}}; links: {sorted(LINKS)}",
                             ("model", "link"))
        _check_spec(model["link"], LINKS, ("model", "link"), _LINK_DERIVED)
    for t, stack in model["agent_types"].items():
        key = ("model", "agent_types", str(t))
        if not isinstance(stack, dict):
            raise FieldError(f"{'.'.join(key)}: expected an encoder stack mapping, got {stack!r}", key)
        _check_spec(stack.get("encoder"), ENCODERS, key + ("encoder",), all_args=False)
    _check_sizes(model, ("model",))
    sent = model.get("max_boxes", inspect.signature(CooperativeDetector).parameters["max_boxes"].default)
    if isinstance(sent, int) and sent > cfg.receiver.max_boxes:  # any model can run late fusion (--fusion_method)
        raise FieldError(f"model.max_boxes {sent} exceeds receiver.max_boxes {cfg.receiver.max_boxes}: under late "
                         f"fusion every message of this model's senders would be rejected; raise receiver.max_boxes",
                         ("model", "max_boxes"), ("receiver", "max_boxes"))


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
    try:
        reader = get_reader(data.format, data.root, split, **kw)
    except TypeError as exc:
        raise ConfigError(f"experiment '{cfg.name}': data.reader_options: {exc}") from None
    try:
        sizes = voxel_sizes(cfg.model)
        return CooperativeDataset(reader, data, sizes, train=train, cooperation=method.dataset_agents(train),
                                  seed=cfg.train.seed, latency_frames=latency_frames,
                                  protocol=computation_of(cfg.protocol))
    except DataFormatError:
        raise
    except ValueError as exc:  # the data section does not fit the model (e.g. a LiDAR type without encoder)
        raise ConfigError(f"experiment '{cfg.name}': {exc}") from None


collate = collate_samples
