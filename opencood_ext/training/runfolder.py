"""The run folder's write protocol, and what a (re)start does to make it consistent again.

Write order at the end of epoch N (rank 0)::

    1. the epoch record -> train_log.jsonl  (appended, flushed, fsynced)
    2. checkpoints/epoch_N.pth
    3. checkpoints/best.pth                 (when the validation score improved, selection.py)
    4. checkpoints/latest.pth               <- the commit point

Each file is replaced atomically (checkpoint.atomic_write_bytes), so a kill at
any instant leaves every file either old or new, plus at most a temporary file.
Everything written before latest.pth that latest.pth does not yet account for
(log records past its step, an epoch file or best.pth of the epoch being
saved) is "uncommitted" and is reconciled by :func:`prepare_run_folder` when
the run starts again:

* stale temporary files of dead writers are deleted;
* the newest intact checkpoint is the resume point: latest.pth, or, when it is
  missing or unreadable, the newest intact epoch_N.pth (logged as a warning);
* train_log.jsonl keeps only the records the resume point accounts for (no
  duplicate step or epoch records after a resume; a torn last line goes);
* best.pth is made to hold the epoch the resume point records as best: copied
  from that epoch's file, or removed when it came from an uncommitted epoch and
  that file is gone.

Nothing is changed before the check passes: the resume point is found by
reading only, and the clean-up above runs only after the caller's ``check``
(the Trainer loads the model, optimizer and scheduler states) has accepted it.
A checkpoint that does not fit the model leaves every file of the folder
byte-identical (the lock file's text included: :meth:`WriterLock.release`).

Imported weights (tools/import_weights.py writes them as best.pth, with a
field ``imported_from`` and no ``epoch``): without a resume point, a run starts
from them (fine-tuning) once they fit the model, and the file is renamed to
``checkpoints/imported.pth`` (its bytes unchanged), which training never
writes or removes; best.pth is then the best of the epochs trained here. A
restart before the first checkpoint starts from imported.pth again.

One writer at a time: rank 0 holds an exclusive lock on ``<run>/.writer.lock``
(:class:`WriterLock`) from the start until training ends. A second process
asked to train into the same folder stops with :class:`RunFolderBusy` before it
changes anything; the operating system drops the lock when its holder dies, so
a killed run never leaves the folder locked.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Callable, Optional, Tuple

from ..file_lock import HeldLock
from ..run_folder import CheckpointPaths, RunFolder
from .checkpoint import (CheckpointError, UnsafeCheckpointError, _fsync_dir, atomic_write_bytes,
                         load_checkpoint)
from .runlog import truncate_log
from .selection import recorded_best_epoch

log = logging.getLogger("opencood_ext.training")

_TMP_NAME = re.compile(r"^\..+\.(\d+)\.[0-9a-f]+\.tmp$")  # atomic_write_bytes' temporary files


class RunFolderBusy(CheckpointError):
    """Another live process is training into this run folder."""


class WriterLock:
    """Exclusive, non-blocking lock on ``<run_dir>/.writer.lock`` (:class:`~opencood_ext.file_lock.HeldLock`).

    Two trainers writing one folder would interleave train_log.jsonl records and checkpoints,
    and each one's resume clean-up would cut the other's log: the second stops with
    :class:`RunFolderBusy`, naming the holder, before it changes anything.
    """

    def __init__(self, run_dir: Path):
        def busy(holder: str) -> None:
            raise RunFolderBusy(f"{run_dir}: another process is training into this run folder "
                                f"({holder or 'an unknown process'}); two writers would interleave its "
                                "checkpoints and train_log.jsonl. Wait for it to finish, stop it, or give "
                                "another output folder") from None
        self._lock = HeldLock(RunFolder(run_dir).writer_lock, busy)

    def release(self, restore: bool = False) -> None:
        """Unlock. ``restore``: put the text the file held before back first (a start that
        failed its checks leaves every file of the folder as it found it)."""
        self._lock.release(self._lock.previous if restore else None)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours, and nothing of ours is writing while the run starts
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_tmp(*folders: Path) -> list:
    """Delete temporary files a killed writer left in ``folders``; returns their paths."""
    removed = []
    for folder in folders:
        if not Path(folder).is_dir():
            continue
        for p in Path(folder).iterdir():
            m = _TMP_NAME.match(p.name)
            if m and p.is_file() and not _pid_alive(int(m.group(1))):
                p.unlink(missing_ok=True)
                removed.append(p)
    if removed:
        log.warning("removed %d temporary file(s) a killed run left behind: %s", len(removed),
                    ", ".join(p.name for p in removed))
    return removed


def find_resume_state(paths: CheckpointPaths, map_location="cpu") -> Optional[Tuple[dict, Path]]:
    """``(state, file)`` of the newest intact checkpoint, or None for a fresh run.

    latest.pth first; when it is missing or unreadable, the newest intact epoch file
    (a warning names what was skipped). A file refused as unsafe is never skipped.
    """
    candidates = [paths.latest] + [p for _, p in sorted(paths.epoch_files().items(), reverse=True)]
    problems = []
    for path in candidates:
        if not path.is_file():
            continue
        try:
            state = load_checkpoint(path, map_location=map_location)
        except UnsafeCheckpointError:
            raise
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        if problems:
            log.warning("resuming from %s, the newest intact checkpoint; skipped: %s", path, "; ".join(problems))
        return state, path
    if problems:
        raise CheckpointError("no intact checkpoint to resume from: " + "; ".join(problems))
    return None


def _best_epoch(state: dict) -> Optional[int]:
    return recorded_best_epoch(state.get("history", []), state.get("best_val"))


def reconcile_best(paths: CheckpointPaths, state: Optional[dict]) -> None:
    """Make best.pth hold the epoch ``state`` (the resume point) records as best."""
    want = _best_epoch(state) if state else None
    have = None
    if paths.best.is_file():
        try:
            have = load_checkpoint(paths.best, required=("epoch",))["epoch"]
        except UnsafeCheckpointError:
            raise
        except CheckpointError as exc:
            log.warning("%s", exc)
            have = -1
    if have == want:
        return
    source = paths.epoch(want) if want is not None else None
    if source is not None and source.is_file():
        atomic_write_bytes(paths.best, source.read_bytes())
        log.warning("%s held epoch %s, but the resume point's best is epoch %d: restored it from %s",
                    paths.best, have, want, source.name)
    elif have is not None and (want is None or have == -1 or have > state["epoch"]):
        paths.best.unlink()
        log.warning("removed %s (epoch %s): it was not the best of the epochs the resume point records",
                    paths.best, have)


def find_imported_start(paths: CheckpointPaths, map_location="cpu") -> Optional[Tuple[dict, Path]]:
    """``(state, file)`` of the imported weights a fresh run in this folder starts from, or None.

    ``checkpoints/imported.pth`` once a run has started here; before that, the ``best.pth``
    tools/import_weights.py wrote (a field ``imported_from`` and no ``epoch``). Reads only.
    """
    if paths.best.is_file():
        try:
            state = load_checkpoint(paths.best, map_location=map_location, required=())
        except UnsafeCheckpointError:
            raise
        except CheckpointError:
            state = {}  # unreadable: not imported weights to start from (reconcile_best reports it)
        if "imported_from" in state and "epoch" not in state:
            if not isinstance(state.get("model"), dict):
                raise CheckpointError(f"{paths.best}: imported weights without a field 'model'")
            if paths.imported.is_file() and _differ(paths.imported, paths.best):
                raise CheckpointError(f"{paths.best}: holds imported weights ({state['imported_from']}) other "
                                      f"than {paths.imported.name}, which this run started from; move the "
                                      f"one not to train from out of {paths.dir}")
            return state, paths.best
    if paths.imported.is_file():
        return load_checkpoint(paths.imported, map_location=map_location, required=("model",)), paths.imported
    return None


def _differ(a: Path, b: Path) -> bool:
    try:
        return a.read_bytes() != b.read_bytes()
    except FileNotFoundError:  # rank 0 (another process) renamed best.pth meanwhile: the same file
        return False


def keep_imported(paths: CheckpointPaths, source: Path) -> None:
    """Make ``source`` (the imported best.pth) checkpoints/imported.pth: renamed, so its bytes stay
    as they are, and best.pth is left for the epochs this folder trains. A no-op for imported.pth."""
    if source == paths.imported:
        return
    if paths.imported.is_file():  # the same bytes (find_imported_start checked): best.pth is its copy
        source.unlink()
    else:
        os.replace(source, paths.imported)
        _fsync_dir(paths.dir)
    log.info("training starts from the imported weights; kept them as %s", paths.imported)


def prepare_run_folder(run_dir: Path, map_location="cpu", main: bool = True,
                       check: Optional[Callable[[Optional[Tuple[dict, Path]], Optional[Tuple[dict, Path]]], None]]
                       = None) -> Tuple[Optional[Tuple[dict, Path]], Optional[Tuple[dict, Path]]]:
    """Find the resume point (or, for a fresh run, the imported weights to start from), let
    ``check`` verify it, then clean up after a kill (see the module docstring).

    Returns ``(resume, imported)``: ``(state, file)`` or None each; ``imported`` only when
    there is no resume point. ``check(resume, imported)`` runs before any file changes: when it
    raises (e.g. the checkpoint does not fit the model), every file is left as it was. Every
    rank calls it (each loads the state); only ``main`` (rank 0) changes files.
    """
    paths = RunFolder(run_dir).checkpoints
    found = find_resume_state(paths, map_location)
    imported = None if found is not None else find_imported_start(paths, map_location)
    if check is not None:
        check(found, imported)
    if main:
        clean_stale_tmp(Path(run_dir), paths.dir)
        if imported is not None:
            keep_imported(paths, imported[1])
        state = found[0] if found else None
        truncate_log(run_dir, state["global_step"] if state else 0, state["epoch"] if state else 0)
        reconcile_best(paths, state)
    return found, imported
