"""Optional on-disk cache of decoded source files (``data.cache_dir``).

A reader given a :class:`DecodeCache` keeps what it decodes from a source file
(a point cloud's ``(N, 4)`` points, a yaml's labels) as numpy arrays in one
uncompressed ``.npz`` (a zip of ``.npy`` files) per source, so later epochs
read binary arrays instead of parsing text again.

Layout: ``<root>/<kind>/<k[:2]>/<k>-<mtime_ns>-<size>.npz`` where ``k`` hashes
the cache version, the kind, the decoding options and the source's absolute
path. An entry is valid only for the source's current modification time and
size (both in the name): touching or rewriting the source makes the next read
miss, decode the source again and replace the entry (older siblings are
removed). Writes go to a temporary file in the same folder, then
``os.replace``: readers never see half an entry, and concurrent DataLoader
workers writing the same entry are harmless. An unreadable or corrupt entry is
logged as a warning, deleted and decoded again; a cache folder that cannot be
written is warned about once and the data is simply not cached.
"""
from __future__ import annotations

import hashlib
import logging
import os
import uuid
import zipfile
from pathlib import Path
from typing import Callable, Dict, Optional

import numpy as np

log = logging.getLogger(__name__)

CACHE_VERSION = 1  # bump when a decoder's output changes
Arrays = Dict[str, np.ndarray]


class CacheEntry:
    """One source file's entry; made by :meth:`DecodeCache.entry`."""

    def __init__(self, cache: "DecodeCache", source: Path, folder: Path, key: str, stat: os.stat_result):
        self.cache, self.source, self.key = cache, source, key
        self._state = (stat.st_mtime_ns, stat.st_size)
        self.path = folder / f"{key}-{stat.st_mtime_ns}-{stat.st_size}.npz"

    def load(self) -> Optional[Arrays]:
        """The cached arrays, or None (absent, or corrupt: warned, deleted)."""
        try:
            with np.load(self.path, allow_pickle=False) as z:
                out = {name: z[name] for name in z.files}
        except (FileNotFoundError, NotADirectoryError):
            self.cache.misses += 1
            return None
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
            log.warning("cache entry %s (of %s) is unreadable (%s); decoding the source again",
                        self.path, self.source, exc)
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass  # rewritten (or left) by store()
            self.cache.misses += 1
            return None
        self.cache.hits += 1
        return out

    def store(self, arrays: Arrays) -> None:
        """Write atomically, unless the source changed while it was decoded."""
        if self.cache.read_only:
            return
        try:
            st = self.source.stat()
            if (st.st_mtime_ns, st.st_size) != self._state:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
            try:
                with open(tmp, "wb") as fh:
                    np.savez(fh, **arrays)
                os.replace(tmp, self.path)
            finally:
                tmp.unlink(missing_ok=True)
            for old in self.path.parent.glob(f"{self.key}-*.npz"):
                if old != self.path:
                    old.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot write the decode cache under %s (%s); going on without it",
                        self.cache.root, exc)
            self.cache.read_only = True


class DecodeCache:
    """Cache of decoded arrays under ``root`` (created on first write).

    ``hits`` / ``misses`` count lookups in this process (DataLoader workers
    each count their own).
    """

    def __init__(self, root):
        self.root = Path(root)
        self.hits = 0
        self.misses = 0
        self.read_only = False

    def entry(self, source, kind: str, options: str = "") -> Optional[CacheEntry]:
        """The entry of ``source`` for ``kind`` (e.g. ``"points"``) decoded with
        ``options``; None when the source cannot be stat'ed (the decoder then
        raises its own error naming the file)."""
        source = Path(source)
        try:
            st = source.stat()
        except OSError:
            return None
        key = hashlib.sha1(f"{CACHE_VERSION}|{kind}|{options}|{source.resolve()}".encode()).hexdigest()
        return CacheEntry(self, source, self.root / kind / key[:2], key, st)

    def arrays(self, source, kind: str, decode: Callable[[], Arrays], options: str = "") -> Arrays:
        """Cached arrays of ``source``, decoding (and storing) them on a miss."""
        entry = self.entry(source, kind, options)
        hit = entry.load() if entry is not None else None
        if hit is not None:
            return hit
        out = decode()
        if entry is not None:
            entry.store(out)
        return out

    def points(self, source, read: Callable[..., np.ndarray], **read_kwargs) -> np.ndarray:
        """``read(source, **read_kwargs)`` (a point-cloud reader), cached."""
        options = f"{getattr(read, '__module__', '')}.{getattr(read, '__qualname__', read)}|" + \
            ",".join(f"{k}={read_kwargs[k]!r}" for k in sorted(read_kwargs))
        return self.arrays(source, "points", lambda: {"points": read(source, **read_kwargs)},
                           options)["points"]
