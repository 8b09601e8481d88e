"""Read a HEAL / GenComm-reference hypes yaml as its own loader would, and sort its keys by rule.

The reference loads yamls with PyYAML's full loader plus a float resolver
for ``1e-10``-style numbers; a ``config.yaml`` saved in a reference run folder
may also hold ``!!python/...`` tags (numpy arrays the yaml parser added). Here:
a safe loader with the same float rule; python tags become inert
:class:`PythonObject` markers (never constructed); a key given twice keeps
the last value, as PyYAML does (the reference's own files repeat keys).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import yaml

from ..config import ConfigError, parse_yaml, read_config_text
from .hypes_keys import rule_for, strict_section
from .hypes_rules import Approx, Dropped, Fixed, Refused, Same, other_key

# a top-level key in any of these makes a yaml a hypes file (our schema has none of them)
MARKERS = ("root_dir", "yaml_parser", "train_params", "preprocess", "postprocess", "heter", "fusion",
           "cav_lidar_range", "lr_scheduler", "optimizer", "loss")


UNKNOWN = ("no rule in opencood_ext/interop/hypes_keys.py; the reference models converted here do not read "
           "it either")


def warning_line(source: str, path: str, why: str) -> str:
    return f"WARNING: {source}: key '{path}': not read by this project: {why}"


class HypesError(ConfigError):
    """The hypes file cannot be converted; the message lists every problem with file and key path."""


@dataclass(frozen=True)
class PythonObject:
    """Stands in for a ``!!python/...`` node of a saved reference config (never executed)."""

    tag: str


class _HypesLoader(yaml.SafeLoader):
    """SafeLoader + the reference's float rule + inert python tags (class-level tables copied on change)."""


_HypesLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"), list("-+0123456789."))
_HypesLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: PythonObject(suffix))


def _repeated_keys(node: yaml.Node, out: List[str]) -> List[str]:
    """``key (line n)`` of every mapping key given a second time, anywhere under ``node``."""
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    out.append(f"{key.value} (line {key.start_mark.line + 1})")
                seen.add(key.value)
            _repeated_keys(value, out)
    elif isinstance(node, yaml.SequenceNode):
        for value in node.value:
            _repeated_keys(value, out)
    return out


def read_yaml(path: Path) -> Tuple[dict, List[str]]:
    """-> (mapping, keys given twice)."""
    # the config loader's checks: unreadable files, recursive aliases and alias fan-out
    data, node = parse_yaml(read_config_text(Path(path)), str(path), _HypesLoader)
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data, _repeated_keys(node, [])


def is_hypes(data: dict) -> bool:
    """True for an OpenCOOD / HEAL / GenComm-reference yaml (not our experiment schema)."""
    model = data.get("model")
    return any(k in data for k in MARKERS) or (isinstance(model, dict) and "core_method" in model)


def flatten(data: Any, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """(dotted path, leaf value) of every leaf; lists, scalars and empty mappings are leaves."""
    if isinstance(data, dict) and data:
        for k, v in data.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, data


def same_value(a: Any, b: Any) -> bool:
    """Equality with a float tolerance (1e-3 absolute), through lists."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(float(a), float(b), abs_tol=1e-3)
    return a == b


@dataclass
class HypesReader:
    """The leaves of one hypes file, sorted by rule, with the problems found so far.

    ``get`` reads a key the converter carries over; ``refuse`` records a problem;
    :meth:`raise_problems` raises one :class:`HypesError` listing all of them.
    ``dropped``: (key path, why) of every key not read here (a :class:`Dropped` rule, or a key
    the table does not know); :meth:`warnings` words them, one line each.
    """

    data: dict
    source: str
    leaves: Dict[str, Any] = field(init=False)
    problems: List[str] = field(default_factory=list)
    approximations: List[Tuple[str, str]] = field(default_factory=list)
    dropped: List[Tuple[str, str]] = field(default_factory=list)

    def __post_init__(self):
        self.leaves = dict(flatten(self.data))
        for path, value in self.leaves.items():
            found = rule_for(path)
            if found is None:
                section = strict_section(path)
                if section is not None:
                    self.refuse(path, f"an argument the importer does not know, under {section}, whose "
                                      f"module may read it (hypes_keys.STRICT_SECTIONS)")
                else:
                    self.dropped.append((path, UNKNOWN))
                continue
            rule, segments = found
            if isinstance(rule, Refused):
                self.refuse(path, f"not supported: {rule.reason}")
            elif isinstance(value, PythonObject) and not isinstance(rule, Dropped):
                self.refuse(path, f"holds a python object (!!python/{value.tag}); write a plain value")
            elif isinstance(rule, Fixed):
                if not any(same_value(value, ok) for ok in rule.allowed):
                    allowed = " or ".join(repr(a) for a in rule.allowed)
                    self.refuse(path, f"value {value!r} not supported ({rule.what}: only {allowed})")
            elif isinstance(rule, Approx):
                self.approximations.append((path, rule.reason))
            elif isinstance(rule, Dropped):
                self.dropped.append((path, rule.reason))
            elif isinstance(rule, Same) and rule.other is not None:
                self.expect_same(path, other_key(rule, segments), f"{rule.what}: the two must agree")

    def has(self, path: str) -> bool:
        return path in self.leaves

    def get(self, path: str, default: Any = ...) -> Any:
        """The leaf at ``path`` (a key the table knows); ``default`` when absent, else a problem."""
        if rule_for(path) is None:
            raise KeyError(f"importer bug: {path} is not in hypes_keys.KEYS")
        if path in self.leaves:
            return self.leaves[path]
        if default is ...:
            self.refuse(path, "missing (required)")
            return None
        return default

    def children(self, path: str) -> List[str]:
        """Keys directly under the mapping at ``path`` (in file order)."""
        node: Any = self.data
        for k in path.split("."):
            node = node.get(k) if isinstance(node, dict) else None
        return [str(k) for k in node] if isinstance(node, dict) else []

    def refuse(self, path: str, reason: str) -> None:
        self.problems.append(f"{self.source}: key '{path}': {reason}")

    def expect_same(self, path: str, other: str, what: str) -> None:
        """``path`` (when present) must equal ``other``."""
        if path in self.leaves and other in self.leaves and not same_value(self.leaves[path], self.leaves[other]):
            self.refuse(path, f"is {self.leaves[path]!r} but {other} is {self.leaves[other]!r}; {what}")

    def warnings(self) -> List[str]:
        """``WARNING: FILE: key 'PATH': not read by this project: WHY``, one line per dropped key."""
        first: Dict[str, str] = {}
        for path, why in self.dropped:
            first.setdefault(path, why)
        return [warning_line(self.source, path, why) for path, why in first.items()]

    def raise_problems(self) -> None:
        if self.problems:
            lines = "\n  ".join(dict.fromkeys(self.problems))
            raise HypesError(f"{self.source}: cannot convert this hypes yaml; {len(set(self.problems))} "
                             f"unsupported key(s):\n  {lines}")
