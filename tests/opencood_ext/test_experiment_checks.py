"""Config errors found before anything is built name the config file and the key (issue 52 item 4c):
an inverted data.lidar_range (each axis), a backbone whose per-level lists differ in length, anchors
without sizes or rotations, a voxel size that does not divide the range, max_voxels < 1, a missing
model section and a misspelt or missing data.modality each exit gencomm-train with status 2 and one
line naming the file that set the key (a base include, --set) and the key; before, seven of them
named only the experiment ('experiment NAME: ...') and the modality typo blamed the data root."""
import copy
import sys
from pathlib import Path

import pytest
import yaml

from tiny_runs import PP, tiny_config, tiny_dataset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import train  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def base_config(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("checks")
    data = tiny_dataset(tmp / "data")
    path = tiny_config(tmp, data, "checks", {"m1": PP}, {"fusion": "intermediate", "link": {"type": "full_feature"}})
    return yaml.safe_load(path.read_text())


def _set(d: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for k in parents:
        d = d[k]
    if value is DELETE:
        del d[last]
    else:
        d[last] = value


DELETE = object()
M1 = "model.agent_types.m1"
CASES = [  # (key edited, value, key the error names, words)
    ("data.lidar_range", [32, -32, -3, -32, 32, 1], "data.lidar_range", "max <= min on x"),
    ("data.lidar_range", [-32, 32, -3, 32, -32, 1], "data.lidar_range", "max <= min on y"),
    ("data.lidar_range", [-32, -32, 1, 32, 32, -3], "data.lidar_range", "max <= min on z"),
    (f"{M1}.backbone.layer_nums", [1], f"{M1}.backbone.layer_nums", "need the same non-zero length"),
    ("model.anchors.rotations", [], "model.anchors.rotations", "rotations non-empty"),
    ("model.anchors.sizes", [[3.9, 1.6]], "model.anchors.sizes", "positive (l, w, h) triples"),
    (f"{M1}.encoder.voxel_size", [0.7, 0.7, 4.0], f"{M1}.encoder.voxel_size", "not a whole number of voxels"),
    ("data.agent_types.m1.max_voxels", 0, "data.agent_types.m1.max_voxels", "must be >= 1"),
    ("data.agent_types.m1.max_points_per_voxel", -1, "data.agent_types.m1.max_points_per_voxel", "must be >= 1"),
    ("model", DELETE, "model", "needs ['agent_types']"),
    ("data.modality", "al:m1", "data.modality", "did you mean 'all:'?"),
    ("data.modality", "assignment.json", "data.modality", "no modality assignment file"),
]


def _error_line(argv, capsys) -> str:
    capsys.readouterr()
    assert train.main(argv) == 2, argv
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO " not in ln and " WARNING " not in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("key,value,blamed,words", CASES, ids=[f"{c[0]}={c[1]}" for c in CASES])
def test_each_error_names_the_file_and_the_key(base_config, tmp_path, capsys, key, value, blamed, words):
    d = copy.deepcopy(base_config)
    _set(d, key, value)
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(d))
    line = _error_line(["-y", str(exp), "--model_dir", str(tmp_path / "run")], capsys)
    assert line.startswith(f"error: {exp}: key '{blamed}': ") and words in line, line
    assert "experiment 'checks'" not in line and not (tmp_path / "run").exists()


def test_a_value_set_in_a_base_file_or_by_set_is_blamed_there(base_config, tmp_path, capsys):
    d = copy.deepcopy(base_config)
    lidar_range = d["data"].pop("lidar_range")
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"data": {"lidar_range": [lidar_range[3], *lidar_range[1:3], lidar_range[0],
                                                             *lidar_range[4:]]}}))
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({"base": "base.yaml", **d}))
    line = _error_line(["-y", str(exp), "--model_dir", str(tmp_path / "run")], capsys)
    assert line.startswith(f"error: {base}: key 'data.lidar_range': ") and "max <= min on x" in line
    d["data"]["lidar_range"] = lidar_range
    exp.write_text(yaml.safe_dump(d))
    line = _error_line(["-y", str(exp), "--set", f"{M1}.backbone.num_filters=[8]", "--model_dir",
                        str(tmp_path / "run")], capsys)
    assert line.startswith(f"error: --set: key '{M1}.backbone.num_filters': ")
