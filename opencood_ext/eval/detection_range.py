"""``gencomm-infer --range X,Y``: the evaluated detection area, as the reference's inference script
has it (GenComm's and HEAL's ``opencood/tools/inference.py``, option ``--range``).

There, ``--range X,Y`` replaces the detection area everywhere in the config: x in [-X, X] and
y in [-Y, Y] metres, the z bounds kept. So it moves the LiDAR crop and the voxel grid, the
anchors (the model runs on the new grid), the ground-truth range and the final range mask of the
predictions alike. Here that is ``data.lidar_range``, from which model, anchors, voxelisers,
ground truth and post-processing all derive, so the option is one override of it.

Under ``protocol: reference`` the area defaults to the reference script's default (the script
applies ``--range`` to every config with a ``heter`` section, which every GenComm config has):
102.4,51.2 for OPV2V(-H) and V2XSet, DAIR-V2X and V2X-Real alike (GenComm's ``inference.py`` and
``inference_v2xreal.py``; HEAL's own script defaults to 102.4,102.4). Under ``protocol: native``
nothing changes unless ``--range`` is given.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Tuple

# data.format -> (X, Y): the reference inference scripts' --range default per dataset
REFERENCE_DEFAULT_RANGE: Dict[str, Tuple[float, float]] = {
    "opv2v": (102.4, 51.2), "dairv2x": (102.4, 51.2), "v2xreal": (102.4, 51.2)}


def parse_range(text: Optional[str]) -> Optional[Tuple[float, float]]:
    """"X,Y" (two positive numbers, metres) -> (X, Y); None passes. ValueError naming --range."""
    if text is None:
        return None
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 2 or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"--range takes X,Y: two positive numbers of metres (x in [-X, X], y in [-Y, Y]), "
                         f"got {text!r}")
    return values  # type: ignore[return-value]


def evaluation_range(protocol: str, data_format: str, lidar_range: Sequence[float],
                     given: Optional[Tuple[float, float]]) -> Optional[Tuple[float, ...]]:
    """The ``data.lidar_range`` to evaluate at: ``given`` (X, Y: ``--range``, else the config's
    ``eval.range``), else the reference's default under
    ``protocol: reference``, with the z bounds of ``lidar_range``; None when that is
    ``lidar_range`` itself (nothing to change)."""
    xy = given if given is not None else REFERENCE_DEFAULT_RANGE.get(data_format) if protocol == "reference" \
        else None
    if xy is None:
        return None
    r = [float(v) for v in lidar_range]
    new = (-float(xy[0]), -float(xy[1]), r[2], float(xy[0]), float(xy[1]), r[5])
    return None if all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(new, r)) else new


def range_override(lidar_range: Sequence[float]) -> str:
    """The ``--set`` item that gives ``data.lidar_range`` this value."""
    return "data.lidar_range=[" + ", ".join(repr(float(v)) for v in lidar_range) + "]"
