"""What a results row states about the run behind it (issue 31): its protocol, training seed and
optimizer steps, read from the run folder (shared by the main table and the benchmark)."""
from __future__ import annotations

from pathlib import Path

from opencood_ext.run_folder import RunFolder
from opencood_ext.training.runlog import optimizer_steps


def run_facts(run: Path, trained: bool = True) -> dict:
    """A results row's ``protocol``, ``training_seed`` and ``optimizer_steps`` from run folder ``run``'s
    config and training log; ``trained`` False (a row built from stage-1 runs without training, e.g.
    late fusion of them: ``run`` is then a stage-1 run): 0 optimizer steps."""
    from opencood_ext.experiment import load_experiment
    cfg = load_experiment(RunFolder(run).config)
    return {"protocol": cfg.protocol, "training_seed": cfg.train.seed,
            "optimizer_steps": optimizer_steps(run) if trained else 0}
