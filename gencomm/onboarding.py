"""GenComm's stage 2: a new agent type joins an existing alliance by training
ONLY its Deformable Message Extractor (~0.1M parameters).

Registered as the ``gencomm`` :class:`~opencood_ext.methods.base.OnboardingMethod`
(``tools/onboard.py --method gencomm``, the default). Weights come from:

* the ego's stage-1 run: its encoder stack, DME, generator, enhancer, fusion and head;
* each new type's stage-1 run: its encoder stack ``encoders.<t>.``, its DME
  ``link.dme.<t>.`` (the starting point of stage 2) and its receiver-side
  generator / enhancer ``link.safg.<t>.`` / ``link.enhancer.<t>.`` (kept so the
  new type can also be an ego later; frozen here).

Only ``link.dme.<t>`` trains, with the detection loss only (generation weight
0: sender and receiver live in different semantic spaces), lr 5e-4 as in the
paper. The new agent learns to speak the receiver's message "numerics";
nobody else changes.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from opencood_ext.methods.base import ONBOARDING, OnboardingMethod

STAGE2_LR = 5e-4  # the paper's stage-2 learning rate
_RECEIVER = ("link.dme", "link.safg", "link.enhancer")


@ONBOARDING.register("gencomm")
class GenCommOnboarding(OnboardingMethod):
    name = "gencomm"
    description = "only the new type's message extractor trains (GenComm)"
    train_defaults = {"lr": STAGE2_LR, "lr_scheduler": None}

    def link(self, ego_link: Optional[dict], ego_type: str, new_types: List[str]) -> Optional[dict]:
        return {**dict(ego_link or {}), "generation_weight": 0.0}  # detection loss only

    def ego_prefixes(self, ego_type: str) -> List[str]:
        return super().ego_prefixes(ego_type) + [f"{m}.{ego_type}." for m in _RECEIVER]

    def new_prefixes(self, t: str) -> List[str]:
        return super().new_prefixes(t) + [f"{m}.{t}." for m in _RECEIVER]

    def trainable(self, t: str) -> List[str]:
        return [f"link.dme.{t}"]

    def check_stage1(self, model: dict, run: Path) -> None:
        if (model.get("link") or {}).get("type") != "gencomm":
            raise ValueError(f"{run}: not a GenComm stage-1 run (model.link.type must be gencomm)")
