"""What the command-line tools do with a user's mistake: one line on stderr, exit status 2.

``USER_ERRORS`` are the exceptions that describe bad input (a config, a data file, a
checkpoint, a missing path) rather than a bug; their message already names the file and
the field, so a traceback would add nothing. Anything else still raises with its traceback.
"""
from __future__ import annotations

import re
import sys

from opencood_ext.config import ConfigError
from opencood_ext.data.errors import DataFormatError
from opencood_ext.training.checkpoint import CheckpointError

USER_ERRORS = (ConfigError, DataFormatError, CheckpointError, FileNotFoundError)
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
