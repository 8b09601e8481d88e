"""What the command-line tools do with a user's mistake: one line on stderr, exit status 2.

``USER_ERRORS`` are the exceptions that describe bad input (a config, a data file, a
checkpoint, a missing path) rather than a bug; their message already names the file and
the field, so a traceback would add nothing. Anything else still raises with its traceback.
"""
from __future__ import annotations

import contextlib
import pickle
import re
import sys
import zipfile
import zlib
from pathlib import Path

from opencood_ext.config import ConfigError
from opencood_ext.data.errors import DataFormatError
from opencood_ext.deps import MissingDependency
from opencood_ext.training.checkpoint import CheckpointError


class InputFileError(ValueError):
    """A file a tool reads (an evaluation's records, a results file) is truncated or not what it
    should be; the message names the file."""


USER_ERRORS = (ConfigError, DataFormatError, CheckpointError, FileNotFoundError, InputFileError,
               MissingDependency)  # an optional package this command needs (spconv, open3d) is absent
# what numpy / zipfile / json raise on a truncated or corrupt file they read
READ_ERRORS = (OSError, EOFError, zipfile.BadZipFile, zlib.error, pickle.UnpicklingError, ValueError, KeyError)
EXIT_USER_ERROR = 2
_EXC_PREFIX = re.compile(r"^[\w.]+(Error|Exception|Frame|Unavailable): ")


def one_line(exc: BaseException) -> str:
    """The exception's message on one line. An error that crossed a DataLoader worker
    carries the worker's traceback text: only its last line (the original message) is kept."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if any(ln.startswith("Original Traceback") for ln in lines):
        lines = [_EXC_PREFIX.sub("", lines[-1])]
    return "; ".join(lines) or type(exc).__name__


def report(exc: BaseException, hint: str = "") -> int:
    """Print ``error: <one line>`` (plus ``hint``) to stderr; returns the exit status 2."""
    print(f"error: {one_line(exc)}{hint}", file=sys.stderr, flush=True)
    return EXIT_USER_ERROR


def data_hint(exc: BaseException, skipping: bool) -> str:
    """For a bad data file met while running: how to leave such frames out."""
    if isinstance(exc, DataFormatError) and not skipping:
        return " (set data.skip_bad_frames=true to leave bad frames out)"
    return ""


@contextlib.contextmanager
def reading(path, what: str = "file"):
    """Turn a low-level read failure of ``path`` (truncated zip/npz, bad JSON, I/O error) into an
    :class:`InputFileError` naming it; a FileNotFoundError or a user error passes unchanged."""
    try:
        yield
    except USER_ERRORS:
        raise
    except READ_ERRORS as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        if str(path) not in detail:
            detail = f"{path}: {detail}"
        raise InputFileError(f"unreadable {what} ({type(exc).__name__}): {detail}") from None


def check_label(label, flag: str = "--label"):
    """``label`` (None passes) if it is a plain name: it becomes part of a file name in a run folder
    (eval_<label>.json), so it may not hold a path separator or be '.' / '..'. ValueError otherwise."""
    from opencood_ext.config import check_plain_name
    if label is None:
        return None
    return check_plain_name(label, flag)

