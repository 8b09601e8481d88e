"""What a user sees when a command cannot do what it was asked: one line naming the file and
the problem, exit status 2, and nothing in the run folder changed."""
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny_runs import PP, tiny_config, tiny_dataset

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import inference  # noqa: E402
import onboard  # noqa: E402
import train  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli_errors")
    data = tiny_dataset(tmp / "data")
    cfg = tiny_config(tmp, data, "cli", {"m1": PP}, {"fusion": "intermediate", "link": {"type": "full_feature"}})
    run = tmp / "run"
    assert train.main(["-y", str(cfg), "--model_dir", str(run), "--set", "train.max_steps_per_epoch=1"]) == 0
    return cfg, run


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO " not in ln and " WARNING " not in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_resume_that_does_not_fit_changes_nothing(trained, capsys):
    _, run = trained
    before = {p: p.read_bytes() for p in [run / "config.yaml", *(run / "checkpoints").iterdir()]}
    capsys.readouterr()
    rc = train.main(["--model_dir", str(run), "--set", "model.agent_types.m1.shrink_channels=16",
                     "--set", "train.epochs=2"])
    assert rc == 2
    line = _one_line(capsys.readouterr().err)
    assert str(run / "checkpoints" / "latest.pth") in line and "differ in shape" in line and "shrink" in line
    assert {p: p.read_bytes() for p in before} == before  # config.yaml and checkpoints untouched
    # the run is still resumable as it was
    assert train.main(["--model_dir", str(run), "--set", "train.epochs=2", "--set", "train.max_steps_per_epoch=1"]) == 0
    assert torch.load(run / "checkpoints" / "latest.pth", weights_only=True)["epoch"] == 2


def test_a_run_folder_in_use_is_refused_before_anything_is_written(trained, capsys):
    from opencood_ext.training.runfolder import WriterLock
    _, run = trained
    before = {p: p.read_bytes() for p in [run / "config.yaml", run / "train_log.jsonl", *(run / "checkpoints").iterdir()]}
    held = WriterLock(run)  # another trainer's hold
    try:
        capsys.readouterr()
        assert train.main(["--model_dir", str(run), "--set", "train.epochs=9"]) == 2
        line = _one_line(capsys.readouterr().err)
        assert str(run) in line and "another process is training into this run folder" in line
    finally:
        held.release()
    assert {p: p.read_bytes() for p in before} == before


def _corrupt(root, split, scenario):
    pcd = root / split / scenario / "10" / "000068.pcd"
    good = pcd.read_bytes()
    pcd.write_bytes(good[:-10])
    return pcd, good


def test_train_config_and_data_errors_are_one_line(trained, tmp_path, capsys):
    cfg, run = trained
    root = run.parent / "data"
    capsys.readouterr()
    cases = [
        (["-y", str(cfg), "--set", "model.lnk={}"], "did you mean 'link'"),                    # model config
        (["-y", str(cfg), "--set", "data.root=/nowhere"], "dataset root does not exist"),      # data folder
        (["-y", str(cfg), "--set", "data.agent_types.m3={sensor: lidar}"], "agent_types"),      # data vs model
        (["-y", str(tmp_path)], "is a directory"),                                             # config path
        ([], "give -y CONFIG"),
    ]
    for argv, words in cases:
        assert train.main(argv + ["--model_dir", str(tmp_path / "new")]) == 2, argv
        line = _one_line(capsys.readouterr().err)
        assert line.startswith("error: ") and words in line, (argv, line)
    assert not (tmp_path / "new").exists()
    # a bad frame met while training, in the process and in a DataLoader worker
    pcd, good = _corrupt(root, "train", "scn_2")
    try:
        for workers in (0, 1):
            rc = train.main(["-y", str(cfg), "--model_dir", str(tmp_path / f"w{workers}"),
                             "--set", f"train.num_workers={workers}"])
            line = _one_line(capsys.readouterr().err)
            assert rc == 2 and str(pcd) in line and "truncated" in line and "skip_bad_frames=true" in line, line
    finally:
        pcd.write_bytes(good)


def test_inference_and_onboarding_errors_are_one_line(trained, tmp_path, capsys):
    _, run = trained
    capsys.readouterr()
    for argv, words in ((["--model_dir", str(tmp_path)], "no config.yaml"),
                        (["--model_dir", str(run), "--set", "model.fusion_opp=max"], "fusion_op"),
                        (["--model_dir", str(run), "--fusion_method", "telepathy"], "unknown fusion method")):
        assert inference.main(argv) == 2
        assert words in _one_line(capsys.readouterr().err)
    pcd, good = _corrupt(run.parent / "data", "test", "scn_6")
    try:
        assert inference.main(["--model_dir", str(run), "--plot_every", "0"]) == 2
        assert str(pcd) in _one_line(capsys.readouterr().err)
    finally:
        pcd.write_bytes(good)
    assert onboard.main(["--ego", str(tmp_path / "none"), "--new", str(run), "-o", str(tmp_path / "o")]) == 2
    assert "none" in _one_line(capsys.readouterr().err)


