"""One writer at a time: an exclusive ``flock`` on a file whose text names its holder.

Two users, one primitive (torch-free, so the simulator starts without torch):

* the trainer's :class:`~opencood_ext.training.runfolder.WriterLock` on ``<run>/.writer.lock``: a
  second trainer of the same run folder gives up at once (it raises from ``busy``);
* the simulator's folder lock on ``<out>/.gencomm_sim/lock``: a second recorder of the same
  dataset waits its turn (``busy`` prints who holds it and returns).

The lock file stays in place (deleting it would let two processes lock two different files). The
operating system drops the lock when its holder dies, however it dies, so a killed writer never
leaves the folder locked; only its name may stay in the file's text.
"""
from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import Callable, Optional


class HeldLock:
    """Hold an exclusive lock on ``path`` (created with its folder) from construction to :meth:`release`.

    busy: called with the holder's text (``"pid N on HOST"``, or ``""`` when it wrote none) when
    another process holds the lock; raise from it to give up (nothing is left open), return from it
    to wait until the lock is free. Once held, the file names this process; :attr:`previous` is the
    text it held before."""

    def __init__(self, path: Path, busy: Callable[[str], None]):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a+", encoding="utf-8")
        try:
            try:
                fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._file.seek(0)
                busy(self._file.read().strip())
                fcntl.flock(self._file, fcntl.LOCK_EX)
        except BaseException:
            self._file.close()
            raise
        self._file.seek(0)
        self.previous: str = self._file.read()
        self._write(f"pid {os.getpid()} on {socket.gethostname()}\n")

    def _write(self, text: str) -> None:
        self._file.seek(0)
        self._file.truncate()
        self._file.write(text)
        self._file.flush()

    def release(self, text: Optional[str] = None) -> None:
        """Unlock (again: nothing). ``text``: what the file holds afterwards (None: this process's
        name stays, "" empties it, :attr:`previous` puts back what a start that failed its checks
        found)."""
        if self._file.closed:
            return
        if text is not None:
            self._write(text)
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()
