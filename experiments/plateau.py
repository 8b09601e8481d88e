"""How far each trained model of a main job is from its plateau (REPORT.md, issue 51).

The learning curves (:mod:`experiments.curves`) call a run converged when doubling its budget lowers its
validation detection loss by less than 2 %. One run already holds the last doubling of its own budget: its
best validation detection loss over the first half of its epochs against the best over all of them (the
loss ``best.pth`` is selected on). A run whose loss still fell by 2 % or more over its second half is not at
its plateau, and its AP is a lower bound on what its method reaches with more training; the converged
budget itself comes from the learning curves (docs/learning_curves.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from .curves import CONVERGED_GAIN, epoch_records
from .tables import table


@dataclass(frozen=True)
class Plateau:
    """One training run's last doubling. epochs: validated epochs; half / end: the lowest validation
    detection loss over the first ``epochs // 2`` epochs / over all; gain: ``1 - end / half`` (how much the
    second half lowered it)."""

    run: str
    epochs: int
    half: float
    end: float

    @property
    def gain(self) -> float:
        return 1.0 - self.end / self.half

    @property
    def at_plateau(self) -> bool:
        return self.gain < CONVERGED_GAIN


def plateau_of(run: Path) -> Optional[Plateau]:
    """The last doubling of ``run``'s training (None: fewer than two validated epochs, e.g. late fusion of
    stage-1 models, which trains nothing)."""
    losses = [float(r["val_detection_loss"]) for r in epoch_records(run) if r.get("val_detection_loss") is not None]
    if len(losses) < 2:
        return None
    return Plateau(Path(run).name, len(losses), min(losses[:len(losses) // 2]), min(losses))


def plateau_section(runs: Sequence[tuple]) -> List[str]:
    """REPORT.md's section for ``runs``: (label, run folder) pairs; rows without two validated epochs are
    left out. [] when none has."""
    found = [(label, p) for label, run in runs if (p := plateau_of(Path(run))) is not None]
    if not found:
        return []
    cells = [[label, p.run, str(p.epochs), f"{p.half:.3f}", f"{p.end:.3f}", f"{100 * p.gain:.1f} %",
              "at its plateau" if p.at_plateau else "still improving"] for label, p in found]
    still = sum(not p.at_plateau for _, p in found)
    lines = ["## Distance from the plateau", "",
             "Each training run's last doubling: its lowest validation detection loss over the first half of its "
             "epochs against the lowest over all of them. Under "
             f"{100 * CONVERGED_GAIN:.0f} % lower, the learning curves' rule calls it converged; a run still "
             "improving has an AP below what its method reaches with more training.", ""]
    lines += table(["model", "run", "epochs", "loss, first half", "loss, all", "second half lowered it by",
                    "verdict"], cells)
    lines += ["", f"{still} of {len(found)} runs were still improving. The budget at which every method's loss "
              "and the ranking stop moving comes from the learning curves (`gencomm-curves`, "
              "docs/learning_curves.md).", ""]
    return lines
