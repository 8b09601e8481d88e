"""The one exception the data layer raises for bad input files."""
from __future__ import annotations

from typing import Optional


class DataFormatError(ValueError):
    """A dataset file is missing, malformed or inconsistent.

    The message always starts with the file (and the key or field when one is
    at fault): ``"<path> [vehicles.4306.extent]: expected 3 numbers, got 2"``.
    ``path``, ``key`` and ``problem`` stay available as attributes.
    """

    def __init__(self, path, problem: str, key: Optional[str] = None):
        self.path = str(path)
        self.key = key
        self.problem = problem
        where = self.path if key is None else f"{self.path} [{key}]"
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):  # keep pickling (DataLoader workers) working
        return (type(self), (self.path, self.problem, self.key))


def not_utf8(path, exc: UnicodeDecodeError) -> DataFormatError:
    """The DataFormatError for a text file with bytes that are not UTF-8."""
    return DataFormatError(path, f"not UTF-8 text: byte {exc.object[exc.start]:#04x} at offset {exc.start}")


class SkippedFrame(DataFormatError):
    """A frame a ``skip_bad`` reader found bad (and logged once): the caller leaves it out."""
