"""YAML experiment files -> typed, validated dataclasses.

A config file is plain YAML whose keys mirror a dataclass schema::

    base: [../base/sim.yaml, ../base/train_cpu.yaml]   # merged in order, then this file
    train:
      epochs: 10

* ``base:`` (a path or a list of paths, relative to the file) is merged first;
  mappings merge recursively, everything else is replaced.
* Every key is checked against the schema: an unknown key fails with the file
  that set it, the key path and the closest valid key.
* Values are type-checked against the dataclass annotations (int, float, bool,
  str, Optional, Literal, List, Tuple, Dict, nested dataclasses). A float must be
  finite (``.inf`` / ``.nan`` are refused) unless its field opts out with
  ``field(metadata={NONFINITE_OK: True})``. A field typed
  ``dict`` is a component spec (``{type: name, ...constructor args}``) checked
  later by the registry that builds it.
* ``--set a.b=value`` overrides (value parsed as YAML) go through the same checks.
* :func:`dump_config` writes the resolved config back to YAML; loading that
  file gives the same object.

Adding a section: add a dataclass field to the experiment schema
(``opencood_ext.experiment.ExperimentConfig``); nothing else to register.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import stat
import types
import typing
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml


class ConfigError(ValueError):
    """A config problem; the message names the file and the key path."""


class FieldError(ValueError):
    """A dataclass's own validation (``__post_init__``) naming the field(s) at fault, so the
    loader blames the file that set them: ``FieldError(msg, "lr")`` or, for a check across
    sections, ``FieldError(msg, ("data", "modality"), ("model", "agent_types"))`` (key paths
    relative to the dataclass; the first is the one the error names first)."""

    def __init__(self, msg: str, *keys):
        super().__init__(msg)
        self.keys: List[Tuple[str, ...]] = [tuple(k.split(".")) if isinstance(k, str) else tuple(k) for k in keys]


NONFINITE_OK = "nonfinite_ok"  # dataclass field metadata: this float field may be inf / nan
MAX_CONFIG_BYTES = 1 << 20  # a config file (or a file it includes with base:) may hold at most 1 MiB
_PLAIN_NAME = re.compile(r"[^/\\\x00-\x1f\x7f]{1,200}")  # no path separator, no control character


def check_plain_name(value: str, what: str) -> str:
    """``value`` if it is one plain file-name component (no ``/`` or ``\\``, not ``.`` or ``..``, no
    control character, 1 to 200 characters): what a run name or an evaluation label must be, so the
    folder or file named after it stays inside its root. Else ValueError naming ``what``."""
    if not isinstance(value, str) or not _PLAIN_NAME.fullmatch(value) or value.strip() in (".", "..", ""):
        raise ValueError(f"{what} must be a plain name (no path separator '/' or '\\', not '.' or '..', no "
                         f"control character, 1 to 200 characters), got {value!r}")
    return value


_SCI_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_Prov = Dict[Tuple[str, ...], str]  # key path -> file (or "--set") that last set it


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


MAX_YAML_NODES = 100_000  # a config may expand to this many YAML nodes, every alias counted in full


def check_yaml_node(node, where: str) -> int:
    """Nodes ``node`` stands for once every alias is expanded. A recursive alias (an anchor
    used inside itself) or an expansion beyond MAX_YAML_NODES (alias fan-out, "billion
    laughs": 265 bytes can stand for millions of nodes) raises a ConfigError. Linear in the
    number of distinct nodes (sizes of shared nodes are memoised)."""
    sizes: Dict[int, int] = {}
    active: set = set()

    def size(n) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in active:
            raise ConfigError(f"{where}: line {n.start_mark.line + 1}: recursive YAML alias (an anchor used "
                              f"inside its own value)")
        active.add(id(n))
        if isinstance(n, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total = 1 + sum(size(v) for v in n.value)
        else:
            total = 1
        active.discard(id(n))
        if total > MAX_YAML_NODES:
            raise ConfigError(f"{where}: line {n.start_mark.line + 1}: YAML aliases expand this value to more than "
                              f"{MAX_YAML_NODES:,} nodes; write the values out instead of nesting aliases")
        sizes[id(n)] = total
        return total

    return size(node)


def _yaml_error(exc: yaml.YAMLError) -> str:
    """A YAML error as one line: the problem and where."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


def parse_yaml(text: str, where: str, loader_cls=None) -> Tuple[Any, Optional[yaml.Node]]:
    """(data, node graph) of YAML text, recursive aliases and alias fan-out refused before
    anything is constructed; ConfigError naming ``where`` on any problem. ``loader_cls``:
    a SafeLoader subclass (default: this module's, which refuses duplicate keys)."""
    loader = (loader_cls or _UniqueKeyLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        check_yaml_node(node, where)
        return loader.construct_document(node), node
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML: {_yaml_error(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{where}: YAML nested too deeply") from None
    finally:
        loader.dispose()


def safe_yaml(text: str, where: str):
    """The data of YAML text (duplicate keys refused; see :func:`parse_yaml`)."""
    return parse_yaml(text, where)[0]


def _check_config_file(path: Path) -> None:
    """A config file must be a regular file of at most MAX_CONFIG_BYTES (a device such as /dev/zero
    would be read until memory runs out; a FIFO would block)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path}: is a directory; give the experiment's .yaml file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path}: not a regular file (a device, pipe or socket); a config is a .yaml file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {st.st_size:,} bytes; a config file may hold at most {MAX_CONFIG_BYTES:,}")


def read_config_text(path: Path) -> str:
    """A config file's text; a missing file, a directory, a device or FIFO, a file over
    MAX_CONFIG_BYTES, non-UTF-8 bytes -> one-line ConfigError."""
    path = Path(path)
    _check_config_file(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)  # bounded even if the file grows after the check
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory; give the experiment's .yaml file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: more than {MAX_CONFIG_BYTES:,} bytes; a config file may hold at most that")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})") from None


def _read_yaml(path: Path) -> dict:
    data = safe_yaml(read_config_text(path), str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def _merge(dst: dict, src: dict, prov: _Prov, source: str, prefix: Tuple[str, ...] = ()) -> None:
    for key, value in src.items():
        path = prefix + (str(key),)
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            prov.setdefault(path, source)
            _merge(dst[key], value, prov, source, path)
        else:
            dst[key] = _deepcopy(value)
            for p in [p for p in prov if p[:len(path)] == path]:
                del prov[p]
            _mark(value, prov, source, path)


def _mark(value: Any, prov: _Prov, source: str, path: Tuple[str, ...]) -> None:
    prov[path] = source
    if isinstance(value, dict):
        for k, v in value.items():
            _mark(v, prov, source, path + (str(k),))


def _deepcopy(value):
    if isinstance(value, dict):
        return {k: _deepcopy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deepcopy(v) for v in value]
    return value


def load_yaml_tree(path, _seen: Optional[List[Path]] = None) -> Tuple[dict, _Prov]:
    """Read ``path`` with its ``base:`` includes merged; returns (dict, provenance)."""
    path = Path(path).resolve()
    seen = list(_seen or [])
    if path in seen:
        chain = " -> ".join(str(p) for p in seen + [path])
        raise ConfigError(f"circular base include: {chain}")
    data = _read_yaml(path)
    bases = data.pop("base", [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) and b.strip() for b in bases):
        raise ConfigError(f"{path}: key 'base': must be a path or a list of paths, got {bases!r}")
    merged: dict = {}
    prov: _Prov = {}
    for base in bases:
        base_path = path.parent / base
        try:
            _check_config_file(base_path)
        except ConfigError as exc:
            raise ConfigError(f"{path}: key 'base': cannot include {base!r}: {exc}") from None
        base_data, base_prov = load_yaml_tree(base_path, seen + [path])
        _merge(merged, base_data, prov, "")
        prov.update(base_prov)
    _merge(merged, data, prov, str(path))
    return merged, prov


def apply_overrides(data: dict, prov: _Prov, overrides: Sequence[str]) -> None:
    """Apply ``a.b.c=value`` strings (value parsed as YAML) in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE")
        key, raw = item.split("=", 1)
        keys = [k for k in key.strip().split(".") if k]
        if not keys:
            raise ConfigError(f"--set {item!r}: empty key")
        value = safe_yaml(raw, f"--set {item!r}: value")
        node = data
        for i, k in enumerate(keys[:-1]):
            nxt = node.get(k)
            if nxt is None:
                nxt = node[k] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(f"--set {item!r}: '{'.'.join(keys[:i + 1])}' is not a mapping")
            node = nxt
        node[keys[-1]] = value
        for p in [p for p in prov if p[:len(keys)] == tuple(keys)]:
            del prov[p]  # what the files set below this key is gone
        _mark(value, prov, "--set", tuple(keys))


def _where(prov: _Prov, path: Tuple[str, ...]) -> str:
    for n in range(len(path), -1, -1):
        src = prov.get(path[:n])
        if src:
            return src
    return "<defaults>"


def _err(prov: _Prov, path: Tuple[str, ...], msg: str) -> ConfigError:
    key = ".".join(path) or "<top level>"
    return ConfigError(f"{_where(prov, path)}: key '{key}': {msg}")


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value, tp, path: Tuple[str, ...], prov: _Prov, finite: bool = True):
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path, prov, finite)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:  # Optional[X]: X's own message says more
            raise errors[0]
        raise _err(prov, path, f"expected {_type_name(tp)}, got {value!r}")
    if origin is typing.Literal:
        if value not in args:
            close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _err(prov, path, f"must be one of {list(args)}, got {value!r}{hint}")
        return value
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, path, prov)
    if origin in (list, List) or tp is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise _err(prov, path, f"expected a list, got {value!r}")
        inner = args[0] if args else Any
        return [_convert(v, inner, path + (str(i),), prov, finite) for i, v in enumerate(value)]
    if origin in (tuple, Tuple) or tp is tuple:
        if not isinstance(value, (list, tuple)):
            raise _err(prov, path, f"expected a list, got {value!r}")
        if args and len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], path + (str(i),), prov, finite) for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise _err(prov, path, f"expected {len(args)} values, got {len(value)}: {value!r}")
        inner = args or (Any,) * len(value)
        return tuple(_convert(v, t, path + (str(i),), prov, finite) for i, (v, t) in enumerate(zip(value, inner)))
    if origin in (dict, Dict) or tp is dict:
        if not isinstance(value, dict):
            raise _err(prov, path, f"expected a mapping, got {value!r}")
        vt = args[1] if args else Any
        return {k: _convert(v, vt, path + (str(k),), prov, finite) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise _err(prov, path, f"expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _err(prov, path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _SCI_FLOAT.fullmatch(value.strip()):
            # PyYAML (YAML 1.1) reads `2e-3` as a string; accept it as the number meant.
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _err(prov, path, f"expected a number, got {value!r}")
        if finite and not math.isfinite(value):
            raise _err(prov, path, f"must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _err(prov, path, f"expected a string, got {value!r}")
        return value
    raise _err(prov, path, f"unsupported schema type {_type_name(tp)}")


def _build_dataclass(cls, value, path: Tuple[str, ...], prov: _Prov):
    if isinstance(value, cls):
        return value
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise _err(prov, path, f"expected a mapping for {cls.__name__}, got {value!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, val in value.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {sorted(fields)}"
            raise _err(prov, path + (str(key),), f"unknown key for {cls.__name__}{hint}")
        finite = not fields[key].metadata.get(NONFINITE_OK, False)
        kwargs[key] = _convert(val, hints[key], path + (str(key),), prov, finite)
    missing = [n for n, f in fields.items() if n not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise _err(prov, path, f"missing required key(s) {missing} for {cls.__name__}")
    try:
        obj = cls(**kwargs)
    except FieldError as exc:
        raise _field_err(prov, path, exc.keys, str(exc)) from None
    except (ValueError, TypeError) as exc:
        raise _field_err(prov, path, _blamed_keys(cls, value, str(exc)), str(exc)) from None
    return obj


def _blamed_keys(cls, value: dict, msg: str) -> List[Tuple[str, ...]]:
    """The key a dataclass's own validation error is about, read from its message: the first
    ``Class.field`` or ``field.sub.key`` (or, failing those, bare field name) it mentions, down to
    the deepest key the config sets (its provenance is then exact); [] when none is named."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    tokens = re.findall(r"[A-Za-z_]\w*(?:\.[A-Za-z_0-9]\w*)*", msg)
    ranked = ([t.split(".")[1:] for t in tokens if t.startswith(cls.__name__ + ".")]
              + [t.split(".") for t in tokens if "." in t]
              + [[t] for t in tokens])
    for parts in ranked:
        if not parts or parts[0] not in names:
            continue
        key, node = [], value
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                break
            key.append(part)
            node = node[part]
        return [tuple(key or parts[:1])]
    return []


def _field_err(prov: _Prov, path: Tuple[str, ...], keys: List[Tuple[str, ...]], msg: str) -> ConfigError:
    """A dataclass validation error blamed on the file that set ``keys[0]`` (below ``path``); the
    other keys it names are added with their files when those differ."""
    if not keys:
        return _err(prov, path, msg)
    first = path + keys[0]
    where = _where(prov, first)
    if prov.get(()) and not any(p[:len(first)] == first for p in prov):
        where = prov[()]  # a key no file sets (missing, or left at its default): the experiment's own file
    own = ".".join(keys[0]) + ": "
    if msg.startswith(own):  # the line names the key once
        msg = msg[len(own):]
    extra = [f"key '{'.'.join(path + k)}' from {_where(prov, path + k)}" for k in keys[1:]
             if _where(prov, path + k) != where]
    return ConfigError(f"{where}: key '{'.'.join(first)}': {msg}" + (f" ({'; '.join(extra)})" if extra else ""))


def config_from_dict(schema, data: dict, prov: Optional[_Prov] = None):
    """Validate and convert a plain dict into ``schema`` (a dataclass type)."""
    return _build_dataclass(schema, data, (), prov or {})


def load_config(path, schema, overrides: Sequence[str] = ()):
    """Load ``path`` (with ``base:`` includes and ``--set`` overrides) into ``schema``."""
    data, prov = load_yaml_tree(path)
    prov[()] = str(Path(path).resolve())  # errors about the whole file name the file itself
    apply_overrides(data, prov, overrides)
    return _build_dataclass(schema, data, (), prov)


def config_to_dict(obj) -> Any:
    """Dataclass tree -> plain YAML-able dict (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: config_to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, (list, tuple)):
        return [config_to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: config_to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def dump_config(obj, path) -> None:
    """Write the resolved config to ``path`` as YAML (atomically). A file that already holds exactly
    this text is left untouched, so resuming a run keeps its config's mtime (what a resumed main job
    checks before skipping an evaluation of the run)."""
    path = Path(path)
    text = yaml.safe_dump(config_to_dict(obj), sort_keys=False)
    if path.is_file() and path.read_text() == text:
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
