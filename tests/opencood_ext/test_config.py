"""Config loading: base includes, unknown keys, type checks, overrides, round trip."""
import os
from dataclasses import dataclass, field
from typing import List, Literal, Optional, Tuple

import pytest

from opencood_ext.config import ConfigError, config_to_dict, dump_config, load_config


@dataclass
class Optim:
    lr: float = 1e-3
    kind: Literal["adam", "sgd"] = "adam"


@dataclass
class Train:
    epochs: int = 1
    batch_size: int = 2
    optim: Optim = field(default_factory=Optim)
    milestones: List[int] = field(default_factory=list)


@dataclass
class Schema:
    name: str
    train: Train = field(default_factory=Train)
    lidar_range: Tuple[float, float, float, float, float, float] = (-1, -1, -1, 1, 1, 1)
    note: Optional[str] = None
    encoder: dict = field(default_factory=dict)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_base_merge_in_order_and_override(tmp_path):
    _write(tmp_path, "base/a.yaml", "name: a\ntrain: {epochs: 3, optim: {lr: 0.1}}\n")
    _write(tmp_path, "base/b.yaml", "train: {batch_size: 8}\nencoder: {type: pointpillars, c: 64}\n")
    cfg_path = _write(tmp_path, "exp.yaml", "base: [base/a.yaml, base/b.yaml]\ntrain: {optim: {kind: sgd}}\n")
    cfg = load_config(cfg_path, Schema)
    assert cfg.name == "a"
    assert cfg.train.epochs == 3 and cfg.train.batch_size == 8
    assert cfg.train.optim.lr == 0.1 and cfg.train.optim.kind == "sgd"
    assert cfg.encoder == {"type": "pointpillars", "c": 64}
    assert isinstance(cfg.lidar_range, tuple)


def test_unknown_key_names_file_path_and_closest(tmp_path):
    _write(tmp_path, "base.yaml", "name: x\ntrain: {epochs: 2}\n")
    p = _write(tmp_path, "exp.yaml", "base: base.yaml\ntrain: {optim: {lrr: 0.1}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(p, Schema)
    msg = str(err.value)
    assert str(p) in msg and "train.optim.lrr" in msg and "did you mean 'lr'" in msg


def test_unknown_key_in_base_names_the_base_file(tmp_path):
    base = _write(tmp_path, "base.yaml", "name: x\ntrain: {epoch: 2}\n")
    p = _write(tmp_path, "exp.yaml", "base: base.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_config(p, Schema)
    assert str(base) in str(err.value) and "did you mean 'epochs'" in str(err.value)


@pytest.mark.parametrize("text, fragment", [
    ("name: x\ntrain: {epochs: 2.5}\n", "expected an integer"),
    ("name: x\ntrain: {optim: {kind: adamw}}\n", "must be one of"),
    ("name: x\nlidar_range: [1, 2, 3]\n", "expected 6 values"),
    ("train: {epochs: 1}\n", "missing required key"),
    ("name: x\ntrain: [1, 2]\n", "expected a mapping"),
])
def test_type_errors(tmp_path, text, fragment):
    p = _write(tmp_path, "exp.yaml", text)
    with pytest.raises(ConfigError, match=fragment):
        load_config(p, Schema)


def test_set_overrides_are_type_checked(tmp_path):
    p = _write(tmp_path, "exp.yaml", "name: x\n")
    cfg = load_config(p, Schema, ["train.epochs=7", "train.optim.lr=2e-3", "note=hello"])
    assert cfg.train.epochs == 7 and cfg.train.optim.lr == 2e-3 and cfg.note == "hello"
    with pytest.raises(ConfigError, match="--set.*train.epochs"):
        load_config(p, Schema, ["train.epochs=many"])
    with pytest.raises(ConfigError, match="did you mean 'epochs'"):
        load_config(p, Schema, ["train.epoch=3"])
    with pytest.raises(ConfigError, match="KEY.PATH=VALUE"):
        load_config(p, Schema, ["train.epochs"])


def test_dump_and_reload_round_trip(tmp_path):
    p = _write(tmp_path, "exp.yaml", "name: x\ntrain: {milestones: [2, 4]}\nencoder: {type: lss}\n")
    cfg = load_config(p, Schema, ["train.batch_size=4"])
    out = tmp_path / "resolved.yaml"
    dump_config(cfg, out)
    again = load_config(out, Schema)
    assert again == cfg
    assert config_to_dict(again)["train"]["milestones"] == [2, 4]
    written = out.stat().st_mtime_ns
    os.utime(out, ns=(written - 10**9, written - 10**9))
    dump_config(cfg, out)  # the same config again (a resumed run): the file is left as it was
    assert out.stat().st_mtime_ns == written - 10**9
    dump_config(load_config(p, Schema, ["train.batch_size=8"]), out)  # another config is written
    assert load_config(out, Schema).train.batch_size == 8


def test_circular_base_and_missing_file(tmp_path):
    _write(tmp_path, "a.yaml", "base: b.yaml\n")
    _write(tmp_path, "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match="circular"):
        load_config(tmp_path / "a.yaml", Schema)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml", Schema)


def test_duplicate_keys_are_refused(tmp_path):
    p = _write(tmp_path, "dup.yaml", "name: x\ntrain: {epochs: 2}\ntrain: {batch_size: 3}\n")
    with pytest.raises(ConfigError, match="duplicate key 'train'"):
        load_config(p, Schema)
