"""In-process memo of parsed yaml files, so a process that reads the same frames many times (the
main job evaluates every test frame in some 80 evaluations) parses each agent yaml once.

PyYAML builds every number of a yaml in Python, even with its C scanner: about 3-8 ms for one
OPV2V agent yaml, eight of them per frame read. The memo keeps each parsed mapping as a pickle
(about 5 KB for an agent yaml; unpickling takes under 0.1 ms) keyed by the file's absolute path and
its state (size, modification and change time in ns, inode): a file that is rewritten, touched or
replaced misses and is parsed again. File times tick coarsely (a few ms on Linux), so a file changed
less than ``settle_ns`` (1 s) before it was read is parsed but not kept: a rewrite in the same tick
could otherwise leave its state unchanged. The change time cannot be set back by a program, so a
kept file's later change always shows. Every lookup returns new objects (unpickled), so a caller that
edits what it got changes neither the memo nor what the next caller gets. The memo is bounded by the
bytes of its pickles, least recently used first out; it holds nothing the process did not read, and
each DataLoader worker process has its own.
"""
from __future__ import annotations

import os
import pickle
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Optional, Tuple

FileKey = Tuple[str, int, int, int, int]  # absolute path, size, mtime_ns, ctime_ns, inode

DEFAULT_MAX_BYTES = 64 << 20  # ~12k agent yamls, several test splits of the main job
SETTLE_NS = 10 ** 9  # a file changed this recently is not kept (module docstring)


def file_key(path) -> Optional[FileKey]:
    """``path``'s identity and state, or None when it cannot be stat'ed (the parser then raises its
    own error naming the file)."""
    name = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(name)
    except OSError:
        return None
    return name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


class ParsedMemo:
    """LRU memo ``FileKey -> pickled dict``, at most ``max_bytes`` of pickles (module docstring).

    hits / misses count lookups in this process."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, settle_ns: int = SETTLE_NS):
        if int(max_bytes) < 0 or int(settle_ns) < 0:
            raise ValueError(f"ParsedMemo: max_bytes and settle_ns must be >= 0, got {max_bytes}, {settle_ns}")
        self.max_bytes = int(max_bytes)
        self.settle_ns = int(settle_ns)
        self._entries: "OrderedDict[FileKey, bytes]" = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def load(self, path, parse: Callable[[Path], dict]) -> dict:
        """``parse(path)``'s result for the file as it is now: from the memo when it holds it, else
        parsed (and kept if the file has settled). The caller owns what it gets."""
        now = time.time_ns()
        key = file_key(path)
        hit = self.get(key)
        if hit is not None:
            return hit
        data = parse(path)
        if key is not None and key[3] < now - self.settle_ns:
            self.put(key, data)
        return data

    def get(self, key: Optional[FileKey]) -> Optional[dict]:
        """A fresh copy of what was stored under ``key``, or None."""
        if key is None:
            return None
        with self._lock:
            blob = self._entries.get(key)
            if blob is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        return pickle.loads(blob)

    def put(self, key: Optional[FileKey], data: dict) -> None:
        """Keep ``data`` under ``key`` if the file still has the state ``key`` records (it was not
        rewritten while it was parsed) and its pickle fits; evicts the least recently used."""
        if key is None or file_key(key[0]) != key:
            return
        try:
            blob = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):
            return  # not plain data: parsed again next time
        if len(blob) > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._entries[key] = blob
            self._bytes += len(blob)
            while self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= len(dropped)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
