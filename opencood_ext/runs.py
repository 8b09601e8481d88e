"""Open a trained run folder: its config, its model with weights, its datasets."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from .config import config_from_dict
from .experiment import ExperimentConfig, build_model, join_types, load_experiment
from .models.detector import CooperativeDetector
from .run_folder import FUSION_ALIASES, RunFolder
from .training.checkpoint import load_model_state

__all__ = ["FUSION_ALIASES", "checkpoint_of", "run_files", "load_run", "set_fusion", "late_fusion_of"]


def checkpoint_of(run_dir: Path, which: Optional[str] = None) -> Path:
    """The weights ``run_dir`` is evaluated with (:meth:`CheckpointPaths.for_evaluation`), or those
    ``which`` names (best, last, epoch_N: :meth:`CheckpointPaths.named`)."""
    paths = RunFolder(run_dir).checkpoints
    return paths.for_evaluation() if which is None else paths.named(which)


def run_files(run_dir) -> Tuple[Path, ...]:
    """What loading the run reads (:meth:`RunFolder.inputs`): its config and weights, not the
    evaluations written beside them; a resumed main job re-evaluates a run when these change."""
    return RunFolder(run_dir).inputs()


def load_run(run_dir, overrides: Sequence[str] = (),
             checkpoint: Optional[str] = None) -> Tuple[ExperimentConfig, CooperativeDetector]:
    """The run's config and model with its evaluation weights, or the named ``checkpoint``'s."""
    run_dir = Path(run_dir)
    cfg_path = RunFolder(run_dir).config
    if not cfg_path.exists():
        raise FileNotFoundError(f"{run_dir}: no {cfg_path.name}; is this a run folder written by gencomm-train?")
    cfg = load_experiment(cfg_path, overrides)
    model = build_model(cfg)
    load_model_state(model, checkpoint_of(run_dir, checkpoint))
    model.eval()
    return cfg, model


def set_fusion(model: CooperativeDetector, method: str) -> None:
    """Run a trained model with another fusion method (e.g. late fusion of an ego-only detector;
    "no" is accepted for "none", as OpenCOOD's ``--fusion_method no``)."""
    model.set_fusion(FUSION_ALIASES.get(method, method))


def late_fusion_of(runs: Dict[str, Path], ego_type: str,
                   overrides: Sequence[str] = ()) -> Tuple[ExperimentConfig, CooperativeDetector]:
    """Late fusion of separately trained single-type runs (the stage-1 runs): one model holding every
    type's encoder stack, where each agent detects with its OWN run's head and sends its boxes, and
    the ego (``ego_type``'s run) merges them. ``runs``: {agent type: run folder holding that type};
    ``overrides``: ``--set`` items for the ego's config, which the joined experiment starts from
    (e.g. ``data.root`` of another test set)."""
    if ego_type not in runs:
        raise ValueError(f"late fusion needs the ego type {ego_type}'s run; given {sorted(runs)}")
    loaded = {t: load_run(r, overrides if t == ego_type else ()) for t, r in runs.items()}
    for t, (cfg, _) in loaded.items():
        if list(cfg.model.get("agent_types", {})) != [t]:
            raise ValueError(f"{runs[t]}: expected a run of type {t} alone, it holds "
                             f"{list(cfg.model.get('agent_types', {}))}")
    ego_cfg = loaded[ego_type][0]
    d = join_types(ego_cfg, {t: c for t, (c, _) in loaded.items() if t != ego_type})
    d["name"] = "late_" + "_".join(runs)
    d["model"]["fusion"] = "late"
    d["model"].pop("link", None)
    cfg = config_from_dict(ExperimentConfig, d)
    model = build_model(cfg)
    for t, (_, member) in loaded.items():
        model.encoders[t].load_state_dict(member.encoders[t].state_dict())
        if t == ego_type:
            model.post_fusion.load_state_dict(member.post_fusion.state_dict())
            model.head.load_state_dict(member.head.state_dict())
            # the ego's head reads its own feature as its run does (CooperativeDetector.own_view: under
            # protocol reference a GenComm run's head reads the regenerated feature); nothing is sent by it
            model.link = member.link
        else:
            model.sender_detectors[t] = member
    return cfg, model.eval()
