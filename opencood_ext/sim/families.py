"""Scene families of the built-in simulator: where the connected vehicles are, and which family a
recorded scenario belongs to.

Per scenario (``agents.layout`` of :class:`opencood_ext.sim.builtin.AgentParams`):

* ``junction`` (the default): the ego approaches a junction, the collaborators sit on its other
  arms (their bearing from its centre at least ``min_arm_angle`` from the ego's), most of them
  crossing the ego's heading;
* ``road``: the collaborators share the ego's straight street, ahead or behind it in its direction,
  oncoming, or in a platoon with it (:mod:`opencood_ext.sim.road_layout`);
* ``free``: anywhere within ``spawn_radius`` of the ego.

Per dataset (``gencomm-sim --family``), one of those or ``mixed``: scenario ``k`` is
``MIXED_CYCLE[k % 2]``, junction and road in turn, so every split of more than one scenario holds
both, in equal numbers up to one.

The family of each recorded scenario is ``scenario.layout`` in its
``<root>/<split>/<scenario>/data_protocol.yaml`` (a file neither our OPV2V reader nor the
reference loaders read); :func:`scenario_family` reads it back without touching a point cloud.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Optional

LAYOUTS = ("junction", "free", "road")   # the families of one scenario
MIXED = "mixed"
MIXED_CYCLE = ("junction", "road")
DATASET_FAMILIES = LAYOUTS + (MIXED,)   # what ``gencomm-sim --family`` accepts
PROTOCOL_FILE = "data_protocol.yaml"
_SPLITS = ("train", "validate", "test")


def check_family(family: str, option: str = "--family") -> str:
    """``family`` when it is one of :data:`DATASET_FAMILIES`, else a one-line ValueError naming ``option``."""
    if family not in DATASET_FAMILIES:
        raise ValueError(f"{option} must be one of {', '.join(DATASET_FAMILIES)}; got {family!r}")
    return family


def scenario_layouts(family: str, scenarios: int) -> Optional[List[str]]:
    """The layout of each scenario index of a dataset of ``family``: None for a single family (the
    world's ``agents.layout`` applies to all), the alternating list for ``mixed``."""
    check_family(family)
    return [MIXED_CYCLE[k % len(MIXED_CYCLE)] for k in range(scenarios)] if family == MIXED else None


def protocol_path(root, scenario: str) -> Path:
    """``<root>/<split>/<scenario>/data_protocol.yaml`` of the split that holds ``scenario``."""
    root = Path(root)
    for split in _SPLITS:
        path = root / split / scenario / PROTOCOL_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{root}: no {'|'.join(_SPLITS)}/{scenario}/{PROTOCOL_FILE} (scenario {scenario!r} "
                            f"not recorded by the built-in simulator under this root)")


def scenario_family(root, scenario: str) -> str:
    """The scene family (one of :data:`LAYOUTS`) of ``scenario`` in the dataset at ``root``, from
    its ``data_protocol.yaml``; a missing file or key, or an unknown value, raises one line naming
    the file (and the key)."""
    from opencood_ext.data.errors import DataFormatError
    from opencood_ext.data.formats.opv2v_io import load_yaml

    path = protocol_path(root, scenario)
    section = load_yaml(path).get("scenario")
    if not isinstance(section, dict) or "layout" not in section:
        raise DataFormatError(path, "missing key (recorded before scene families, or not by gencomm-sim)",
                              key="scenario.layout")
    family = section["layout"]
    if family not in LAYOUTS:
        raise DataFormatError(path, f"unknown scene family {family!r}, expected one of {LAYOUTS}",
                              key="scenario.layout")
    return family


def scenario_families(root, scenarios: Iterable[str]) -> Dict[str, str]:
    """``{scenario: family}`` for the distinct names in ``scenarios`` (e.g. the ``scenes`` of an
    evaluation's :class:`opencood_ext.eval.records.FrameRecords`, one file read per scenario)."""
    return {s: scenario_family(root, s) for s in dict.fromkeys(str(s) for s in scenarios)}
