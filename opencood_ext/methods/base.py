"""What every onboarding method declares, and the registry they join.

An :class:`OnboardingMethod` says how new agent types join a frozen alliance
(stage 2, :mod:`opencood_ext.training.onboarding` runs it): the stage-2 link,
which weights come from the ego's and each new type's stage-1 run, and what
trains. Methods register with ``@ONBOARDING.register(name)`` in their module.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ..eval.flops import flops_during, profile_flops
from ..registry import Registry
from ..training.checkpoint import CheckpointPaths

ONBOARDING = Registry("onboarding method", "how new agent types join a frozen alliance (tools/onboard.py --method); "
                      "GenComm's registers when the gencomm package is imported")


class OnboardingMethod:
    """Base class; see the module docstring. Subclasses set ``name`` and override what differs."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    train_defaults: ClassVar[Dict[str, object]] = {"lr": 1e-3, "lr_scheduler": None}
    # modules of the ego's run this method retrains (module prefixes); empty: the alliance stays frozen,
    # so joining changes nobody else's weights (every method but MPDA's reference trainable set)
    alliance_parts: ClassVar[Tuple[str, ...]] = ()

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

    def check_stage1(self, model: dict, run: Path) -> None:
        """Raise ValueError when ``run``, whose config's ``model:`` section is ``model``, cannot serve as a
        stage-1 run for this method."""

    def check_stage2(self, link: Optional[dict], config) -> None:
        """Raise ValueError when the stage-2 yaml ``config``, whose ``model.link`` is ``link``, does not
        configure this method (a method whose options live in the link says which it needs)."""

    def cost(self, model, t: str, batch) -> Tuple[int, float]:
        """(trainable parameters, GFLOPs) of what trains for new type ``t``: the parameters under
        ``trainable(t)`` (exact; a module shared by several prefixes counted once), and the FLOPs
        of those modules in one forward pass of ``model`` on ``batch`` (eval mode, no gradients),
        per agent of type ``t`` in it (:mod:`opencood_ext.eval.flops` conventions: its layers,
        deformable conv included). Methods whose trainable part is cheaper to profile on a
        feature map override this."""
        mods = _modules_under(model, self.trainable(t))
        count = sum(a == t for a in batch.agent_types)
        if not count:
            raise ValueError(f"cost of type {t}: the batch has no agent of that type ({batch.agent_types})")
        was = model.training
        model.eval()
        try:
            flops = flops_during(mods, lambda: model(batch))
        finally:
            model.train(was)
        return count_unique_parameters(mods), flops / count / 1e9


def _modules_under(model: nn.Module, prefixes: Sequence[str]) -> List[nn.Module]:
    named = dict(model.named_modules())
    missing = [p for p in prefixes if p not in named]
    if missing:
        raise ValueError(f"trainable prefixes {missing} name no module of the model")
    return [named[p] for p in prefixes]


def count_unique_parameters(modules: Sequence[nn.Module]) -> int:
    """Parameters of ``modules``, each tensor once."""
    return sum(p.numel() for p in {id(p): p for m in modules for p in m.parameters()}.values())


def feature_macs(module: nn.Module, inputs: tuple) -> int:
    """Multiply-accumulates of ``module(*inputs)``: its layers as :func:`profile_flops` counts
    them, plus the batched matmuls between activations (attention scores and mixing, codebook
    distances and look-ups), which no layer hook sees (``FlopCounterMode``'s bmm count / 2)."""
    with FlopCounterMode(display=False) as counter:
        layers = profile_flops(module, inputs).macs
    bmm = counter.get_flop_counts().get("Global", {}).get(torch.ops.aten.bmm, 0)
    return layers + int(bmm) // 2


def feature_map_cost(model, prefixes: Sequence[str]) -> Tuple[int, float]:
    """(parameters, GFLOPs) of the modules at ``prefixes``, each run once on a (1, C, H, W) feature of
    the model's grid: for trainable parts that read a BEV feature whichever side of the link they sit on."""
    from ..eval.flops import count_flops

    modules = _modules_under(model, prefixes)
    x = torch.zeros(1, model.channels, *model.grid.shape, device=next(model.parameters()).device)
    return count_unique_parameters(modules), sum(count_flops(m, (x,)) for m in modules) / 1e9


def require_trained(run: Path, why: str) -> None:
    """ValueError naming ``run`` and ``why`` it must hold stage-1 weights, when it has no checkpoint."""
    try:
        CheckpointPaths(run).for_evaluation()
    except FileNotFoundError as exc:
        raise ValueError(f"{run}: {why}, but {exc}") from None
