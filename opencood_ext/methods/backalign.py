"""BackAlign (HEAL's backward alignment, Lu et al., ICLR 2024) as an onboarding
method: a new agent type trains its own encoder stack (encoder, BEV backbone and
shrink conv: everything under ``encoders.<t>``) against the ego alliance's frozen
fusion, post-fusion layers and head, and sends its full feature.

Facts from the reference (jeffreychou777/GenComm:
``opencood/models/heter_model_baseline_w_backalign.py``,
``hypes_yaml/opv2v/GenComm_yamls/baselines/stage2/BackAlign/m1m{2,3,4}_att.yaml`` and
its README's stage-2 recipe):

* fixed: the fusion net, the cls / reg / dir heads, and the ego type's encoder,
  backbone and shrinker (their BatchNorms held in eval mode); everything of the
  new type trains (its BatchNorms update as usual).
* the new type's stack starts from ITS stage-1 weights: ``heal_tools.py
  merge_and_save`` merges the new type's stage-1 checkpoint with the ego's before
  stage 2 (the ego's wins where both hold a module), so nothing starts from scratch.
* the loss is the FUSED detection loss (plus LSS depth supervision,
  ``point_pillar_depth_loss``): each stage-2 sample has the ego type (m1) as the
  receiver and the new type among its collaborators, and the loss is taken on the
  ego's fused prediction, so the gradient reaches the new encoder through the
  frozen fusion and head. (HEAL's paper trains the new encoder with the new agent
  as the ego alone, through the frozen shared backbone and head; the GenComm
  reference, followed here, uses the cooperative sample.)
* schedule: 10 epochs, Adam lr 1e-3, weight decay 1e-4, x0.1 after epoch 5.

The message is the full feature (link ``full_feature``), float32 on the wire.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from .base import ONBOARDING, OnboardingMethod, require_trained


@ONBOARDING.register("backalign")
class BackAlignOnboarding(OnboardingMethod):
    """BackAlign: the new type's whole encoder stack trains; it sends its full feature."""

    name = "backalign"
    description = "the new type's encoder stack trains against the frozen alliance's fusion and head (HEAL)"
    train_defaults = {"epochs": 10, "lr": 1e-3, "weight_decay": 1e-4, "lr_scheduler": "multistep",
                      "milestones": [5], "gamma": 0.1}

    def link(self, ego_link: Optional[dict], ego_type: str, new_types: List[str]) -> Optional[dict]:
        return {"type": "full_feature"}

    def trainable(self, t: str) -> List[str]:
        return [f"encoders.{t}"]

    def check_stage1(self, model: dict, run: Path) -> None:
        """The new type's stack continues from its stage-1 weights (module docstring)."""
        require_trained(run, "BackAlign starts the new type's encoder stack from its stage-1 weights")

    def cost(self, model, t: str, batch) -> Tuple[int, float]:
        """(parameters, GFLOPs) of ``encoders.<t>``; GFLOPs for one agent's frame: the stack run on
        the sensor input of ``batch``'s type-``t`` agents, divided by their number (sparse 3D convs
        counted per site pair, :mod:`opencood_ext.eval.flops`)."""
        from ..eval.flops import count_flops, count_parameters

        if t not in batch.inputs:
            raise ValueError(f"BackAlign cost: the batch has no agent of type {t} (it has {sorted(batch.inputs)})")
        stack = model.encoders[t]
        inp = batch.inputs[t].to(next(stack.parameters()).device)
        return count_parameters(stack), count_flops(stack, (inp,)) / 1e9 / inp.num_agents
