"""Every tool that reads a checkpoint or an evaluation's records stops with one line and exit
status 2 on a truncated file, never a traceback: tools/robustness.py, tools/bench.py warp,
tools/compare.py (in process, and compare.py once as the real script)."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny_runs import PP, tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO " not in ln and " WARNING " not in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(f"tool_{name}", ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def truncated_run(tmp_path):
    """A run folder whose config is fine and whose checkpoint was cut off halfway."""
    cfg = tiny_config(tmp_path, tmp_path / "data", "cut", {"m1": PP},
                      {"fusion": "intermediate", "link": {"type": "full_feature"}})
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(cfg, run / "config.yaml")
    ckpt = run / "checkpoints" / "best.pth"
    torch.save({"format_version": 2, "model": {"w": torch.zeros(4096)}}, ckpt)
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    return run, ckpt


def test_robustness_on_a_truncated_checkpoint(truncated_run, tmp_path, capsys):
    from opencood_ext.cli import robustness
    run, ckpt = truncated_run
    rc = robustness.main(["--runs", f"A={run}", "--sweep", "drop", "--drop", "0", "-o", str(tmp_path / "out"),
                          "--no_progress"])
    assert rc == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: ") and str(ckpt) in line
    assert not (tmp_path / "out").exists()


def test_bench_warp_on_a_truncated_checkpoint(truncated_run, capsys):
    run, ckpt = truncated_run
    assert _tool("bench").main(["warp", "--model_dir", str(run), "--max_frames", "1"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: ") and str(ckpt) in line


def test_bench_warp_on_a_missing_run(tmp_path, capsys):
    assert _tool("bench").main(["warp", "--model_dir", str(tmp_path / "nothing")]) == 2
    assert str(tmp_path / "nothing") in _one_line(capsys.readouterr().err)


def _records(run: Path, label: str) -> Path:
    """Real per-frame records (what tools/inference.py writes), two scenes of 40 frames."""
    from opencood_ext.eval.records import FrameRecords
    from opencood_ext.run_folder import RunFolder
    rng = np.random.default_rng(0)

    def boxes(n):
        b = np.zeros((n, 7))
        b[:, :2], b[:, 3:6] = rng.uniform(-30, 30, (n, 2)), (4.0, 1.8, 1.5)
        return b
    frames = [(boxes(30), rng.random(30), boxes(5), f"s{k % 2}", f"s{k % 2}/{k:06d}") for k in range(80)]
    return FrameRecords.from_detections(frames).save(RunFolder(run).frames(label))


@pytest.mark.parametrize("cut", ["half", "head", "member"])
def test_compare_on_a_truncated_npz(tmp_path, capsys, cut):
    from opencood_ext.cli import compare
    path = _records(tmp_path / "run", "x")
    data = path.read_bytes()
    if cut == "half":
        path.write_bytes(data[: len(data) // 2])
    elif cut == "head":
        path.write_bytes(data[:100])
    else:  # the zip directory intact, a member's compressed bytes scrambled
        mid = len(data) // 3
        path.write_bytes(data[:mid] + bytes(b ^ 0x5A for b in data[mid:mid + 200]) + data[mid + 200:])
    for spec in (str(tmp_path / "run"), f"{tmp_path / 'run'}:x"):
        assert compare.main([spec]) == 2
        line = _one_line(capsys.readouterr().err)
        assert line.startswith("error: ") and str(path) in line


def test_compare_script_on_a_truncated_npz(tmp_path):
    path = _records(tmp_path / "run", "x")
    path.write_bytes(path.read_bytes()[:-300])
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "compare.py"), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert str(path) in _one_line(proc.stderr) and proc.stdout == ""


def test_compare_still_reads_intact_records(tmp_path, capsys):
    from opencood_ext.cli import compare
    _records(tmp_path / "run", "x")
    assert compare.main([f"{tmp_path / 'run'}:x", "--resamples", "20"]) == 0
    assert "80 test frames of 2 scenes" in capsys.readouterr().out
