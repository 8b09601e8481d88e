"""Where shipped configs live and how a config is found by name.

``resolve_config("opv2v_h/gencomm_stage1_m1")`` works from any directory: a path that exists
(relative to the working directory or absolute) is used as given; otherwise the name is looked up
under :func:`configs_root`, with ``.yaml`` added when missing and a leading ``configs/`` dropped
(so the README's ``configs/sim/m1_none.yaml`` also works outside a checkout).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "gencomm_configs"  # setup.py ships the checkout's configs/ as this package's data


def configs_root() -> Path:
    """The shipped configs folder: ``configs/`` of the source checkout when this module runs from
    one (so an edited config takes effect without reinstalling), else the installed package data."""
    checkout = Path(__file__).resolve().parents[1] / "configs"
    if checkout.is_dir():
        return checkout
    spec = importlib.util.find_spec(PACKAGE)  # a folder without __init__.py: a namespace package
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise FileNotFoundError(f"no shipped configs: neither {checkout} nor an installed "
                                f"{PACKAGE} package (reinstall with pip install .)")
    return Path(locations[0])


def resolve_config(name) -> Path:
    """A config file given as a path or as a shipped config's name (see the module docstring).
    Raises FileNotFoundError naming both places it looked."""
    path = Path(name)
    if path.is_file():
        return path
    if path.is_absolute():
        raise FileNotFoundError(f"config file not found: {name}")
    rel = Path(*path.parts[1:]) if path.parts[:1] == ("configs",) else path
    root = configs_root()
    for cand in (root / rel, root / rel.with_name(rel.name + ".yaml")):
        if cand.is_file():
            return cand
    raise FileNotFoundError(f"config file not found: {name} (not a file, and no {rel} under the "
                            f"shipped configs {root})")
