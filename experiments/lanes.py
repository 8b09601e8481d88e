"""The main job's independent trainings and onboardings side by side: ``gencomm-reproduce --jobs N``.

Every training run of one seed (the baselines, GenComm's stage-1 runs, the competitors' own stage-1 runs)
depends on the dataset alone, so they can train at the same time; every onboarding of one seed (GenComm's,
its variant's, each competitor's) depends on those stage-1 runs alone, so once they are trained the
onboardings can run at the same time too. On a CPU one process with two threads gains far less than two
processes with one thread each (a step's small convolutions and the data loader do not spread over
cores), so the main job runs N *lanes*, each a process doing one run after another on ``threads // N``
intra-op threads (:func:`lane_plan`): first the trainings, the longest first (:func:`train_side_by_side`),
then the onboardings (:func:`side_by_side` with :func:`experiments.pipeline.onboard_in_lane`).
Afterwards the job's sequential steps find these runs finished and go on (evaluations, robustness) on
every thread.

What each run trained with is recorded as always: every epoch record of its ``train_log.jsonl`` holds its
``threads``, so a lane's run compares with ``OMP_NUM_THREADS=<its threads> gencomm-train`` of the same config
and seed: for 3 short epochs of ``configs/sim/m1_none.yaml`` with one data-loader worker, a one-thread lane
and a plain one-thread run logged the same losses to every digit (session 36). A lane's failure stops the
job with the failed step's one-line :class:`~experiments.steps.StepError` after the other lanes' current
runs end; a rerun resumes them.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import torch

log = logging.getLogger(__name__)

MAX_LANES = 4  # beyond this a lane's share of a large machine's threads is what a run needs anyway


@dataclass(frozen=True)
class LanePlan:
    """``lanes`` processes training side by side, each on ``threads`` intra-op threads."""

    lanes: int
    threads: int

    def describe(self) -> str:
        return f"{self.lanes} at a time, {self.threads} thread{'s' if self.threads != 1 else ''} each"


def lane_plan(jobs: Optional[int] = None, threads: Optional[int] = None, cuda: Optional[bool] = None) -> LanePlan:
    """How the trainings share the machine. ``jobs``: lanes asked for (None: automatic, one per thread up to
    :data:`MAX_LANES`, and one on a CUDA machine, where runs would queue on one device); ``threads``: the
    threads this process may use (None: torch's count, which ``OMP_NUM_THREADS`` sets). Each lane gets
    ``threads // lanes`` of them, at least one; ``jobs`` above ``threads`` is cut to ``threads``."""
    threads = torch.get_num_threads() if threads is None else threads
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if jobs is not None and jobs < 1:
        raise ValueError(f"--jobs must be a positive whole number, got {jobs}")
    lanes = (1 if cuda else min(MAX_LANES, threads)) if jobs is None else min(jobs, threads)
    return LanePlan(lanes, max(1, threads // lanes))


def enter_lane(threads: int) -> None:
    """A lane process's thread share: torch's intra-op count and ``OMP_NUM_THREADS``, which the data
    loader's worker processes inherit.

    It also gives the lane back the platform's default start method. A process started by a ``spawn``
    context inherits ``spawn`` as its default, so a lane's data loader would spawn a fresh interpreter for
    its worker at every epoch's train and validation pass (seconds of imports each, and the worker's
    interpreter shutdown printing ``terminate called without an active exception``). With the default
    restored, a lane starts its workers as a plain ``gencomm-train`` does (``fork`` on Linux)."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    multiprocessing.set_start_method(None, force=True)


def side_by_side(tasks: Sequence[tuple], plan: LanePlan, work: Callable[..., Tuple[str, float]],
                 what: str = "runs") -> List[str]:
    """Do every task of ``tasks`` (in the order given: put the longest first) in ``plan.lanes`` processes;
    -> the names ``work`` returns, in the order given. ``work(*task, threads) -> (name, seconds)``: what a
    lane does with one task, in a lane process after :func:`enter_lane` (a module-level function: the lanes
    are spawned processes). One lane does every task here, in order. ``what``: the tasks in the log line."""
    if plan.lanes <= 1:
        return [work(*task, plan.threads)[0] for task in tasks]
    log.info("%d %s side by side, %s", len(tasks), what, plan.describe())
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=plan.lanes, mp_context=context) as pool:
        futures = [pool.submit(work, *task, plan.threads) for task in tasks]
        finished, pending = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in finished if f.exception() is not None]
        if failed:
            for f in pending:
                f.cancel()  # tasks not started yet stay for the rerun; the running ones end theirs
            raise failed[0].exception()
        done: List[str] = []
        for f in futures:
            name, wall = f.result()
            log.info("%s done (%.0f s)", name, wall)
            done.append(name)
    return done


def train_side_by_side(trainings: Sequence[Tuple[Path, Path]], data: Path, profile, plan: LanePlan,
                       work: Callable[..., Tuple[str, float]]) -> List[str]:
    """Train every ``(config, run folder)`` of ``trainings`` by :func:`side_by_side`; -> the run folders'
    names. Finished runs are skipped by ``gencomm-train`` itself, so a rerun costs seconds.
    ``work(config, run, data, profile, threads) -> (name, seconds)``
    (:func:`experiments.pipeline.train_in_lane`)."""
    return side_by_side([(config, run, data, profile) for config, run in trainings], plan, work, "trainings")
