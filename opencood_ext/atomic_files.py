"""Files replaced atomically: a temporary file in the same folder, fsynced, then ``os.replace``d
over the target and the folder fsynced, so a reader (or a resume after SIGKILL or a full disk) sees the
old file or the new one, never half of one. No torch here: the simulator writes its markers with it."""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (tmp file in the same folder + os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies, unlike mkstemp's 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform / filesystem: the replace itself is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_json(path: str | os.PathLike, data, **dumps) -> None:
    """``data`` as JSON text (``json.dumps(data, **dumps)`` and a newline), written atomically."""
    atomic_write_bytes(path, (json.dumps(data, **dumps) + "\n").encode("utf-8"))
