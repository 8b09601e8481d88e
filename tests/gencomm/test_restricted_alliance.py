"""GenComm's onboarded alliance restricted to the ego's type computes exactly what its stage-1 model
computes (issue 49): onboarding adds the new type's message extractor and changes nothing the old
agents use, so an alliance that finds no collaborator-only object among m1 agents inherited that from
its m1 stage 1. Tiny stage-1 runs (tools/train.py), one onboarding epoch (tools/onboard.py), then
the same m1-only frames through both models under one diffusion seed."""
import sys
from pathlib import Path

import pytest
import torch

from opencood_ext.experiment import build_dataset, collate, load_experiment
from opencood_ext.models.second import SPCONV_CPU_ONLY
from opencood_ext.runs import load_run
from tiny_runs import gencomm_stage1_runs

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import onboard  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available() and SPCONV_CPU_ONLY,
                                reason="the trainer would put SECOND on CUDA, and this spconv is a CPU-only build")


def _head(model, batch, seed=5):
    model.eval()
    torch.manual_seed(seed)  # the generator's noise
    with torch.no_grad():
        out = model(batch)
    return out.head


def test_the_alliance_restricted_to_m1_is_the_m1_stage1_model(tmp_path):
    torch.set_num_threads(1)
    stage1 = gencomm_stage1_runs(tmp_path / "stage1")
    onboarded = tmp_path / "onboard_m3"
    assert onboard.main(["--ego", str(stage1["m1"]), "--new", str(stage1["m3"]), "-o", str(onboarded),
                         "--epochs", "1", "--set", "train.max_steps_per_epoch=2"]) == 0
    _, alliance = load_run(onboarded)
    _, alone = load_run(stage1["m1"])
    # the stage-1 run's own frames: every agent m1 (its config's modality all:m1)
    cfg = load_experiment(stage1["m1"] / "config.yaml")
    ds = build_dataset(cfg, cfg.data.test_split, train=False)
    batch = collate([ds[0], ds[1]])
    assert len(batch.agent_types) > 2 and set(batch.agent_types) == {"m1"}  # collaborators are there
    a, b = _head(alliance, batch), _head(alone, batch)
    for name in ("cls", "reg", "dir"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    # and the collaborators matter: without them the same model detects otherwise
    solo_cfg = load_experiment(stage1["m1"] / "config.yaml", ["data.max_agents=1"])
    ego_only = collate([build_dataset(solo_cfg, cfg.data.test_split, train=False)[k] for k in (0, 1)])
    assert not torch.equal(_head(alone, ego_only).cls, b.cls)
