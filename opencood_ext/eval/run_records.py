"""The per-frame records of evaluations in run folders (:class:`~opencood_ext.run_folder.RunFolder`),
and the paired comparison of two of them (``tools/compare.py``, :mod:`opencood_ext.cli.compare`)."""
from __future__ import annotations

from typing import Optional, Tuple

from ..run_folder import RunFolder
from .bootstrap import LEVEL, PairedDifference, paired_difference
from .records import FrameRecords


def load_eval_records(run_dir, label: Optional[str] = None) -> Tuple[str, FrameRecords]:
    """(label, records) of ``eval_<label>`` in ``run_dir``; without a label the folder must hold
    exactly one evaluation with records."""
    folder = RunFolder(run_dir)
    if label is None:
        labels = folder.evaluation_labels()
        if len(labels) != 1:
            raise ValueError(f"{run_dir}: {'no' if not labels else 'several'} evaluations with per-frame "
                             f"records ({', '.join(labels) or 'none'}); name one as RUN:LABEL")
        label = labels[0]
    return label, FrameRecords.load(folder.frames(label))


def compare_runs(run_a, run_b, label_a: Optional[str] = None, label_b: Optional[str] = None,
                 resamples: int = 1000, seed: int = 0, level: float = LEVEL) -> PairedDifference:
    """Paired ``AP(run_a) - AP(run_b)`` of two evaluations of the same frames, from their folders."""
    return paired_difference(load_eval_records(run_a, label_a)[1], load_eval_records(run_b, label_b)[1],
                             resamples, seed, level)
