"""The exceptions (and the one warning class) the data layer raises for bad input files."""
from __future__ import annotations

import re
from typing import Optional

_CLASS_PREFIX = re.compile(r"^[\w.]+(Error|Frame): ")  # "opencood_ext.data.errors.DataFormatError: "


class DataFormatError(ValueError):
    """A dataset file is missing, malformed or inconsistent.

    The message always starts with the file (and the key or field when one is
    at fault): ``"<path> [vehicles.4306.extent]: expected 3 numbers, got 2"``.
    ``path``, ``key`` and ``problem`` stay available as attributes.
    """

    def __init__(self, path, problem: Optional[str] = None, key: Optional[str] = None):
        if problem is None:
            # one argument: torch's DataLoader re-raising a worker's error with the worker's
            # traceback text; keep the type and just the original message (its last line)
            lines = [ln for ln in str(path).splitlines() if ln.strip()] or [""]
            text = _CLASS_PREFIX.sub("", lines[-1].strip())
            self.path, self.key, self.problem = text.split(": ", 1)[0], None, text
            self._args = (text,)
            super().__init__(text)
            return
        self._args = (path, problem, key)
        self.path = str(path)
        self.key = key
        self.problem = problem
        where = self.path if key is None else f"{self.path} [{key}]"
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):  # keep pickling (DataLoader workers) working
        return (type(self), self._args)


def not_utf8(path, exc: UnicodeDecodeError) -> DataFormatError:
    """The DataFormatError for a text file with bytes that are not UTF-8."""
    return DataFormatError(path, f"not UTF-8 text: byte {exc.object[exc.start]:#04x} at offset {exc.start}")


class SkippedFrame(DataFormatError):
    """A frame a ``skip_bad`` reader found bad (and logged once): the caller leaves it out."""


class DataFaultError(DataFormatError):
    """A data fault (:mod:`opencood_ext.data.faults`) refused under the strict setting
    (``data.strict`` or a reader's ``strict=True``): an agent file missing inside the
    agent's recording, a timestamp only some agents have, non-finite points."""


class DataFaultWarning(UserWarning):
    """The same data faults in the default (non-strict) setting: the data is read on,
    the fault is named (its file first) once by ``warnings.warn`` and logged as a WARNING."""
