"""BackAlign on a Pyramid Fusion alliance (HEAL's own model): tiny pyramid stage-1 runs (tools/train.py)
-> tools/onboard.py --method backalign -> the new type's stack is all that changed; the pyramid, its
foreground heads, the head and the ego's stack are bit-identical to the ego's stage-1 run. HEAL's own
stage-2 protocol (the new type alone as the ego, its foreground loss on) runs from a stage-2 config."""
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml

from opencood_ext.methods import ONBOARDING
from opencood_ext.training.checkpoint import load_checkpoint
from opencood_ext.training.onboarding import build_onboarding_model, plan_onboarding
from tiny_runs import tiny_config, tiny_dataset

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import inference  # noqa: E402
import onboard  # noqa: E402

PYRAMID = {"fusion": "pyramid", "fusion_op": "pyramid", "link": {"type": "full_feature"},
           "fusion_args": {"layer_nums": [1, 1], "layer_strides": [1, 2], "num_filters": [8, 8],
                           "upsample_strides": [1, 2], "num_upsample_filters": [8, 8], "resnext": False,
                           "shrink": {"kernel_size": [3], "stride": [1], "padding": [1], "dims": [8]}}}


def _stack(filters):
    return {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [filters]},
            "backbone": {"type": "resnet_bev", "layer_nums": [1], "layer_strides": [2], "num_filters": [8],
                         "upsample_strides": [], "num_upsample_filters": [], "norm_eps": 1e-5},
            "shrink": {"type": "none"}}


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    """Pyramid stage-1 runs: m1 (the alliance) and m2 (the new type, its own encoder width)."""
    from opencood_ext.cli import train

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("pyramid_stage1")
    data = tiny_dataset(tmp / "data")
    runs = {}
    for t, filters in (("m1", 8), ("m2", 16)):
        cfg = tiny_config(tmp, data, f"p1_{t}", {t: _stack(filters)}, PYRAMID, modality=f"all:{t}")
        runs[t] = tmp / f"p1_{t}"
        assert train.main(["-y", str(cfg), "--model_dir", str(runs[t]), "--set", "train.val_every=0",
                           "--set", "train.max_steps_per_epoch=1"]) == 0
    return runs, data


def test_backalign_onboards_onto_a_pyramid_alliance(stage1, tmp_path):
    runs, _ = stage1
    plan = plan_onboarding(runs["m1"], [runs["m2"]], method="backalign", epochs=1)
    assert plan.config.model["fusion"] == "pyramid" and plan.config.model["fusion_op"] == "pyramid"
    model, policy = build_onboarding_model(plan)
    policy.apply(model)
    assert {n.split(".")[0] + "." + n.split(".")[1] for n, p in model.named_parameters() if p.requires_grad} \
        == {"encoders.m2"}
    out = tmp_path / "onboard"
    assert onboard.main(["--ego", str(runs["m1"]), "--new", str(runs["m2"]), "-o", str(out), "--method",
                         "backalign", "--epochs", "1", "--set", "train.max_steps_per_epoch=2"]) == 0
    assert json.loads((out / "onboarding.json").read_text())["method"] == "backalign"
    s1 = {t: load_checkpoint(r / "checkpoints" / "latest.pth")["model"] for t, r in runs.items()}
    s2 = load_checkpoint(out / "checkpoints" / "latest.pth")["model"]
    m = ONBOARDING.get_class("backalign", "method")()
    moved = []
    for k, v in s2.items():
        if k.startswith("encoders.m2."):
            moved += [k] if not torch.equal(s1["m2"][k], v) else []
        else:
            assert any(k.startswith(p) for p in m.ego_prefixes("m1")), k
            assert torch.equal(s1["m1"][k], v), f"{k} changed"
    assert any(k.endswith("weight") for k in moved), "the new type's stack did not train"
    assert any(k.startswith("fuse.occupancy.") for k in s2)  # the alliance's foreground heads came along


def test_heal_stage2_protocol_from_a_config(stage1, tmp_path):
    """HEAL's stage 2: every agent is the new type and trains alone (max_agents 1) through the frozen
    pyramid with the detection and foreground losses."""
    runs, data = stage1
    cfg = yaml.safe_load((runs["m1"] / "config.yaml").read_text())
    new = yaml.safe_load((runs["m2"] / "config.yaml").read_text())
    cfg["name"] = "heal_stage2"
    cfg["data"]["agent_types"]["m2"] = new["data"]["agent_types"]["m2"]
    cfg["model"]["agent_types"]["m2"] = new["model"]["agent_types"]["m2"]
    cfg["data"].update(modality="all:m2", max_agents=1)
    cfg["stage"] = {"new_types": ["m2"], "method": "backalign"}
    path = tmp_path / "stage2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    plan = plan_onboarding(runs["m1"], [runs["m2"]], config=path, epochs=1)
    model, policy = build_onboarding_model(plan)
    policy.apply(model)
    model.train()
    from opencood_ext.experiment import build_dataset, collate

    ds = build_dataset(plan.config, plan.config.data.train_split, train=True)
    batch = collate([ds[0]])
    assert batch.agent_types == ["m2"]
    loss = model.loss(model(batch), batch)
    assert "occupancy" in loss.parts
    loss.total.backward()
    grads = {n.split(".")[1] for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads == {"m2"}
    # trained that way (tools/onboard.py -y), the alliance then evaluates cooperatively
    out = tmp_path / "onboard"
    assert onboard.main(["-y", str(path), "--ego", str(runs["m1"]), "--new", str(runs["m2"]), "-o", str(out),
                         "--epochs", "1", "--set", "train.max_steps_per_epoch=1"]) == 0
    assert inference.main(["--model_dir", str(out), "--max_frames", "2", "--set", "data.modality=cycle:m1,m2",
                           "--set", "data.max_agents=3"]) == 0
    res = json.loads((out / "eval_pyramid.json").read_text())
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for order in res["ap"].values() for v in order.values())
