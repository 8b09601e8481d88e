"""One step of the experiment driver: a command-line program's ``main(argv)`` run in this process.

A :class:`Command` names the program by its console script (``gencomm-train``) and holds its
arguments; :func:`call` runs it in-process (no subprocess, no source checkout needed), with the
process state a program may change (working directory, torch's thread count and grad mode, the
python / numpy / torch random states, the root logger) restored afterwards, so one step never
leaks into the next. A nonzero exit status, an argparse exit or an exception stops the job with a
:class:`StepError` whose one line holds the step's command line.

Resuming is the programs' own business, one rule each: ``gencomm-train`` skips a finished run,
``gencomm-sim`` finished scenarios, and ``gencomm-infer --reuse`` an evaluation whose stamp (command,
code, the run's files and the test data; :class:`opencood_ext.run_folder.RunFolder`) is current.
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import shlex
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

import gencomm  # noqa: F401  (registers the GenComm link and onboarding method the steps train)

log = logging.getLogger(__name__)

Main = Callable[[List[str]], int]


def _loader(module: str) -> Callable[[], Main]:
    """Imports ``module`` when called (a program's imports are paid only when it runs)."""
    def load() -> Main:
        return import_module(module).main
    return load


# console script -> loader of its main(argv); the driver imports gencomm above, so every program
# knows the GenComm link and onboarding method
PROGRAMS: Dict[str, Callable[[], Main]] = {
    "gencomm-sim": _loader("opencood_ext.cli.simulate"),
    "gencomm-train": _loader("opencood_ext.cli.train"),
    "gencomm-infer": _loader("opencood_ext.cli.inference"),
    "gencomm-onboard": _loader("opencood_ext.cli.onboard"),
    "gencomm-robustness": _loader("opencood_ext.cli.robustness"),
}


class StepError(RuntimeError):
    """A step that failed; the message is one line holding the step's command line."""


@dataclass(frozen=True)
class Command:
    """A program of :data:`PROGRAMS` and its arguments."""

    program: str
    argv: Tuple[str, ...]

    def __post_init__(self):
        if self.program not in PROGRAMS:
            raise ValueError(f"unknown program {self.program!r}; known: {', '.join(sorted(PROGRAMS))}")
        object.__setattr__(self, "argv", tuple(str(a) for a in self.argv))

    def words(self) -> List[str]:
        """The equivalent command line as words."""
        return [self.program, *self.argv]

    def line(self) -> str:
        """The equivalent shell command line, e.g. ``gencomm-train -y configs/sim/m1_none.yaml ...``."""
        return shlex.join(self.words())

    def __contains__(self, word: str) -> bool:
        return word in self.argv

    def value(self, flag: str) -> str:
        """The word after ``flag`` (its first occurrence)."""
        return self.argv[self.argv.index(flag) + 1]


def sets(items: Sequence[str]) -> List[str]:
    """``["a=1", "b=2"]`` -> ``["--set", "a=1", "--set", "b=2"]``."""
    return [a for item in items for a in ("--set", item)]


def cache_flag(feature_cache: Optional[str]) -> List[str]:
    """``--feature_cache DIR`` for a step that keeps frozen encoders' features there, else nothing."""
    return [] if feature_cache is None else ["--feature_cache", str(feature_cache)]


def onboard_command(config: Path, ego: Path, new: Sequence[Path], run: Path, overrides: Sequence[str],
                    feature_cache: Optional[str] = None, epochs: Optional[int] = None) -> Command:
    """The ``gencomm-onboard`` command of one onboarding: ``config`` onboards the types of the stage-1 runs
    ``new`` into the alliance of ``ego``'s into ``run``; ``overrides``: its ``--set`` items; ``epochs``: its
    ``--epochs`` (None: the config's). The main table, the benchmark and the side-by-side lanes all build it
    here, so a lane's onboarding is the very command the sequential step then finds finished."""
    argv = ["-y", config, "--ego", ego, *[a for n in new for a in ("--new", n)], "-o", run,
            *cache_flag(feature_cache), *sets(overrides)]
    return Command("gencomm-onboard", argv + ([] if epochs is None else ["--epochs", str(epochs)]))


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Restores, after the block, the process state a command-line program may change."""
    cwd = os.getcwd()
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        root.setLevel(level)
        root.handlers[:] = handlers


def call(cmd: Command) -> None:
    """Run ``cmd``'s main in this process; raises :class:`StepError` unless it returns 0."""
    log.info("$ %s", cmd.line())
    main = PROGRAMS[cmd.program]()
    with isolated():
        try:
            status = main(list(cmd.argv))
        except SystemExit as exc:  # argparse (exit 2 with its own one-line message)
            status = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # a bug in the step: its traceback, then the job stops on one line
            log.exception("step raised %s: %s", type(exc).__name__, cmd.line())
            raise StepError(f"step failed ({type(exc).__name__}: {' '.join(str(exc).split())}): {cmd.line()}") \
                from exc
    if status not in (0, None):
        raise StepError(f"step failed (exit {status}): {cmd.line()}")
