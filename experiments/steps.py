"""One step of the experiment driver: a command-line program's ``main(argv)`` run in this process.

A :class:`Command` names the program by its console script (``gencomm-train``) and holds its
arguments; :func:`run_step` runs it in-process (no subprocess, no source checkout needed), with the
process state a program may change (working directory, torch's thread count and grad mode, the
python / numpy / torch random states, the root logger) restored afterwards, so one step never
leaks into the next. A nonzero exit status, an argparse exit or an exception stops the job with a
:class:`StepError` whose one line holds the step's command line.

With a stamp, a step is skipped when the stamp records the same command, code and inputs
(:func:`step_inputs`) and its outputs exist: the resumability rule of the main job's evaluations.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
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
        """The equivalent command line as words (what a stamp records)."""
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


def _data_root(cmd: Command) -> Optional[Path]:
    """The data a command reads: its last ``--set data.root=...`` (later overrides win); with a
    ``test`` split folder, only that split (evaluations read nothing else)."""
    roots = [a.split("=", 1)[1] for a in cmd.argv if a.startswith("data.root=")]
    if not roots:
        return None
    root = Path(roots[-1])
    return root / "test" if (root / "test").is_dir() else root


def _listing(paths: Sequence[Path]) -> Tuple[str, int]:
    """(sha256 over path, size and mtime of every file under ``paths``, number of files); a missing
    path counts as an entry of its own, so its later appearance changes the digest."""
    h, n = hashlib.sha256(), 0
    for top in paths:
        top = Path(top)
        files = sorted(f for f in top.rglob("*") if f.is_file()) if top.is_dir() else [top] if top.is_file() else []
        if not files:
            h.update(f"missing {top}\n".encode())
        for f in files:
            st = f.stat()
            h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
            n += 1
    return h.hexdigest(), n


def source_packages() -> List[Path]:
    """The folders of the Python packages a step runs (found through their ``__file__``, so this
    works from a checkout and from an installed wheel alike)."""
    import experiments
    import opencood_ext
    return [Path(m.__file__).resolve().parent for m in (opencood_ext, gencomm, experiments)]


def code_digest() -> str:
    """sha256 over the Python sources of :func:`source_packages`, by path inside each package's
    parent: an edit there redoes the stamped steps, a change elsewhere (docs, tests) does not."""
    h = hashlib.sha256()
    for pkg in source_packages():
        for f in sorted(pkg.rglob("*.py")):
            h.update(f"{f.relative_to(pkg.parent)}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def step_inputs(cmd: Command, reads: Sequence[Path]) -> Optional[dict]:
    """What a step's result depends on: the command, the code, and every file it reads (the runs in
    ``reads`` and the data of its ``data.root``); None when the command names no data root."""
    data = _data_root(cmd)
    if data is None:
        return None
    digest, n = _listing([*reads, data])
    return {"command": cmd.words(), "code": code_digest(), "files": digest, "num_files": n}


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


def run_step(cmd: Command, stamp: Optional[Path] = None, reads: Sequence[Path] = (),
             makes: Sequence[Path] = ()) -> None:
    """Run one step. With ``stamp``: skipped when ``stamp`` records the same command, code and
    inputs (size and mtime of every file under ``reads`` and the command's data root) and every
    output in ``makes`` exists; after a run the stamp is (re)written. Evaluations pass one, so a
    resumed main job does not redo them; training steps need none (a finished run is skipped by
    ``gencomm-train`` itself)."""
    want = step_inputs(cmd, reads) if stamp is not None else None
    if want is not None and stamp.is_file() and all(Path(m).is_file() for m in makes):
        try:
            done = json.loads(stamp.read_text())
        except (OSError, ValueError):
            done = None
        if done == want:
            log.info("skip (done; command, code and inputs unchanged since %s): %s", stamp, cmd.line())
            return
    if want is not None:
        stamp.unlink(missing_ok=True)  # an interrupted rerun must not leave the old stamp on new outputs
    call(cmd)
    if want is not None:
        tmp = stamp.with_name(stamp.name + ".tmp")
        tmp.write_text(json.dumps(want, indent=1))
        os.replace(tmp, stamp)
