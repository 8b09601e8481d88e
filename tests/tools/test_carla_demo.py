"""tools/carla_demo.py: the live demo on the built-in backend (no CARLA server
here) and recording from both backends into the same OPV2V-H layout."""
import json
import sys
from pathlib import Path

import carla
import pytest
import torch

from opencood_ext.comm.wire import HEADER_SIZE
from opencood_ext.data.formats import OPV2VReader
from tiny_runs import PP, one_step_gencomm_run, tiny_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import carla_demo  # noqa: E402

@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    torch.set_num_threads(2)
    return one_step_gencomm_run(tmp_path_factory.mktemp("demo_run"), "demo")


def _closed_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the socket is released


def test_live_demo_falls_back_to_builtin_and_writes_frames(trained_run, tmp_path, capsys):
    out = tmp_path / "live"
    rc = carla_demo.main(["live", "--model_dir", str(trained_run), "--ticks", "2", "--no_cameras", "--out", str(out),
                          "--port", str(_closed_port()), "--timeout", "1", "--latency", "1", "--agents", "3"])
    assert rc == 0
    captured = capsys.readouterr()
    assert "running the built-in world instead" in captured.err
    ticks = [ln for ln in captured.out.splitlines() if ln.startswith("tick")]
    assert len(ticks) == 2 and "running AP@0.5" in ticks[0]
    assert len(list((out / "frames").glob("tick_*.png"))) == 2 and (out / "live.gif").stat().st_size > 0
    summary = json.loads((out / "live_summary.json").read_text())
    assert summary["backend"] == "builtin" and summary["ticks"] == 2
    assert summary["delivered"] <= summary["sent"]  # one tick of latency holds the last messages back


def test_live_demo_with_carla_backend_and_no_server_is_a_clear_error(trained_run, tmp_path, capsys):
    capsys.readouterr()
    assert carla_demo.main(["live", "--model_dir", str(trained_run), "--backend", "carla", "--ticks", "1",
                            "--port", str(_closed_port()), "--timeout", "1", "--out", str(tmp_path)]) == 2
    assert "no CARLA server" in capsys.readouterr().err


def _layout(root: Path):
    """{split: sorted file suffixes of one agent folder} ignoring names that vary."""
    out = set()
    for f in root.rglob("*"):
        if f.is_file() and f.parent.parent.parent.parent == root:
            out.add(f.name.split("_", 1)[1] if "_" in f.name else f.suffix)
    return sorted(out)


def test_record_from_both_backends_reads_back(tmp_path, monkeypatch):
    builtin = tmp_path / "builtin"
    assert carla_demo.main(["record", "-o", str(builtin), "--backend", "builtin", "--frames", "2",
                            "--scenarios", "1", "--split_ratio", "1", "0", "0", "--no_cameras"]) == 0
    from carla_fake_server import FakeServer
    server = FakeServer()
    monkeypatch.setattr(carla, "Client", lambda host, port: server)
    fake = tmp_path / "carla"
    assert carla_demo.main(["record", "-o", str(fake), "--backend", "carla", "--frames", "2", "--scenarios", "1",
                            "--split_ratio", "1", "0", "0", "--no_cameras", "--agents", "2", "--background", "0"]) == 0
    layouts = []
    for root in (builtin, fake):
        reader = OPV2VReader(root, "train")
        assert len(reader) == 2
        frame = reader[0]
        assert len(frame.agents) >= 2 and all(len(a.lidar) > 0 for a in frame.agents)
        assert set(frame.agents[0].lidar_beams) == {32, 16}
        assert (root / "modality_assignment.json").exists()
        layouts.append(_layout(root))
    assert layouts[0] == layouts[1], layouts


def test_live_demo_wire_dtype_writes_the_links_config_key(trained_run, tmp_path, capsys):
    """--wire_dtype is model.link.wire_dtype: int8 halves the GenComm link's float16 payload; a run
    whose fusion method sends no link payload refuses it with one line."""
    per_message = {}
    for dtype in (None, "int8"):
        out = tmp_path / str(dtype)
        extra = ["--wire_dtype", dtype] if dtype else []
        assert carla_demo.main(["live", "--model_dir", str(trained_run), "--ticks", "1", "--no_cameras",
                                "--backend", "builtin", "--out", str(out), *extra]) == 0
        per_message[dtype] = json.loads((out / "live_summary.json").read_text())["bytes_per_message"]
    assert per_message[None] - HEADER_SIZE == 2 * (per_message["int8"] - HEADER_SIZE) > 0
    from opencood_ext.cli import train

    late = tmp_path / "late_run"
    cfg = tiny_config(tmp_path, trained_run.parent / "data", "late", {"m1": PP}, {"fusion": "late"})
    assert train.main(["-y", str(cfg), "--model_dir", str(late), "--set", "train.max_steps_per_epoch=1"]) == 0
    capsys.readouterr()
    assert carla_demo.main(["live", "--model_dir", str(late), "--ticks", "1", "--no_cameras", "--backend", "builtin",
                            "--out", str(tmp_path / "late"), "--wire_dtype", "int8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--wire_dtype writes model.link.wire_dtype" in err[0] and "late" in err[0]
