"""The kinds of rule the hypes key table (:mod:`.hypes_keys`) gives a reference key, and its pattern syntax.

* :class:`Mapped` carried over exactly to ``target`` in our config;
* :class:`Approx` carried over to ``target``, but our module or procedure differs
  (the reason is printed with the converted config);
* :class:`Fixed` our implementation has exactly this behaviour: any other value
  is refused;
* :class:`Dropped` nothing to carry (bookkeeping, derived, or a no-op in the
  reference's intermediate-fusion pipeline); the reason is printed;
* :class:`Same` repeats another key or states a derivable width: the converter
  checks that it agrees and refuses the file otherwise;
* :class:`Refused` changes the reference's computation in a way this project
  cannot reproduce: the file is refused, naming the key and why.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union


@dataclass(frozen=True)
class Mapped:
    target: str


@dataclass(frozen=True)
class Approx:
    target: str
    reason: str


@dataclass(frozen=True)
class Fixed:
    allowed: Tuple
    what: str


@dataclass(frozen=True)
class Dropped:
    reason: str


@dataclass(frozen=True)
class Same:
    """A repeat of key ``other`` (``<m>`` / ``<k>`` as in this key), checked by the reader;
    or, with ``other`` None, a width the converter checks against the built model."""

    what: str
    other: Optional[str] = None


@dataclass(frozen=True)
class Refused:
    """The reference computes something with this key that this project cannot: refused (any value)."""

    reason: str


Rule = Union[Mapped, Approx, Fixed, Dropped, Same, Refused]

# placeholders: <m> a modality name, <k> one key, <rest> the rest of the path, <name:a|b> one of the choices
_SEGMENT = {"<m>": r"(?P<m>m\d+)", "<k>": r"(?P<k>[^.]+)", "<rest>": r"(?P<rest>.+)"}
_CHOICE = re.compile(r"<(\w+):([\w|]+)>\Z")


def _segment(s: str) -> str:
    choice = _CHOICE.match(s)
    if choice:
        return f"(?P<{choice[1]}>{choice[2]})"
    return _SEGMENT.get(s, re.escape(s))


def compile_pattern(pattern: str) -> "re.Pattern[str]":
    """A key pattern of the table (placeholders as above) -> a regex matching whole dotted paths."""
    return re.compile(r"\.".join(_segment(s) for s in pattern.split(".")) + r"\Z")


def other_key(rule: Same, segments: Dict[str, str]) -> Optional[str]:
    """The key a :class:`Same` rule repeats, with this key's ``<m>`` / ``<k>`` filled in."""
    if rule.other is None:
        return None
    return ".".join(segments.get(s[1:-1], s) if s in _SEGMENT else s for s in rule.other.split("."))
