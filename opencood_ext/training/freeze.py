"""Stage policies: which parameters train, and frozen BatchNorm kept in eval mode.

Stage 2 of GenComm onboards a new agent type by training ONLY its message
extractor (DME) while everything else stays bit-identical, including the
running statistics of every BatchNorm in the frozen parts. ``model.train()``
would switch those BatchNorms back to batch statistics and update their
running mean/var, so a :class:`FreezePolicy` keeps them in eval mode twice over:

- :meth:`FreezePolicy.train_mode` is what the trainer calls instead of
  ``model.train()`` (train mode, then frozen BatchNorms back to eval);
- :meth:`FreezePolicy.apply` also registers a forward pre-hook on every frozen
  BatchNorm that forces ``training = False`` before each forward, so a stray
  ``model.train()`` elsewhere cannot leak batch statistics either.

Prefixes are dotted module names as in ``model.named_modules()``; a prefix
``"dme.lidar"`` covers ``dme.lidar.conv.weight`` but not ``dme.lidar2.w``.
A BatchNorm is frozen when it lies outside every trainable prefix.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Sequence, Union

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def _under(name: str, prefix: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def _force_eval_pre_hook(module: nn.Module, args) -> None:
    module.training = False


@dataclass
class FreezeSummary:
    """Parameter counts after a freeze: per trainable prefix, and totals."""
    per_prefix: Dict[str, int]
    trainable: int
    frozen: int
    frozen_batchnorms: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"trainable {self.trainable:,} / total {self.trainable + self.frozen:,} parameters"]
        lines += [f"  {p or '<all>'}: {n:,}" for p, n in self.per_prefix.items()]
        if self.frozen_batchnorms:
            lines.append(f"  {len(self.frozen_batchnorms)} frozen BatchNorm layer(s) held in eval mode")
        return "\n".join(lines)


class FreezePolicy:
    """Train only the submodules named by ``trainable`` (module-name prefixes).

    trainable: non-empty list of dotted module names; ``[""]`` trains everything.
    freeze_batchnorm_stats: keep BatchNorms outside the trainable prefixes in
    eval mode (running stats untouched). True is the stage-2 protocol.
    """

    def __init__(self, trainable: Sequence[str], freeze_batchnorm_stats: bool = True):
        if isinstance(trainable, str):
            trainable = [trainable]
        trainable = list(trainable)
        if not trainable:
            raise ValueError("FreezePolicy: 'trainable' must name at least one module prefix")
        if not all(isinstance(p, str) for p in trainable):
            raise ValueError(f"FreezePolicy: 'trainable' must be strings, got {trainable!r}")
        self.trainable = trainable
        self.freeze_batchnorm_stats = freeze_batchnorm_stats
        self._hooks: list = []

    def is_trainable(self, name: str) -> bool:
        return any(_under(name, p) for p in self.trainable)

    def _check_prefixes(self, model: nn.Module) -> None:
        names = [n for n, _ in model.named_modules()] + [n for n, _ in model.named_parameters()]
        for p in self.trainable:
            if p and not any(_under(n, p) for n in names):
                close = difflib.get_close_matches(p, names, n=3)
                hint = f"; closest: {close}" if close else ""
                raise ValueError(f"FreezePolicy: trainable prefix {p!r} names no module of "
                                 f"{type(model).__name__}{hint}")

    def frozen_batchnorms(self, model: nn.Module) -> List[str]:
        """Names of the BatchNorm layers that lie outside every trainable prefix."""
        if not self.freeze_batchnorm_stats:
            return []
        return [n for n, m in model.named_modules() if isinstance(m, _BatchNorm) and not self.is_trainable(n)]

    def apply(self, model: nn.Module) -> List[nn.Parameter]:
        """Set ``requires_grad`` by prefix, hook frozen BatchNorms; returns the trainable params.

        Raises ValueError when a prefix names no module or nothing is left to train.
        """
        self._check_prefixes(model)
        params = []
        for name, p in model.named_parameters():
            keep = self.is_trainable(name)
            p.requires_grad_(keep)
            if keep:
                params.append(p)
        if not params:
            raise ValueError(f"FreezePolicy: prefixes {self.trainable} hold no parameters of "
                             f"{type(model).__name__}; nothing would train")
        self.remove_hooks()
        modules = dict(model.named_modules())
        for n in self.frozen_batchnorms(model):
            modules[n].eval()
            self._hooks.append(modules[n].register_forward_pre_hook(_force_eval_pre_hook))
        return params

    __call__ = apply

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def train_mode(self, model: nn.Module) -> None:
        """``model.train()``, then every frozen BatchNorm back to eval mode."""
        model.train()
        modules = dict(model.named_modules())
        for n in self.frozen_batchnorms(model):
            modules[n].eval()

    def summary(self, model: nn.Module) -> FreezeSummary:
        """Trainable parameter counts per prefix (as currently set by ``requires_grad``)."""
        named = list(model.named_parameters())
        per = {p: sum(t.numel() for n, t in named if _under(n, p) and t.requires_grad) for p in self.trainable}
        trainable = sum(t.numel() for _, t in named if t.requires_grad)
        frozen = sum(t.numel() for _, t in named if not t.requires_grad)
        return FreezeSummary(per_prefix=per, trainable=trainable, frozen=frozen,
                             frozen_batchnorms=self.frozen_batchnorms(model))


class CallablePolicy:
    """Adapts ``fn(model) -> iterable of trainable params`` to the FreezePolicy interface.

    Parameters not returned get ``requires_grad = False``; a BatchNorm whose
    affine parameters are all frozen counts as frozen (one without affine
    parameters cannot be judged and keeps the ordinary train/eval behaviour).
    """

    def __init__(self, fn: Callable[[nn.Module], Iterable[nn.Parameter]]):
        self.fn = fn
        self._frozen_bn: List[str] = []

    def apply(self, model: nn.Module) -> List[nn.Parameter]:
        chosen = list(self.fn(model))
        ids = {id(p) for p in chosen}
        own = {id(p) for p in model.parameters()}
        if not chosen:
            raise ValueError("param_filter returned no parameters; nothing would train")
        if not ids <= own:
            raise ValueError("param_filter returned parameters that are not in the model")
        for p in model.parameters():
            p.requires_grad_(id(p) in ids)
        self._frozen_bn = [n for n, m in model.named_modules() if isinstance(m, _BatchNorm)
                           and any(True for _ in m.parameters(recurse=False))
                           and not any(p.requires_grad for p in m.parameters(recurse=False))]
        return [p for p in model.parameters() if id(p) in ids]

    def train_mode(self, model: nn.Module) -> None:
        model.train()
        modules = dict(model.named_modules())
        for n in self._frozen_bn:
            modules[n].eval()


class TrainAll:
    """The default policy: the parameters that already require grad (all, in a fresh
    model) train; ``model.train()`` as usual."""

    def apply(self, model: nn.Module) -> List[nn.Parameter]:
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError(f"{type(model).__name__} has no parameter with requires_grad=True; nothing would train")
        return params

    def train_mode(self, model: nn.Module) -> None:
        model.train()


PolicyLike = Union[None, FreezePolicy, Callable[[nn.Module], Iterable[nn.Parameter]]]


def resolve_policy(policy: PolicyLike):
    """None -> :class:`TrainAll`; a FreezePolicy as is; a callable -> :class:`CallablePolicy`."""
    if policy is None:
        return TrainAll()
    if hasattr(policy, "apply") and hasattr(policy, "train_mode"):
        return policy
    if callable(policy):
        return CallablePolicy(policy)
    raise TypeError(f"param_filter must be None, a FreezePolicy or callable(model) -> params, "
                    f"got {type(policy).__name__}")
