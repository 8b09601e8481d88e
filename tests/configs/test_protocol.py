"""docs/protocol.md's tables against the GPU configs: every row's "ours" value must be what the
matched experiment configs resolve to, a row without a "why" must equal its reference value,
and every experiment must be covered for the protocol's core keys and for each agent type."""
import fnmatch
import re
from pathlib import Path

import pytest
import yaml

from opencood_ext.config import config_to_dict
from opencood_ext.experiment import load_experiment

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"
FAMILIES = ("opv2v_h", "dairv2x", "v2xreal")
CORE_KEYS = ("data.lidar_range", "data.comm_range", "data.max_agents", "data.augment.enabled", "train.epochs",
             "train.lr", "train.batch_size", "train.lr_scheduler", "model.fusion_op", "model.anchors.sizes")
_SECTION = re.compile(r"^## .*\(`configs/([\w-]+)`\)\s*$")
_CODE = re.compile(r"^`([^`]*)`$")
_ABSENT = object()


def parse_tables(text: str):
    """-> {family: [row dict]}; each row: key, configs, ours, reference, source, why, line."""
    tables, family = {}, None
    for n, line in enumerate(text.splitlines(), 1):
        m = _SECTION.match(line)
        if m:
            family = m.group(1)
            tables[family] = []
            continue
        if line.startswith("## "):
            family = None
        if family is None or not line.startswith("|") or line.startswith("| key ") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6:
            raise AssertionError(f"docs/protocol.md:{n}: a row needs 6 cells, got {len(cells)}")
        key, configs, ours, reference, source, why = cells
        tables[family].append(dict(key=_code(key, n), configs=_code(configs, n), ours=ours, reference=reference,
                                   source=source, why=why, line=n))
    return tables


def _code(cell: str, n: int) -> str:
    m = _CODE.match(cell)
    if not m:
        raise AssertionError(f"docs/protocol.md:{n}: expected a `code` cell, got {cell!r}")
    return m.group(1)


def _value(cell: str, n: int):
    return yaml.safe_load(_code(cell, n))


def same(a, b) -> bool:
    """YAML values equal up to 1e-9 for numbers, case for strings, list/tuple kind."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= 1e-9
    if isinstance(a, str) and isinstance(b, str):
        return a.casefold() == b.casefold()
    return a == b


def lookup(d: dict, key: str):
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return _ABSENT
        d = d[part]
    return d


def matches(name: str, patterns: str) -> bool:
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    return any(fnmatch.fnmatch(name, p) for p in pats if not p.startswith("!")) and \
        not any(fnmatch.fnmatch(name, p[1:]) for p in pats if p.startswith("!"))


def experiments(family: str):
    paths = sorted((ROOT / "configs" / family).glob("*.yaml"))
    return [p for p in paths if "name" in (yaml.safe_load(p.read_text()) or {})]


def check_family(rows, resolved: dict) -> list:
    """Problems of one family's rows against ``{config name: resolved dict}``; empty when all agree."""
    problems = []
    covered = {name: set() for name in resolved}
    for row in rows:
        where = f"docs/protocol.md:{row['line']} ({row['key']})"
        if row["key"] == "-":
            if not row["why"]:
                problems.append(f"{where}: a row without a config key must say why")
            continue
        if not row["why"]:
            ours, ref = _value(row["ours"], row["line"]), _value(row["reference"], row["line"])
            if not same(ours, ref):
                problems.append(f"{where}: ours {ours!r} differs from the reference {ref!r} and no why is given")
        ours = _value(row["ours"], row["line"])
        hits = 0
        for name, cfg in resolved.items():
            if not matches(name, row["configs"]):
                continue
            value = lookup(cfg, row["key"])
            if value is _ABSENT:
                continue
            hits += 1
            covered[name].add(row["key"])
            if not same(value, ours):
                problems.append(f"{where}: {name}.yaml has {value!r}, the table says {ours!r}")
        if not hits:
            problems.append(f"{where}: matches no config that has the key ({row['configs']})")
    for name, keys in covered.items():
        for key in CORE_KEYS:  # a row on a whole mapping (data.augment) covers its keys
            if not any(key == k or key.startswith(k + ".") for k in keys):
                problems.append(f"{name}.yaml: no docs/protocol.md row covers {key}")
        for t in resolved[name]["model"].get("agent_types", {}):
            for part in ("encoder", "backbone"):
                prefix = f"model.agent_types.{t}.{part}"
                if not any(k == prefix or k.startswith(prefix + ".") for k in keys):
                    problems.append(f"{name}.yaml: no docs/protocol.md row covers {prefix}")
    return problems


def _resolve(family: str, overrides=()):
    return {p.stem: config_to_dict(load_experiment(p, overrides)) for p in experiments(family)}


TABLES = parse_tables(DOC.read_text())


def test_every_gpu_family_has_a_table():
    assert set(FAMILIES) <= set(TABLES)
    for family in FAMILIES:
        assert len(TABLES[family]) >= 30 and experiments(family)


@pytest.mark.parametrize("family", FAMILIES)
def test_configs_follow_the_protocol_table(family):
    assert check_family(TABLES[family], _resolve(family)) == []


def test_a_drifting_config_fails():
    """An edit to a config (here through --set) that leaves the table behind is reported by row,
    and so is a table row that claims the reference's value while differing from it."""
    problems = check_family(TABLES["dairv2x"], _resolve("dairv2x", ["data.comm_range=50", "train.epochs=31"]))
    assert any("data.comm_range" in p and "50" in p for p in problems)
    assert any("train.epochs" in p and "31" in p for p in problems)
    rows = [dict(r) for r in TABLES["v2xreal"]]
    row = next(r for r in rows if r["key"] == "data.comm_range")
    row["ours"] = "`100.0`"
    problems = check_family(rows, _resolve("v2xreal"))
    assert any("differs from the reference" in p for p in problems)
    assert any("m1_intermediate.yaml has 70.0, the table says 100.0" in p for p in problems)
    # a config that adds a type without a row for its encoder is reported too
    resolved = _resolve("dairv2x")
    resolved["m1_none"]["model"]["agent_types"]["m9"] = {"encoder": {}, "backbone": {}}
    assert any("model.agent_types.m9.encoder" in p for p in check_family(TABLES["dairv2x"], resolved))


def test_protocol_values_that_matter_most():
    """The ranges the issue named, read from the table itself (not only through the checker)."""
    def ours(family, key, configs="`*`"):
        row = next(r for r in TABLES[family] if r["key"] == key and r["configs"].startswith(configs.strip("`")))
        return _value(row["ours"], row["line"])
    assert ours("opv2v_h", "data.lidar_range")[1::3] == [-51.2, 51.2]
    assert ours("dairv2x", "data.lidar_range")[1::3] == [-51.2, 51.2]
    assert ours("v2xreal", "data.lidar_range") == [-102.4, -51.2, -15.0, 102.4, 51.2, 15.0]