def test_train_cli_prints_no_traceback(trained, tmp_path):
    cfg, _ = trained
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "train.py"), "-y", str(cfg), "--model_dir",
                           str(tmp_path / "r"), "--set", "model.lnk={}"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2
    assert "did you mean 'link'" in _one_line(proc.stderr)


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_carla_backend_without_server_is_one_line_before_the_model_loads(trained, tmp_path, monkeypatch, capsys):
    _, run = trained
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "carla_demo.py"), "live", "--model_dir", str(run),
                           "--backend", "carla", "--port", str(_closed_port()), "--timeout", "1",
                           "--out", str(tmp_path / "live")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert _one_line(proc.stderr).startswith("error: no CARLA server answered at 127.0.0.1:")
    # the server is asked first: the model (torch, the checkpoint) is not loaded before the answer
    import opencood_ext.runs
    calls = []
    real_load = opencood_ext.runs.load_run
    monkeypatch.setattr(opencood_ext.runs, "load_run", lambda *a, **k: calls.append("load_run") or real_load(*a, **k))
    import carla_demo
    from opencood_ext.sim import carla_bridge
    real_connect = carla_bridge.connect
    monkeypatch.setattr(carla_bridge, "connect", lambda *a, **k: calls.append("connect") or real_connect(*a, **k))
    capsys.readouterr()
    assert carla_demo.main(["live", "--model_dir", str(run), "--backend", "carla", "--port", str(_closed_port()),
                            "--timeout", "1", "--out", str(tmp_path / "live")]) == 2
    assert calls == ["connect"]
    assert _one_line(capsys.readouterr().err).startswith("error: no CARLA server answered")


def test_a_torchscript_checkpoint_is_refused_without_torch_advice(trained, tmp_path, capsys):
    """A TorchScript archive (a saved program) where a checkpoint belongs: every entry point that opens
    one refuses it on one line naming the file, exit 2, and never passes on torch's advice to load it
    with weights_only=False (issue 52 item 4b). Nothing of it is loaded: torch.load never sees it.
    (Onboarding reads its stage-1 runs through the same load_model_state: test_checkpoint_safety.py.)"""
    import shutil
    import warnings

    import bench
    import carla_demo
    import import_weights
    import robustness
    cfg, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    script = torch.jit.script(torch.nn.Linear(2, 2))
    for ckpt in (copy / "checkpoints").glob("*.pth"):
        script.save(str(ckpt))
    program = copy / "checkpoints" / "latest.pth"
    calls = [
        (train.main, ["--model_dir", str(copy), "--set", "train.epochs=2"], "latest.pth"),
        (inference.main, ["--model_dir", str(copy), "--plot_every", "0"], "best.pth"),
        (inference.main, ["--model_dir", str(copy), "--checkpoint", "last", "--plot_every", "0"], "latest.pth"),
        (import_weights.main, [str(program), "--config", str(cfg), "-o", str(tmp_path / "imp")], "latest.pth"),
        (robustness.main, ["--runs", f"r={copy}", "--sweep", "drop", "-o", str(tmp_path / "rob"), "--no_progress"],
         "best.pth"),
        (bench.main, ["warp", "--model_dir", str(copy), "--max_frames", "1"], "best.pth"),
        (carla_demo.main, ["live", "--model_dir", str(copy), "--backend", "builtin", "--out", str(tmp_path / "live")],
         "best.pth"),
    ]
    real_load = torch.load
    for main, argv, name in calls:
        capsys.readouterr()
        with warnings.catch_warnings(record=True) as seen, pytest.MonkeyPatch.context() as mp:
            warnings.simplefilter("always")
            mp.setattr(torch, "load", lambda f, *a, **k: (_ for _ in ()).throw(AssertionError(f)) if str(f).endswith(
                ".pth") and str(copy) in str(f) else real_load(f, *a, **k))
            assert main(argv) == 2, argv
        err = capsys.readouterr().err
        line = _one_line(err)
        assert "TorchScript archive" in line and str(copy / "checkpoints") in line and name in line, (argv, line)
        assert not [w for w in seen if "torch" in str(w.message).lower()], (argv, [str(w.message) for w in seen])
        for advice in ("weights_only", "`False`", "arbitrary code execution", "trusted source", "jit.load"):
            assert advice not in err, (argv, err)
    assert not any((tmp_path / d).exists() for d in ("imp", "rob", "live"))
