"""What every onboarding method declares, and the registry they join.

An :class:`OnboardingMethod` says how new agent types join a frozen alliance
(stage 2, :mod:`opencood_ext.training.onboarding` runs it): the stage-2 link,
which weights come from the ego's and each new type's stage-1 run, and what
trains. Methods register with ``@ONBOARDING.register(name)`` in their module.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Dict, List, Optional, Tuple

import torch

from ..registry import Registry

ONBOARDING = Registry("onboarding method", "how new agent types join a frozen alliance (tools/onboard.py --method); "
                      "GenComm's registers when the gencomm package is imported")


class OnboardingMethod:
    """Base class; see the module docstring. Subclasses set ``name`` and override what differs."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    train_defaults: ClassVar[Dict[str, object]] = {"lr": 1e-3, "lr_scheduler": None}

    def link(self, ego_link: Optional[dict], ego_type: str, new_types: List[str]) -> Optional[dict]:
        """The stage-2 ``model.link`` spec, from the ego run's."""
        return ego_link

    def ego_prefixes(self, ego_type: str) -> List[str]:
        """Weights taken from the ego's run: its stack and everything after fusion."""
        return [f"encoders.{ego_type}.", "fuse.", "post_fusion.", "head."]

    def new_prefixes(self, t: str) -> List[str]:
        """Weights taken from new type ``t``'s run: its encoder stack."""
        return [f"encoders.{t}."]

    def trainable(self, t: str) -> List[str]:
        """Module prefixes that train for new type ``t``."""
        raise NotImplementedError

    def check_stage1(self, cfg, run: Path) -> None:
        """Raise ValueError when ``run`` cannot serve as a stage-1 run for this method."""

    def cost(self, model, t: str, batch) -> Tuple[int, float]:
        """(parameters, GFLOPs) of what trains for new type ``t`` (the modules ``trainable(t)`` names in
        ``model``), the GFLOPs for one frame: each module run once on a (1, C, H, W) feature of the
        model's grid. Override when what trains reads something else (BackAlign: the sensor input
        of ``batch``, a collated :class:`~opencood_ext.data.batch.Batch`, unused here)."""
        from ..eval.flops import count_flops, count_parameters

        modules = [model.get_submodule(p) for p in self.trainable(t)]
        x = torch.zeros(1, model.channels, *model.grid.shape, device=next(model.parameters()).device)
        return (sum(count_parameters(m) for m in modules),
                sum(count_flops(m, (x,)) for m in modules) / 1e9)


def require_trained(run: Path, why: str) -> None:
    """ValueError naming ``run`` and ``why`` it must hold stage-1 weights, when it has no checkpoint."""
    from ..runs import checkpoint_of  # runs -> experiment -> this package

    try:
        checkpoint_of(run)
    except FileNotFoundError as exc:
        raise ValueError(f"{run}: {why}, but {exc}") from None
