"""Stage 2: new agent types join an existing alliance, by any registered method.

Every method starts from stage-1 runs: the receiver's (ego's) homogeneous run
and one homogeneous run per new type (GenComm from its own stage 1; the
benchmark starts the competitors from full-feature stage-1 runs, as the
reference code does, :mod:`gencomm.benchmark`). It composes one model
holding every type, loads the ego alliance's weights and each new type's
stack, freezes everything except what the method trains for the new types
(frozen BatchNorm layers stay in eval mode every epoch), and trains with the
detection loss. Nobody in the ego alliance changes.

A method is a registered :class:`~opencood_ext.methods.base.OnboardingMethod`
(``ONBOARDING``, the ``--method`` of ``tools/onboard.py``) that says:

* ``link(...)``: the stage-2 link spec (GenComm keeps its own; BackAlign sends
  the full feature; STAMP, MPDA, CodeFilling bring their own links);
* ``ego_prefixes`` / ``new_prefixes``: which weights come from the ego's run
  and from each new type's run;
* ``trainable(t)``: the module prefixes that train for new type ``t``;
* ``train_defaults``: the reference's stage-2 schedule (lr, epochs).

GenComm registers itself in :mod:`gencomm.onboarding`; the heterogeneous
baselines in :mod:`opencood_ext.methods`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..config import apply_overrides, config_from_dict
from ..experiment import ExperimentConfig, build_model, join_types, load_experiment
from ..methods.base import ONBOARDING, OnboardingMethod
from ..run_folder import RunFolder
from ..runs import checkpoint_of
from .checkpoint import load_model_state
from .freeze import FreezePolicy

log = logging.getLogger(__name__)

@dataclass
class OnboardPlan:
    method: OnboardingMethod
    config: ExperimentConfig
    ego_type: str
    new_types: List[str]
    ego_run: Path
    new_runs: Dict[str, Path]


def get_method(name: str) -> OnboardingMethod:
    return ONBOARDING.get_class(name, "--method")()


def _single_type(cfg: ExperimentConfig, run: Path) -> str:
    types = list(cfg.model.get("agent_types", {}))
    if len(types) != 1:
        raise ValueError(f"{run}: a stage-1 run must hold exactly one agent type, it has {types}")
    if cfg.model.get("fusion", "intermediate") not in ("intermediate", "pyramid"):  # pyramid: HEAL's
        raise ValueError(f"{run}: a stage-1 run must be an intermediate-fusion run (model.fusion intermediate "
                         f"or pyramid)")
    return types[0]


def _stage1(run: Path, method: OnboardingMethod) -> tuple:
    cfg = load_experiment(RunFolder(run).config)
    t = _single_type(cfg, run)
    method.check_stage1(cfg.model, run)
    return cfg, t


def _check_protocols(protocol: str, stage1: Dict[Path, ExperimentConfig], config) -> None:
    """Every stage-1 run was trained under the onboarding's ``protocol`` (the stage-2 yaml's, else the
    ego run's): the protocols build different layers after fusion, so a mix would not load or compare."""
    for run, cfg in stage1.items():
        if cfg.protocol != protocol:
            where = f"{config}: protocol {protocol}" if config is not None else f"the ego run's protocol {protocol}"
            raise ValueError(f"{run}: stage-1 run trained under protocol {cfg.protocol}, but {where}; "
                             f"onboard onto stage-1 runs of the same protocol")


