"""What torch says about a file it will not open safely, made fit for a user: a TorchScript archive
recognised before ``torch.load`` sees it (which would hand it to ``torch.jit.load``, running its code, or
with ``weights_only=True`` advise loading it unsafely), and torch's advice to retry with
``weights_only=False`` taken out of its messages. Torch-free: no import of torch here."""
from __future__ import annotations

import re
import zipfile
from pathlib import Path


def is_torchscript(path) -> bool:
    """Whether ``path`` is a TorchScript archive: a zip whose records hold ``constants.pkl`` (the test
    torch.load itself makes before handing the file to torch.jit.load)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return any(name.split("/", 1)[-1] == "constants.pkl" for name in zf.namelist())
    except (zipfile.BadZipFile, OSError):
        return False  # not a zip: torch.load reports what it is


_ADVICE = re.compile(r"weights_only|arbitrary code|trusted source|Weights only load failed|torch\.jit\.load",
                     re.IGNORECASE)


def without_unsafe_advice(text: str) -> str:
    """``text`` on one line, without torch's sentences advising a load with ``weights_only=False`` (the
    unsafe load the refusal protects against) or through torch.jit.load."""
    text = " ".join(text.replace("\033[1m", "").replace("\033[0m", "").split())
    kept = [s for s in re.split(r"(?<=[.!?])\s+", text) if s and not _ADVICE.search(s)]
    return " ".join(kept)[:300] or "the safe loader refused it"
