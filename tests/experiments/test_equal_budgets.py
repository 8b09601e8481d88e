"""Equal budgets (issue 31): for each joining alliance, every onboarding method of the simulator
configs trains the same optimizer steps on the same data: the same epochs, batch size, step cap,
modality and agent count (steps = epochs x ceil(train frames / batch size) on one dataset)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from experiments.benchmark import METHODS
from experiments.method_ids import GENCOMM_EGOTARGET
from opencood_ext.experiment import load_experiment

STAGE2 = Path(__file__).resolve().parents[2] / "configs" / "sim" / "stage2"


def _alliances():
    by = defaultdict(dict)
    for path in sorted(STAGE2.glob("*_m1_*.yaml")):
        method, alliance = path.stem.split("_m1_")
        by["m1_" + alliance][method] = path
    return by


ALLIANCES = _alliances()


def _budget(cfg):
    t = cfg.train
    return {"epochs": t.epochs, "batch_size": t.batch_size, "max_steps_per_epoch": t.max_steps_per_epoch,
            "modality": cfg.data.modality, "max_agents": cfg.data.max_agents, "root": cfg.data.root,
            "new_types": sorted(cfg.stage.new_types)}


def test_every_alliance_has_every_method():
    assert set(ALLIANCES) == {"m1_m2", "m1_m3", "m1_m2m3m4"}
    for alliance, methods in ALLIANCES.items():
        # every benchmark method, and GenComm's ego-encoder-target variant beside the faithful one
        assert set(methods) == {m for _, m in METHODS} | {GENCOMM_EGOTARGET}, alliance


@pytest.mark.parametrize("alliance", sorted(ALLIANCES))
def test_every_method_gets_the_same_steps_on_the_same_data(alliance):
    budgets = {m: _budget(load_experiment(p)) for m, p in ALLIANCES[alliance].items()}
    first = budgets["gencomm"]
    for method, budget in budgets.items():
        assert budget == first, f"{alliance}: {method} trains {budget}, GenComm {first}"
