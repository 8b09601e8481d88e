"""The protocols: whose computation a model runs (the experiment's top-level ``protocol:``, passed to
:class:`~opencood_ext.models.detector.CooperativeDetector`; docs/protocol.md).

"native" is this project's own computation, "reference" the GenComm reference / HEAL code's, and
"equalized" native's computation with one more rule: every fusion method, no fusion and late fusion
included, has the same block between fusion and the 1x1 head (:data:`EQUALIZED_POST_FUSION_LAYERS`),
so no method is compared with more or fewer layers after the warp than another.

A module of its own, importing nothing of the project: the config loader, the data readers, the
model and the experiment driver all name the protocols without importing the detector (and torch).
"""
from __future__ import annotations

from typing import Literal, Optional

PROTOCOLS = ("native", "reference", "equalized")
Protocol = Literal["native", "reference", "equalized"]
Computation = Literal["native", "reference"]
EQUALIZED_POST_FUSION_LAYERS = 2  # two 3x3 conv-BN-ReLU layers: the README's measured post-fusion block


def computation_of(protocol: str) -> Computation:
    """The computation a protocol's encoders, links, data and post-processing follow: the reference
    code's under "reference", this project's own under "native" and "equalized"."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {list(PROTOCOLS)}, got {protocol!r}")
    return "reference" if protocol == "reference" else "native"


def post_fusion_layers_of(protocol: str, given: Optional[int]) -> int:
    """``model.post_fusion_layers`` under ``protocol``: unset -> the protocol's (equalized: the shared
    block, else 0); under equalized any other count is refused, so every run of an equalized
    comparison has the same layers after fusion."""
    if protocol == "equalized":
        if given is not None and int(given) != EQUALIZED_POST_FUSION_LAYERS:
            raise ValueError(f"model.post_fusion_layers: protocol equalized gives every method the same "
                             f"{EQUALIZED_POST_FUSION_LAYERS} layers after fusion, got {given} (remove the key, "
                             f"or use protocol native to try another count)")
        return EQUALIZED_POST_FUSION_LAYERS
    return 0 if given is None else int(given)
