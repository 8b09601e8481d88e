"""Open a trained run folder: its config, its model with weights, its datasets."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence, Tuple

from .experiment import ExperimentConfig, build_model, load_experiment
from .models.detector import CooperativeDetector
from .training.checkpoint import load_model_state

FUSION_ALIASES = {"no": "none"}  # OpenCOOD's spelling of the none method


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
    """Run a trained model with another fusion method (e.g. late fusion of an ego-only detector;
    "no" is accepted for "none", as OpenCOOD's ``--fusion_method no``)."""
    model.set_fusion(FUSION_ALIASES.get(method, method))
