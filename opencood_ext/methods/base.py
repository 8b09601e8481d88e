"""What every onboarding method declares, and the registry they join.

An :class:`OnboardingMethod` says how new agent types join a frozen alliance
(stage 2, :mod:`opencood_ext.training.onboarding` runs it): the stage-2 link,
which weights come from the ego's and each new type's stage-1 run, and what
trains. Methods register with ``@ONBOARDING.register(name)`` in their module.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Dict, List, Optional

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
