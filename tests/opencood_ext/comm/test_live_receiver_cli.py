"""The receiver: section from a config file and from the live demo's command line (issue 29):
max_age and the alliance key set with --set reach the live loop, its rejections are counted per
rule in live_summary.json, and a key that cannot be loaded is a one-line error. Issue 52: max_age
is seconds of the world's clock, and per-sender keys are set the same way."""
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from opencood_ext.comm.signing import keygen
from opencood_ext.experiment import load_experiment
from opencood_ext.sim.agent_types import load_agent_types
from opencood_ext.sim.builtin import BuiltinWorld
from tiny_runs import GENCOMM, PP, one_step_gencomm_run, tiny_config

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import carla_demo  # noqa: E402

KEY = "live-alliance-key-0123456789abcdef"


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    torch.set_num_threads(2)
    return one_step_gencomm_run(tmp_path_factory.mktemp("receiver_run"), "recv")


def test_receiver_section_loads_from_yaml_and_overrides(tmp_path):
    path = tiny_config(tmp_path, tmp_path / "data", "r", {"m1": PP}, {"fusion": "intermediate", "link": GENCOMM})
    cfg = yaml.safe_load(path.read_text())
    cfg["receiver"] = {"max_age": 2.0, "key_env": "GENCOMM_ALLIANCE_KEY", "max_boxes": 300}
    path.write_text(yaml.safe_dump(cfg))
    exp = load_experiment(path, ["receiver.max_future=0.5", "receiver.max_bytes_per_frame=1000000"])
    r = exp.receiver
    assert (r.max_age, r.max_future, r.max_boxes, r.max_bytes_per_frame, r.key_env) == \
        (2.0, 0.5, 300, 1_000_000, "GENCOMM_ALLIANCE_KEY")
    with pytest.raises(ValueError, match="receiver.*max_boxes"):
        load_experiment(path, ["receiver.max_boxes=0"])
    with pytest.raises(ValueError, match="receiver.*unknown key"):
        load_experiment(path, ["receiver.max_boxs=3"])


def _live(run, out, *extra):
    return carla_demo.main(["live", "--model_dir", str(run), "--ticks", "3", "--no_cameras", "--out", str(out),
                            "--backend", "builtin", "--agents", "3", *extra])


def test_live_demo_takes_max_age_and_the_key_from_set(trained_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GENCOMM_TEST_LIVE_KEY", KEY)
    out = tmp_path / "live"
    rc = _live(trained_run, out, "--latency", "1", "--set", "receiver.max_age=0",
               "--set", "receiver.key_env=GENCOMM_TEST_LIVE_KEY")
    assert rc == 0
    summary = json.loads((out / "live_summary.json").read_text())
    assert summary["authenticated"] is True
    assert summary["delivered"] > 0 and summary["rejected"] == summary["delivered"]
    assert summary["rejected_reasons"] == {"stale": summary["delivered"]}
    ticks = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("tick")]
    assert len(ticks) == 3 and "stale:" in ticks[-1] and all("dets" in t for t in ticks)
    assert KEY not in (out / "live_summary.json").read_text()


def test_live_demo_without_its_key_is_a_one_line_error(trained_run, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GENCOMM_TEST_NO_KEY", raising=False)
    capsys.readouterr()
    assert _live(trained_run, tmp_path, "--set", "receiver.key_env=GENCOMM_TEST_NO_KEY") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GENCOMM_TEST_NO_KEY is not set" in err[0]


def test_live_demo_ages_in_seconds_and_signs_per_sender(trained_run, tmp_path, capsys):
    """``--latency 1 --set receiver.max_age=1``: every message is one frame, 0.1 s, old (two of the
    built-in world's 0.05 s ticks) and accepted; before, the demo's clock had no unit and each was
    refused. Per-sender keys for the world's agents, set with --set, sign every message; the demo
    says its tick length, and no key file's contents reach its output."""
    world = BuiltinWorld(agent_types=load_agent_types(), num_agents=3, cameras=False)
    world.reset(0)  # the demo's default seed: the same agents
    keys = tmp_path / "keys"
    registry = keygen(keys, [a.agent_id for a in world.agents])
    world.close()
    capsys.readouterr()
    out = tmp_path / "live"
    assert _live(trained_run, out, "--latency", "1", "--set", "receiver.max_age=1", "--set",
                 f"receiver.public_keys={registry}", "--set", f"receiver.private_keys={keys}") == 0
    summary = json.loads((out / "live_summary.json").read_text())
    assert (summary["tick_s"], summary["signing"], summary["rejected"]) == (0.05, "ed25519", 0)
    assert summary["delivered"] > 0
    shown = capsys.readouterr()
    assert "clock: timestamps count the world's 0.05 s ticks; receiver.max_age and max_future are seconds" \
        in shown.err
    secrets = [ln for pem in keys.glob("*.pem") for ln in pem.read_text().splitlines() if not ln.startswith("-")]
    text = shown.out + shown.err + (out / "live_summary.json").read_text()
    assert secrets and not any(s in text for s in secrets)
