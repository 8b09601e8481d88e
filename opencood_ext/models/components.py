"""The encoder-stack components' registries and :func:`build`, which turns a spec dict
``{"type": name, **constructor_args}`` into a module after checking the keys against the
constructor signature (a typo gets the closest valid key in the error).

Its own module so that :mod:`.encoder_stack` (which builds its parts from these registries) and
the package ``__init__`` (which re-exports them) import it without importing each other.
"""
from __future__ import annotations

import difflib
import inspect
from typing import Any, Dict, Mapping, Optional

from ..registry import Registry
from .aligner import ConvNeXtAligner
from .backbone import BaseBEVBackbone, DownsampleConv, IdentityBackbone, ResNetBEVBackbone, ShrinkConv
from .lss import LSSEncoder
from .lss_reference import ReferenceLSSEncoder
from .pointpillars import PointPillarEncoder
from .pyramid_fusion import NoShrink
from .second import SecondEncoder


def _close(word: str, choices) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


def check_args(cls: type, name: str, args: Mapping[str, Any], where: str,
               derived: Mapping[str, Any] = {}) -> Dict[str, inspect.Parameter]:
    """Raise ValueError for a key of ``args`` that ``cls`` (registered as ``name``) does not take, or that
    the caller derives (``derived``); the closest valid key is named. Returns the constructor's parameters."""
    params = {k: p for k, p in inspect.signature(cls.__init__).parameters.items()
              if k != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    for key in args:
        if key in derived:
            raise ValueError(f"{where}.{key}: is derived from the rest of the model (here {derived[key]!r}); "
                             f"remove it from the config")
        if key not in params:
            raise ValueError(f"{where}.{key}: not an argument of '{name}'{_close(key, params)}; "
                             f"valid keys are {sorted(k for k in params if k not in derived)}")
    return params


def build(spec: Mapping[str, Any], registry: Mapping[str, type], where: str,
          default_type: Optional[str] = None, **derived):
    """Instantiate ``registry[spec["type"]](**args)``.

    spec: ``{"type": name, **args}``; ``type`` may be omitted when ``default_type`` is given.
    where: config location for error messages, e.g. ``"configs/x.yaml: model.encoders.m1"``.
    derived: arguments computed by the caller (``in_channels``, ``lidar_range``); the
        spec may not set them, since the yaml never repeats a derivable number.
    """
    if not isinstance(spec, Mapping):
        raise TypeError(f"{where}: expected a mapping with a 'type' key, got {type(spec).__name__}")
    name = spec.get("type", default_type)
    if name is None:
        raise ValueError(f"{where}: missing 'type'; one of {sorted(registry)}")
    if name not in registry:
        raise ValueError(f"{where}.type: unknown '{name}'{_close(str(name), registry)}; "
                         f"valid types are {sorted(registry)}")
    cls = registry[name]
    args = {k: v for k, v in spec.items() if k != "type"}
    params = check_args(cls, name, args, where, derived)
    for key in derived:
        if key not in params:
            raise TypeError(f"{where}: '{name}' does not take the derived argument '{key}'")
    missing = [k for k, p in params.items()
               if p.default is inspect.Parameter.empty and k not in args and k not in derived]
    if missing:
        raise ValueError(f"{where}: '{name}' needs {missing}")
    return cls(**args, **derived)


ENCODERS = Registry("encoder", "per-type sensor encoders (model.agent_types.<t>.encoder.type)", {
    "pointpillars": PointPillarEncoder,
    "second": SecondEncoder,
    "lss": LSSEncoder,
    "lss_reference": ReferenceLSSEncoder,
})
BACKBONES = Registry("backbone", "BEV backbones (model.agent_types.<t>.backbone.type)", {
    "resnet_bev": ResNetBEVBackbone,
    "base_bev": BaseBEVBackbone,
    "identity": IdentityBackbone,  # no backbone (the reference's backbone_args: identity)
})
SHRINKS = Registry("shrink", "shrink headers after the BEV backbone (model.agent_types.<t>.shrink.type)", {
    "conv_bn": ShrinkConv,
    "downsample_conv": DownsampleConv,
    "none": NoShrink,
})
ALIGNERS = Registry("aligner", "per-type feature aligners after the shrink header (model.agent_types.<t>.aligner.type)", {
    "convnext": ConvNeXtAligner,
})
