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

Beyond the paper, registered beside it as ``gencomm_egotarget``
(:class:`GenCommEgoTargetOnboarding`): the same trainable set, plus a generation
loss whose target is the new type's SENDER scan as the ego type's own frozen encoder
reads it (``model.link.generation_target: ego_encoder``, :mod:`gencomm.link`;
OPV2V-H and the simulator give every agent every sensor). The message and the
evaluation are the faithful method's.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Literal, Optional

from opencood_ext.methods.base import ONBOARDING, OnboardingMethod

STAGE2_LR = 5e-4  # the paper's stage-2 learning rate
# the ego-encoder target's weight: the sim configs' stage-1 generation weight (configs/sim/gencomm_link.yaml),
# so the new type's generation term weighs against detection as the ego's own did in its stage 1
EGO_TARGET_WEIGHT = 10.0
_RECEIVER = ("link.dme", "link.safg", "link.enhancer")


@ONBOARDING.register("gencomm")
class GenCommOnboarding(OnboardingMethod):
    name = "gencomm"
    description = "only the new type's message extractor trains (GenComm)"
    train_defaults = {"lr": STAGE2_LR, "lr_scheduler": None}

    def __init__(self, generation_target: Literal["none", "ego_encoder"] = "none",
                 generation_target_weight: float = EGO_TARGET_WEIGHT):
        """generation_target / generation_target_weight: the stage-2 link's (``model.link``, :mod:`gencomm.link`):
        ``none`` (the paper: detection loss only) or ``ego_encoder`` (beyond the paper: module docstring)."""
        if generation_target not in ("none", "ego_encoder"):
            raise ValueError(f"generation_target must be none or ego_encoder, got {generation_target!r}")
        self.generation_target = generation_target
        self.generation_target_weight = float(generation_target_weight)

    def link(self, ego_link: Optional[dict], ego_type: str, new_types: List[str]) -> Optional[dict]:
        spec = {**dict(ego_link or {}), "generation_weight": 0.0}  # the stage-1 generation loss is off
        spec.pop("generation_target", None)
        spec.pop("generation_target_weight", None)
        if self.generation_target != "none":
            spec.update(generation_target=self.generation_target,
                        generation_target_weight=self.generation_target_weight)
        return spec

    def ego_prefixes(self, ego_type: str) -> List[str]:
        return super().ego_prefixes(ego_type) + [f"{m}.{ego_type}." for m in _RECEIVER]

    def new_prefixes(self, t: str) -> List[str]:
        return super().new_prefixes(t) + [f"{m}.{t}." for m in _RECEIVER]

    def trainable(self, t: str) -> List[str]:
        return [f"link.dme.{t}"]

    def check_stage1(self, model: dict, run: Path) -> None:
        if (model.get("link") or {}).get("type") != "gencomm":
            raise ValueError(f"{run}: not a GenComm stage-1 run (model.link.type must be gencomm)")

    def check_stage2(self, link: Optional[dict], config) -> None:
        """A stage-2 yaml (``config``) naming this method sets ``model.link.generation_target`` to this
        method's (``none`` when absent): the run folder's method then says what trained."""
        got = (link or {}).get("generation_target", "none")
        if got != self.generation_target:
            raise ValueError(f"{config}: stage.method {self.name} trains with model.link.generation_target "
                             f"{self.generation_target}, the config sets {got}")


@ONBOARDING.register("gencomm_egotarget")
class GenCommEgoTargetOnboarding(GenCommOnboarding):
    """GenComm's onboarding with the ego-encoder generation target (beyond the paper; module docstring)."""

    name = "gencomm_egotarget"
    description = ("only the new type's message extractor trains, on detection plus regenerating its scan "
                   "as the ego's frozen encoder reads it (GenComm, beyond the paper)")

    def __init__(self, generation_target: Literal["none", "ego_encoder"] = "ego_encoder",
                 generation_target_weight: float = EGO_TARGET_WEIGHT):
        super().__init__(generation_target, generation_target_weight)