def plan_onboarding(ego_run, new_runs: Sequence, overrides: Sequence[str] = (), epochs=None, config=None,
                    method: Optional[str] = None) -> OnboardPlan:
    """The stage-2 experiment: ``config`` (a stage-2 yaml, whose ``stage.method`` names the method)
    when given, else composed from the stage-1 run folders (the ego's settings, each new type's
    stack, the method's link and schedule). ``method`` defaults to the config's, else gencomm."""
    cfg_file = None
    if config is not None:
        extra = list(overrides) + ([f"train.epochs={int(epochs)}"] if epochs is not None else [])
        cfg_file = load_experiment(Path(config), extra)
        if method is not None and method != cfg_file.stage.method:
            raise ValueError(f"{config}: stage.method is {cfg_file.stage.method!r} but --method is {method!r}")
        method = cfg_file.stage.method
    m = get_method(method or "gencomm")
    if cfg_file is not None:
        m.check_stage2(cfg_file.model.get("link"), config)
    ego_run, new_runs = Path(ego_run), [Path(r) for r in new_runs]
    ego_cfg, ego_type = _stage1(ego_run, m)
    new: Dict[str, Path] = {}
    new_cfgs = {}
    for run in new_runs:
        cfg, t = _stage1(run, m)
        if t == ego_type or t in new:
            raise ValueError(f"{run}: agent type {t} is already in the alliance")
        new[t], new_cfgs[t] = run, cfg
    if not new:
        raise ValueError("give at least one --new stage-1 run")
    _check_protocols(cfg_file.protocol if cfg_file is not None else ego_cfg.protocol,
                     {ego_run: ego_cfg, **{new[t]: c for t, c in new_cfgs.items()}}, config)
    if cfg_file is not None:
        cfg = cfg_file
        if set(cfg.stage.new_types) != set(new):
            raise ValueError(f"{config}: stage.new_types {cfg.stage.new_types} but the --new runs hold {sorted(new)}")
        types = set(cfg.model.get("agent_types", {}))
        if types != {ego_type, *new}:
            raise ValueError(f"{config}: model.agent_types {sorted(types)} must be the ego's type {ego_type} "
                             f"plus the new types {sorted(new)}")
        return OnboardPlan(m, cfg, ego_type, list(cfg.stage.new_types), ego_run, new)
    d = join_types(ego_cfg, new_cfgs)
    d["name"] = f"onboard_{m.name}_{ego_type}_" + "_".join(new)
    link = m.link(d["model"].get("link"), ego_type, list(new))
    if link is None:
        d["model"].pop("link", None)
    else:
        d["model"]["link"] = link
    d["train"].update(m.train_defaults)
    if epochs is not None:
        d["train"]["epochs"] = int(epochs)
    d["stage"] = {"new_types": list(new), "method": m.name}
    prov: dict = {}
    apply_overrides(d, prov, overrides)
    return OnboardPlan(m, config_from_dict(ExperimentConfig, d, prov), ego_type, list(new), ego_run, new)


def _present(model, prefixes: List[str]) -> Dict[str, str]:
    """Identity prefix map of the ``prefixes`` under which ``model`` has any state."""
    keys = list(model.state_dict())
    return {p: p for p in prefixes if any(k.startswith(p) for k in keys)}


def build_onboarding_model(plan: OnboardPlan):
    """The composed model with the stage-1 weights loaded, and the freeze policy to train it."""
    m = plan.method
    model = build_model(plan.config)
    load_model_state(model, checkpoint_of(plan.ego_run), prefix_map=_present(model, m.ego_prefixes(plan.ego_type)),
                     strict=True)
    for t, run in plan.new_runs.items():
        load_model_state(model, checkpoint_of(run), prefix_map=_present(model, m.new_prefixes(t)), strict=True)
    trainable = [p for t in plan.new_types for p in m.trainable(t)]
    return model, FreezePolicy(trainable, freeze_batchnorm_stats=True)


def trainable_per_type(plan: OnboardPlan, model) -> Dict[str, int]:
    """Parameters that train for each new type (as the policy set ``requires_grad``)."""
    out = {}
    for t in plan.new_types:
        prefixes = plan.method.trainable(t)
        out[t] = sum(p.numel() for n, p in model.named_parameters()
                     if p.requires_grad and any(n == q or n.startswith(q + ".") for q in prefixes))
    return out
