"""Dynamic evaluation: agent types join the ego's alliance one after another
(ego m1; then m1 + m2; then m1 + m2 + m3; ...) and each step is evaluated, as in
the paper's tables. Each row gives AP, the bytes one collaborator sends per
frame and what it cost to onboard the newest type: the trainable parameters
and GFLOPs of what the run's onboarding method trains for it
(:meth:`~opencood_ext.methods.base.OnboardingMethod.cost`; GenComm: its message
extractor). Each alliance's evaluation is written as ``eval_dyn_<types>.json``
(with its per-frame records, so alliances and runs can be compared pairwise), the
table as ``eval_dynamic.json`` (names: :class:`~opencood_ext.run_folder.RunFolder`). Weights other
than the run's evaluation weights (``checkpoint``: ``epoch_2``, ``last``) carry their name in every
label (``eval_dyn_m1+m2_epoch_2.json``, ``eval_dynamic_epoch_2.json``), so the default files stay.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from .evaluate import EvalResult, evaluate
from ..experiment import ExperimentConfig, build_dataset
from ..data.batch import collate_samples
from ..methods.base import ONBOARDING
from ..run_folder import RunFolder, dynamic_label, evaluation_label


@dataclass
class DynamicRow:
    types: List[str]
    result: EvalResult
    onboard_params: Optional[int]
    onboard_gflops: Optional[float]

    @property
    def label(self) -> str:
        return self.types[0] if len(self.types) == 1 else "+" + self.types[-1]


def onboarding_cost(cfg: ExperimentConfig, model, dataset, agent_type: str):
    """(trainable parameters, GFLOPs per frame) of what the run's onboarding method trains for
    ``agent_type``; (None, None) when the run is no onboarding of that type or no frame has one."""
    if agent_type not in cfg.stage.new_types:
        return None, None
    method = ONBOARDING.get_class(cfg.stage.method, "stage.method")()
    for i in range(min(len(dataset), 50)):  # a frame where the type takes part
        sample = dataset[i]
        if sample is not None and any(a.agent_type == agent_type for a in sample.agents):
            batch = collate_samples([sample]).to(next(model.parameters()).device)
            with torch.no_grad():
                return method.cost(model, agent_type, batch)
    return None, None


def run_dynamic(cfg: ExperimentConfig, model, order: Sequence[str], split: str,
                out_dir: Optional[Path] = None, max_frames: Optional[int] = None, channel=None,
                checkpoint: Optional[str] = None) -> List[DynamicRow]:
    """Evaluate the alliance ``order[:1]``, ``order[:2]``, ... with the same trained model; ``checkpoint``:
    the named weights ``model`` holds (None: the run's evaluation weights), which enters every label."""
    missing = [t for t in order if t not in model.encoders]
    if missing:
        raise ValueError(f"types {missing} are not in this model (it has {sorted(model.encoders)})")
    rows = []
    for k in range(1, len(order) + 1):
        types = list(order[:k])
        sub = copy.deepcopy(cfg)
        sub.data.agent_types = {t: cfg.data.agent_types[t] for t in types}
        dataset = build_dataset(sub, split, train=False, fusion=model.fusion)
        torch.manual_seed(cfg.train.seed)  # GenComm's diffusion noise: the same draws for every alliance
        res = evaluate(model, dataset, out_dir=out_dir, max_frames=max_frames,
                       label=evaluation_label(alliance=types, checkpoint=checkpoint), channel=channel)
        params, gflops = onboarding_cost(cfg, model, dataset, types[-1]) if k > 1 else (None, None)
        rows.append(DynamicRow(types, res, params, gflops))
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        RunFolder(out_dir).evaluation(dynamic_label(checkpoint)).write_text(json.dumps(
            [{"types": r.types, "onboard_params": r.onboard_params, "onboard_gflops": r.onboard_gflops,
              **r.result.to_json()} for r in rows], indent=2))
    return rows


def format_dynamic(rows: List[DynamicRow], order: str = "global") -> str:
    head = (f"{'alliance':<14}{'AP@0.3':>8}{'AP@0.5':>8}{'AP@0.7':>8}{'bytes/msg':>11}"
            f"{'collab/frame':>14}{'onboard params':>16}{'onboard GFLOPs':>16}")
    lines = [f"dynamic evaluation ({order} AP order)", head]
    for r in rows:
        ap = r.result.ap[order]
        params = f"{r.onboard_params:,}" if r.onboard_params is not None else "-"
        gflops = f"{r.onboard_gflops:.3f}" if r.onboard_gflops is not None else "-"
        lines.append(f"{r.label:<14}{ap[0.3]:>8.3f}{ap[0.5]:>8.3f}{ap[0.7]:>8.3f}"
                     f"{r.result.bytes_per_message:>11.0f}{r.result.collaborators_per_frame:>14.2f}"
                     f"{params:>16}{gflops:>16}")
    return "\n".join(lines)
