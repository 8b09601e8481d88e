"""What a user sees when a command cannot do what it was asked: one line naming the file and
the problem, exit status 2, and nothing in the run folder changed."""
import sys
from pathlib import Path

import pytest
import torch

from tiny_runs import PP, tiny_config, tiny_dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

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
