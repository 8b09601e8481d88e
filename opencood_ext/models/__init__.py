"""Detection model components and the config registry.

``REGISTRY`` maps config ``type`` names to classes explicitly; :func:`build` (in
:mod:`.components`, with the encoder, backbone and shrink registries) turns a spec dict
``{"type": name, **constructor_args}`` into a module after checking the keys against the
constructor signature (a typo gets the closest valid key in the error).
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, Mapping, Optional, Tuple

from ..data.inputs import CameraInput, LidarInput
from .anchors import AnchorGenerator, BoxCoder, Targets, assign_targets
from .backbone import BaseBEVBackbone, DownsampleConv, ResNetBEVBackbone, ShrinkConv
from .components import BACKBONES, ENCODERS, SHRINKS, build, check_args
from .encoder_stack import EncoderStack
from .head import AnchorHead, HeadOutput
from .inputs import EncoderOutput
from .losses import DetectionLoss, LossTerms
from .lss import LSSEncoder
from .lss_reference import ReferenceLSSEncoder
from .pointpillars import PointPillarEncoder
from .pyramid_method import PyramidFusionMethod  # noqa: F401  (registers model.fusion: pyramid)
from .second import SecondEncoder

REGISTRY: Dict[str, type] = {
    **ENCODERS,
    **BACKBONES,
    "shrink": ShrinkConv,
    "downsample_conv": DownsampleConv,
    "encoder_stack": EncoderStack,
    "anchor_head": AnchorHead,
}


def voxel_sizes(model_cfg: Mapping[str, Any]) -> Dict[str, Optional[Tuple[float, ...]]]:
    """``{type: (vx, vy, vz)}`` of every LiDAR type of a ``model:`` config (None for camera types),
    read from the config without building the model: what the data pipeline voxelises with."""
    out: Dict[str, Optional[Tuple[float, ...]]] = {}
    for t, spec in dict(model_cfg.get("agent_types") or {}).items():
        enc = dict(spec.get("encoder") or {}) if isinstance(spec, Mapping) else {}
        cls = ENCODERS.get_class(enc.get("type"), f"model.agent_types.{t}.encoder.type")
        if cls.input_kind != "lidar":
            out[t] = None
            continue
        default = inspect.signature(cls.__init__).parameters["voxel_size"].default
        out[t] = tuple(float(v) for v in enc.get("voxel_size", default))
    return out

__all__ = [
    "REGISTRY", "ENCODERS", "BACKBONES", "SHRINKS", "build", "check_args", "voxel_sizes", "AnchorGenerator", "BoxCoder",
    "Targets", "assign_targets", "ResNetBEVBackbone", "BaseBEVBackbone", "ShrinkConv", "DownsampleConv",
    "EncoderStack", "AnchorHead", "HeadOutput",
    "CameraInput", "LidarInput", "EncoderOutput", "DetectionLoss", "LossTerms", "LSSEncoder",
    "ReferenceLSSEncoder", "PointPillarEncoder", "SecondEncoder",
]
