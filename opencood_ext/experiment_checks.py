"""What an experiment's closed choices and sizes may be, checked when the config loads (rather than
when a model is built or a message first sent), each as a :class:`~opencood_ext.config.FieldError` at
the key at fault, so the loader names the file that set it: :func:`check_choices`, which
:class:`~opencood_ext.experiment.ExperimentConfig` calls after its own checks."""
from __future__ import annotations

import difflib
import inspect
import re
import typing
from typing import Optional, Sequence

from .config import FieldError
from .models import check_args
from .models.detector import CooperativeDetector
from .models.fusion_methods import FUSION_METHODS
from .protocol import PROTOCOLS

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


_MODALITY_PREFIX = re.compile(r"([A-Za-z_][\w-]*):")  # "all:", "cycle:", or a misspelling of one


def _check_modality_form(modality: str) -> None:
    """``data.modality`` is 'in_order', 'all:<type>', 'cycle:<t1>,<t2>' or the path of an assignment
    file; a word and a colon that is neither prefix (``al:m1``) is a misspelt prefix, not a path (it
    would otherwise be looked for as a file under data.root)."""
    found = _MODALITY_PREFIX.match(modality)
    if found and found.group(1) not in ("all", "cycle"):
        close = difflib.get_close_matches(found.group(1), ["all", "cycle"], n=1, cutoff=0.3)
        hint = f" (did you mean '{close[0]}:'?)" if close else ""
        raise FieldError(f"data.modality {modality!r}: expected 'in_order', 'all:<type>', 'cycle:<t1>,<t2>,...' or "
                         f"the path of a modality assignment file (.json); {found.group(1)!r} is no prefix{hint}",
                         ("data", "modality"))


def check_choices(cfg) -> None:
    """Every closed choice of an experiment checked against what the code can run, when it is
    loaded (rather than when a model is built or a message first sent):

    * ``train.lr`` > 0; ``data.classes`` (or every ``data.class_groups`` group) not empty;
    * every type ``data.modality`` names (``all:``/``cycle:``) is in ``data.agent_types``; agents of
      other types would be left out silently. Only ``model.fusion: none`` (no collaborator takes
      part) may name others (configs/sim/m1_none.yaml: the m1 ego of the m1+m3 world);
    * a model (``model.agent_types`` given) names its ``fusion`` (no default); a method that sends
      over a link (intermediate) names its ``link``; fusion method, fusion op, link and encoder types
      are registered; the link's arguments are its own, and closed choices among them (``wire_dtype``)
      hold an allowed value; layer widths, strides and counts are not negative;
    * each stack's voxel grid, backbone levels and the anchors fit (:func:`check_geometry`).
    """
    from .data.data_config import type_override
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
    _check_modality_form(cfg.data.modality)
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
    check_geometry(model, cfg.data.lidar_range)
    sent = model.get("max_boxes", inspect.signature(CooperativeDetector).parameters["max_boxes"].default)
    if isinstance(sent, int) and sent > cfg.receiver.max_boxes:  # any model can run late fusion (--fusion_method)
        raise FieldError(f"model.max_boxes {sent} exceeds receiver.max_boxes {cfg.receiver.max_boxes}: under late "
                         f"fusion every message of this model's senders would be rejected; raise receiver.max_boxes",
                         ("model", "max_boxes"), ("receiver", "max_boxes"))


def _arguments(cls, spec: dict) -> dict:
    """The constructor arguments a component spec gives ``cls``: its defaults, then the spec's own."""
    args = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}
    args.update((k, v) for k, v in spec.items() if k != "type")
    return args


def _odd_level_list(args: dict, spec: dict, levels: Sequence[str]) -> str:
    """The per-level list at fault: the first the spec sets whose length is not the most common one
    (an empty ``layer_nums`` itself, when that is the fault)."""
    lengths = [len(args[k]) for k in levels]
    common = max(set(lengths), key=lambda n: (lengths.count(n), n))
    odd = [k for k, n in zip(levels, lengths) if n != common and k in spec]
    return odd[0] if odd and lengths[0] else "layer_nums"


def check_geometry(model: dict, lidar_range: Sequence[float]) -> None:
    """What the model's constructors would refuse, checked on the spec alone: a voxel encoder's
    ``voxel_size`` divides ``data.lidar_range`` (whose max > min on each axis the data section checks)
    into whole voxels; a multi-scale backbone has one entry per level in each per-level list; the
    anchors (``model.anchors``) are positive (l, w, h) triples with at least one rotation. FieldError at
    the key at fault."""
    from .data.voxelize import grid_shape
    from .models import BACKBONES, AnchorGenerator
    from .models.anchors import check_anchors
    from .models.backbone import check_levels

    for t, stack in model["agent_types"].items():
        key = ("model", "agent_types", str(t))
        encoder = stack.get("encoder")
        if isinstance(encoder, dict) and encoder.get("voxel_size") is not None:
            try:
                grid_shape(lidar_range, encoder["voxel_size"])
            except (TypeError, ValueError) as exc:
                raise FieldError(f"{'.'.join(key)}.encoder.voxel_size: {exc}", key + ("encoder", "voxel_size"),
                                 ("data", "lidar_range")) from None
        backbone = stack.get("backbone")
        if not isinstance(backbone, dict):
            continue
        try:
            cls = BACKBONES.get_class(backbone.get("type", "resnet_bev"), f"{'.'.join(key)}.backbone.type")
        except ValueError as exc:
            raise FieldError(str(exc), key + ("backbone", "type")) from None
        args = _arguments(cls, backbone)
        levels = ("layer_nums", "layer_strides", "num_filters", "upsample_strides", "num_upsample_filters")
        if all(isinstance(args.get(k), (list, tuple)) for k in levels):
            try:
                check_levels(*(args[k] for k in levels))
            except ValueError as exc:
                raise FieldError(str(exc), key + ("backbone", _odd_level_list(args, backbone, levels))) from None
    anchors = model.get("anchors") or {}
    if isinstance(anchors, dict):
        args = _arguments(AnchorGenerator, anchors)
        try:
            check_anchors(args.get("sizes"), args.get("rotations"))
        except ValueError as exc:
            try:  # the sizes alone
                check_anchors(args.get("sizes"), [0.0])
                bad = "rotations"
            except ValueError:
                bad = "sizes"
            raise FieldError(f"model.anchors.{bad}: {exc}", ("model", "anchors", bad)) from None
