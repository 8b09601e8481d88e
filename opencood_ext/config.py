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
import re
import types
import typing
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from .config_files import resolve_config
# reading the files is the first half (config_yaml); its names stay importable from here
from .config_yaml import (MAX_CONFIG_BYTES, MAX_YAML_NODES, ConfigError, _Prov, _UniqueKeyLoader,  # noqa: F401
                          apply_overrides, check_yaml_node, load_yaml_tree, parse_yaml, read_config_text,
                          safe_yaml)


class FieldError(ValueError):
    """A dataclass's own validation (``__post_init__``) naming the field(s) at fault, so the
    loader blames the file that set them: ``FieldError(msg, "lr")`` or, for a check across
    sections, ``FieldError(msg, ("data", "modality"), ("model", "agent_types"))`` (key paths
    relative to the dataclass; the first is the one the error names first)."""

    def __init__(self, msg: str, *keys):
        super().__init__(msg)
        self.keys: List[Tuple[str, ...]] = [tuple(k.split(".")) if isinstance(k, str) else tuple(k) for k in keys]


NONFINITE_OK = "nonfinite_ok"  # dataclass field metadata: this float field may be inf / nan
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


_PROVENANCE = "_config_provenance"  # attribute of a loaded config: which file set each key


def config_error(cfg, key: Sequence[str], msg) -> ConfigError:
    """A ConfigError about ``key`` (a key path, e.g. ``("model", "anchors")``) of a config that
    :func:`load_config` loaded, for a problem found after loading (a model or dataset that cannot be
    built): it names the file that set the key, or the config file itself for a key no file sets. A
    config built in code is named by its ``name``."""
    path = tuple(str(k) for k in key)
    prov = getattr(cfg, _PROVENANCE, None)
    if prov:
        return _err(prov, path, str(msg))
    return ConfigError(f"experiment '{getattr(cfg, 'name', '?')}': key '{'.'.join(path)}': {msg}")


def locate_config(path) -> Path:
    """``path`` when it exists (whatever it is: the reader says what is wrong with it), else the
    shipped config of that name (:func:`opencood_ext.config_files.resolve_config`: so
    ``opv2v_h/gencomm_stage1_m1`` works from any directory); ConfigError naming both places."""
    if Path(path).exists():
        return Path(path)
    try:
        return resolve_config(path)
    except FileNotFoundError as exc:
        raise ConfigError(str(exc)) from None


def load_config(path, schema, overrides: Sequence[str] = ()):
    """Load ``path`` -- a file, or a shipped config's name (:func:`locate_config`) -- with its ``base:``
    includes and ``--set`` overrides into ``schema``."""
    path = locate_config(path)
    data, prov = load_yaml_tree(path)
    prov[()] = str(Path(path).resolve())  # errors about the whole file name the file itself
    apply_overrides(data, prov, overrides)
    cfg = _build_dataclass(schema, data, (), prov)
    setattr(cfg, _PROVENANCE, prov)  # for config_error (not a field: never dumped, compared or printed)
    return cfg


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
