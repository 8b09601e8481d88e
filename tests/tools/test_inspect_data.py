"""tools/inspect_data.py run as a subprocess on the fixture and on a tiny written dataset."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.data.formats import write_opv2v_frame
from opencood_ext.data.frame import AgentObs, Frame, ObjectLabel
from opencood_ext.geometry import pose_to_matrix

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "inspect_data.py"
FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"


def _run(*args):
    proc = subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd="/")
    return proc


def _tiny_dataset(root: Path) -> Path:
    rng = np.random.default_rng(0)
    objects = {7: ObjectLabel(7, [12.0, 3.0, 0.0], [0, 0, 0.8], [0, 20.0, 0], [2.0, 0.9, 0.8]),
               8: ObjectLabel(8, [-5.0, -6.0, 0.0], [0, 0, 0.8], [0, -70.0, 0], [2.4, 1.0, 0.9], obj_type="Van")}
    agents = []
    for aid, pose, vis in ((5, [0, 0, 1.9, 0, 0, 0], [7]), (-2, [20, 10, 4.0, 0, 180, 0], [7, 8])):
        pts = np.column_stack([rng.normal(0, 15, (300, 3)), rng.uniform(0, 1, 300)]).astype(np.float32)
        agents.append(AgentObs(aid, "", pose_to_matrix(pose), pts, visible_ids=vis, lidar_pose=np.array(pose, float)))
    frame = Frame("2022_02_02_02_02_02", "000003", agents, objects)
    write_opv2v_frame(root, "test", frame)
    return root


def test_fixture_json_and_plot(tmp_path):
    root = FIXTURES / "v2xset_real"
    if not root.exists():
        pytest.skip("../shared/fixtures is not present (a user's clone)")
    out = tmp_path / "bev.png"
    proc = _run(root, "--format", "opv2v", "--split", "validate", "--json", "--plot", out)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["scenarios"] == ["2021_08_21_17_30_41"] and info["num_frames"] == 1
    (agent,) = info["frame"]["agents"]
    assert agent["id"] == 4279 and agent["points"] == 39719
    assert [c["image"] for c in agent["cameras"]] == [[600, 800, 3]] * 4
    assert info["frame"]["gt"] == {"total": 21, "by_class": {"Car": 21}}
    assert out.stat().st_size > 10_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _tool_module():
    spec = importlib.util.spec_from_file_location("inspect_data_tool", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_dataset_json_plot(tmp_path):
    root = _tiny_dataset(tmp_path / "data")
    out = tmp_path / "plots" / "tiny.png"
    proc = _run(root, "--format", "opv2v", "--split", "test", "--frame", "0", "--json", "--plot", out)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert [a["id"] for a in info["frame"]["agents"]] == [5, -2]
    assert [a["points"] for a in info["frame"]["agents"]] == [300, 300]
    assert info["frame"]["agents"][1]["position_in_ego"] == [20.0, 10.0, 2.1]
    assert info["frame"]["gt"] == {"total": 2, "by_class": {"Car": 1, "Van": 1}}
    assert out.stat().st_size > 5_000 and out.read_bytes()[:4] == b"\x89PNG"


def test_text_output_and_errors_in_process(tmp_path, capsys):
    """Same tool, called in-process (a subprocess costs a full interpreter start)."""
    tool = _tool_module()
    root = _tiny_dataset(tmp_path / "data")
    assert tool.main([str(root), "--format", "opv2v", "--split", "test"]) == 0
    out = capsys.readouterr().out
    assert "frames   1" in out and "agent     5 CAV" in out and "agent    -2 RSU" in out
    assert "ground truth: 2 boxes" in out
    assert tool.main([str(root), "--format", "opv2v", "--split", "train"]) == 2
    err = capsys.readouterr().err
    assert "split 'train' not found" in err and "['test']" in err
    assert tool.main([str(root), "--format", "opv2v", "--split", "test", "--frame", "5"]) == 2
    assert "out of range" in capsys.readouterr().err


def test_modality_json_next_to_the_data_names_the_types(tmp_path):
    from opencood_ext.data.formats import write_modality_json, write_opv2v_frame
    from opencood_ext.data.synthetic import make_frame
    frame = make_frame(seed=0, scenario="scn", timestamp="000001")
    write_opv2v_frame(tmp_path, "train", frame, write_cameras=False)
    write_modality_json(tmp_path / "modality_assignment.json", {"scn": {"10": "m1", "20": "m3", "30": "m2"}})
    tool = Path(__file__).resolve().parents[2] / "tools" / "inspect_data.py"
    out = subprocess.run([sys.executable, str(tool), str(tmp_path), "--format", "opv2v", "--split", "train", "--json"],
                         capture_output=True, text=True, check=True).stdout
    types = [a["type"] for a in json.loads(out)["frame"]["agents"]]
    assert types == ["m1", "m3", "m2"]
