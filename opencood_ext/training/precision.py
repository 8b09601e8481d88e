"""Which float precision the main job trains and evaluates in, decided by detection (issue 30).

bfloat16 (``train.amp: bf16``) is worth taking on a CPU only where it has bf16 instructions
(``avx512_bf16`` or AMX's ``amx_bf16`` in /proc/cpuinfo's flags); elsewhere PyTorch emulates it,
slower than float32. And it is taken only once it is validated: every main-table AP difference
between bf16 and float32, paired on the same frames, has an interval that holds 0. Until such a
validation is recorded (``BF16_VALIDATED``), every machine runs float32 and says why.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import FrozenSet, Optional

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# set to the validation's archive folder once bf16 and float32 main tables agree (paired intervals hold 0)
BF16_VALIDATED: Optional[str] = None


@dataclass(frozen=True)
class Precision:
    """choice: "float32" or "bf16"; reason: why, in one sentence; cpu_bf16: the CPU has bf16 instructions."""

    choice: str
    reason: str
    cpu_bf16: bool

    def to_dict(self) -> dict:
        return asdict(self)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> FrozenSet[str]:
    """The first CPU's feature flags (empty where /proc/cpuinfo is absent, e.g. macOS)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def job_precision(flags: Optional[FrozenSet[str]] = None, validated: Optional[str] = BF16_VALIDATED) -> Precision:
    """The main job's precision on this machine (module docstring)."""
    flags = cpu_flags() if flags is None else flags
    have = sorted(f for f in BF16_FLAGS if f in flags)
    if not have:
        return Precision("float32", f"this CPU has no bf16 instructions ({' / '.join(BF16_FLAGS)} absent), "
                                    f"so bf16 would be emulated, slower than float32", False)
    if validated is None:
        return Precision("float32", f"the CPU has {', '.join(have)}, but bf16 is not yet validated against "
                                    f"float32 on the main table (paired AP intervals), so float32", True)
    return Precision("bf16", f"the CPU has {', '.join(have)} and bf16 matched float32 on the main table "
                             f"({validated})", True)
