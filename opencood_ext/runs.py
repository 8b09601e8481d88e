"""Open a trained run folder: its config, its model with weights, its datasets."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence, Tuple

from .experiment import ExperimentConfig, build_model, load_experiment
from .models.detector import CooperativeDetector
from .training.checkpoint import load_model_state

FUSION_ALIASES = {"no": "none", "none": "none", "late": "late", "early": "early", "intermediate": "intermediate"}


def checkpoint_of(run_dir: Path) -> Path:
    """``best.pth`` when validation ran, else ``latest.pth``."""
    ckpts = Path(run_dir) / "checkpoints"
    for name in ("best.pth", "latest.pth"):
        if (ckpts / name).exists():
            return ckpts / name
    raise FileNotFoundError(f"{run_dir}: no checkpoints/best.pth or checkpoints/latest.pth (was it trained?)")


def load_run(run_dir, overrides: Sequence[str] = ()) -> Tuple[ExperimentConfig, CooperativeDetector]:
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{run_dir}: no config.yaml; is this a run folder written by tools/train.py?")
    cfg = load_experiment(cfg_path, overrides)
    model = build_model(cfg)
    load_model_state(model, checkpoint_of(run_dir))
    model.eval()
    return cfg, model


def set_fusion(model: CooperativeDetector, method: str) -> None:
    """Run a trained model with another fusion method (e.g. late fusion of an ego-only detector)."""
    fusion = FUSION_ALIASES.get(method)
    if fusion is None:
        raise ValueError(f"unknown fusion method {method!r}; choose from {sorted(FUSION_ALIASES)}")
    if fusion == "intermediate" and model.link is None:
        raise ValueError("this model was trained without an intermediate-fusion link; "
                         "it can run no, late or early fusion")
    model.fusion = fusion
