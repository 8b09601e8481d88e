"""Config files on disk -> one merged dict with provenance (the first half of config loading;
:mod:`opencood_ext.config` turns the dict into typed dataclasses).

* :func:`read_config_text`: a bounded, regular, UTF-8 file (anything else is a one-line ConfigError).
* :func:`parse_yaml`: safe YAML, duplicate keys, recursive aliases and alias fan-out refused.
* :func:`load_yaml_tree`: ``base:`` includes (relative to the including file) merged first, every
  key path remembering the file that last set it (``_Prov``), so errors blame the right file.
* :func:`apply_overrides`: ``--set a.b=value`` strings, recorded as set by ``--set``.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

class ConfigError(ValueError):
    """A config problem; the message names the file and the key path."""



MAX_CONFIG_BYTES = 1 << 20  # a config file (or a file it includes with base:) may hold at most 1 MiB
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


def _position(text: str, index: int) -> str:
    """'line L, column C' of character ``index`` of ``text`` (both counted from 1)."""
    line = text.count("\n", 0, index) + 1
    return f"line {line}, column {index - (text.rfind(chr(10), 0, index) + 1) + 1}"


def _yaml_error(exc: yaml.YAMLError, text: str = "") -> str:
    """A YAML error as one line: the problem and where."""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow, before any parsing
        return (f"character {exc.character:#04x} at {_position(text, exc.position)} is not allowed in YAML "
                f"(no control characters but tab and line breaks)")
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


def parse_yaml(text: str, where: str, loader_cls=None) -> Tuple[Any, Optional[yaml.Node]]:
    """(data, node graph) of YAML text, recursive aliases and alias fan-out refused before
    anything is constructed; ConfigError naming ``where`` on any problem. ``loader_cls``:
    a SafeLoader subclass (default: this module's, which refuses duplicate keys)."""
    try:
        loader = (loader_cls or _UniqueKeyLoader)(text)  # its reader refuses control characters at once
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML: {_yaml_error(exc, text)}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        check_yaml_node(node, where)
        return loader.construct_document(node), node
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML: {_yaml_error(exc, text)}") from None
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
    """A config file's text; a missing file, a directory, a device or FIFO, a kernel pseudo-file
    (/proc, /sys: regular by its mode, but its stated size is not what it reads), a file over
    MAX_CONFIG_BYTES, non-UTF-8 bytes -> one-line ConfigError."""
    path = Path(path)
    _check_config_file(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)  # bounded even if the file grows after the check
            size = os.fstat(fh.fileno()).st_size
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory; give the experiment's .yaml file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: more than {MAX_CONFIG_BYTES:,} bytes; a config file may hold at most that")
    if len(raw) != size:
        raise ConfigError(f"{path}: not a file on disk: its size says {size:,} bytes but it reads {len(raw):,} (a "
                          f"kernel pseudo-file such as /proc or /sys, or a file being rewritten); a config is a "
                          f".yaml file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})") from None


def _read_yaml(path: Path, text: Optional[str] = None) -> dict:
    data = safe_yaml(read_config_text(path) if text is None else text, str(path))
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


def load_yaml_tree(path, _seen: Optional[List[Path]] = None, _text: Optional[str] = None) -> Tuple[dict, _Prov]:
    """Read ``path`` (whose text the includer may have read: ``_text``) with its ``base:`` includes
    merged; returns (dict, provenance)."""
    path = Path(path).resolve()
    seen = list(_seen or [])
    if path in seen:
        chain = " -> ".join(str(p) for p in seen + [path])
        raise ConfigError(f"circular base include: {chain}")
    data = _read_yaml(path, _text)
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
            text = read_config_text(base_path)  # what it is and what it reads, blamed on this key
        except ConfigError as exc:
            raise ConfigError(f"{path}: key 'base': cannot include {base!r}: {exc}") from None
        base_data, base_prov = load_yaml_tree(base_path, seen + [path], text)
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
