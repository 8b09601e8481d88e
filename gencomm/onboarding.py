"""Stage 2: onboard new agent types into an existing alliance.

Start from the receiver's (ego's) stage-1 run and each new type's stage-1 run;
compose one model holding every type; freeze EVERYTHING except the new types'
Deformable Message Extractors (frozen BatchNorm layers stay in eval mode every
epoch); train with the detection loss only. The new agent learns to speak the
receiver's message "numerics"; nobody else changes.

Weights come from:
  * the ego run: everything it has (its encoder stack, DME, generator,
    enhancer, fusion, head);
  * each new run: that type's encoder stack ``encoders.<t>.``, its DME
    ``link.dme.<t>.`` (the starting point for stage 2) and its receiver-side
    generator/enhancer ``link.safg.<t>.`` / ``link.enhancer.<t>.`` (kept so the
    new type can also be an ego later; frozen here).
"""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

from opencood_ext.config import config_from_dict, config_to_dict

from opencood_ext.experiment import ExperimentConfig, build_model, load_experiment
from opencood_ext.runs import checkpoint_of
from opencood_ext.training.checkpoint import load_model_state
from opencood_ext.training.freeze import FreezePolicy

log = logging.getLogger(__name__)

STAGE2_LR = 5e-4  # the paper's stage-2 learning rate


@dataclass
class OnboardPlan:
    config: ExperimentConfig
    ego_type: str
    new_types: List[str]
    ego_run: Path
    new_runs: Dict[str, Path]


def _single_type(cfg: ExperimentConfig, run: Path) -> str:
    types = list(cfg.model.get("agent_types", {}))
    if len(types) != 1:
        raise ValueError(f"{run}: a stage-1 run must hold exactly one agent type, it has {types}")
    link = cfg.model.get("link") or {}
    if cfg.model.get("fusion", "intermediate") != "intermediate" or link.get("type") != "gencomm":
        raise ValueError(f"{run}: not a GenComm stage-1 run (model.fusion must be intermediate and "
                         f"model.link.type gencomm)")
    return types[0]


def plan_onboarding(ego_run, new_runs: Sequence, overrides: Sequence[str] = (), epochs=None,
                    config=None) -> OnboardPlan:
    """The stage-2 experiment: ``config`` (a stage-2 yaml) when given, else composed
    from the stage-1 run folders (the ego's settings plus each new type's stack)."""
    if config is not None:
        return _plan_from_config(Path(config), Path(ego_run), [Path(r) for r in new_runs], overrides, epochs)
    ego_run = Path(ego_run)
    ego_cfg = load_experiment(ego_run / "config.yaml")
    ego_type = _single_type(ego_cfg, ego_run)
    d = copy.deepcopy(config_to_dict(ego_cfg))
    new: Dict[str, Path] = {}
    for run in map(Path, new_runs):
        cfg = load_experiment(run / "config.yaml")
        t = _single_type(cfg, run)
        if t == ego_type or t in new:
            raise ValueError(f"{run}: agent type {t} is already in the alliance")
        new[t] = run
        nd = config_to_dict(cfg)
        d["data"]["agent_types"][t] = nd["data"]["agent_types"][t]
        d["model"]["agent_types"][t] = nd["model"]["agent_types"][t]
    if not new:
        raise ValueError("give at least one --new stage-1 run")
    d["name"] = f"onboard_{ego_type}_" + "_".join(new)
    d["data"]["modality"] = "cycle:" + ",".join([ego_type, *new])
    d["model"]["link"]["generation_weight"] = 0.0  # detection loss only
    d["train"]["lr"] = STAGE2_LR
    d["train"]["lr_scheduler"] = None
    if epochs is not None:
        d["train"]["epochs"] = int(epochs)
    d["stage"] = {"new_types": list(new)}
    from opencood_ext.config import apply_overrides
    prov: dict = {}
    apply_overrides(d, prov, overrides)
    cfg = config_from_dict(ExperimentConfig, d, prov)
    return OnboardPlan(cfg, ego_type, list(new), ego_run, new)


def _plan_from_config(path: Path, ego_run: Path, new_runs: List[Path], overrides, epochs) -> OnboardPlan:
    extra = list(overrides) + ([f"train.epochs={int(epochs)}"] if epochs is not None else [])
    cfg = load_experiment(path, extra)
    ego_type = _single_type(load_experiment(ego_run / "config.yaml"), ego_run)
    new = {_single_type(load_experiment(r / "config.yaml"), r): r for r in new_runs}
    types = set(cfg.model.get("agent_types", {}))
    if set(cfg.stage.new_types) != set(new):
        raise ValueError(f"{path}: stage.new_types {cfg.stage.new_types} but the --new runs hold {sorted(new)}")
    if types != {ego_type, *new}:
        raise ValueError(f"{path}: model.agent_types {sorted(types)} must be the ego's type {ego_type} "
                         f"plus the new types {sorted(new)}")
    if cfg.model.get("link", {}).get("generation_weight", 1.0) != 0.0:
        log.warning("%s: stage 2 normally trains with the detection loss only (generation_weight 0)", path)
    return OnboardPlan(cfg, ego_type, list(cfg.stage.new_types), ego_run, new)


def build_onboarding_model(plan: OnboardPlan):
    """The composed model with stage-1 weights loaded and the freeze policy to train it."""
    model = build_model(plan.config)
    load_model_state(model, checkpoint_of(plan.ego_run), prefix_map={"": ""}, strict=False)
    for t, run in plan.new_runs.items():
        prefixes = {f"encoders.{t}.": f"encoders.{t}.", f"link.dme.{t}.": f"link.dme.{t}.",
                    f"link.safg.{t}.": f"link.safg.{t}.", f"link.enhancer.{t}.": f"link.enhancer.{t}."}
        load_model_state(model, checkpoint_of(run), prefix_map=prefixes, strict=True)
    policy = FreezePolicy([f"link.dme.{t}" for t in plan.new_types], freeze_batchnorm_stats=True)
    return model, policy
