"""MPDA and CodeFilling onboarding end to end on a tiny OPV2V-format dataset: GenComm's
stage-1 runs (m1 PointPillars, m3 SECOND) -> tools/onboard.py --method -> the trainable set
is exactly the method's, everything else bit-identical (BatchNorm statistics included) ->
tools/inference.py on encoded bytes, with the cost hook's numbers."""
import json
import sys
from pathlib import Path

import pytest
import torch

from opencood_ext.comm.wire import HEADER_SIZE
from opencood_ext.data.batch import collate_samples
from opencood_ext.experiment import build_dataset, load_experiment
from opencood_ext.methods.base import count_unique_parameters
from opencood_ext.training.checkpoint import load_checkpoint
from opencood_ext.training.onboarding import build_onboarding_model, plan_onboarding
from tiny_runs import gencomm_stage1_runs

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import inference  # noqa: E402
import onboard  # noqa: E402

SMALL_MPDA = ["--set", "model.link.resizer={mlp_dim: 16, dim_head: 4}",
              "--set", "model.link.attention={heads: 2, dim_head: 4}", "--set", "model.link.domain={hidden: 16}"]
TRAINS = {"mpda": ("link.adapter.m3.",), "codefilling": ("link.quantizer.",)}


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    """GenComm's homogeneous stage-1 runs, m1 (PointPillars) and m3 (SECOND): every method starts here."""
    return gencomm_stage1_runs(tmp_path_factory.mktemp("stage1"))


def _onboard(stage1, method, out):
    extra = SMALL_MPDA if method == "mpda" else []
    return onboard.main(["--ego", str(stage1["m1"]), "--new", str(stage1["m3"]), "-o", str(out), "--method", method,
                         "--epochs", "1", "--set", "train.val_every=0", *extra])


@pytest.mark.parametrize("method", ["mpda", "codefilling"])
def test_onboarding_trains_only_the_method_part_then_infers_from_bytes(stage1, tmp_path, method, capsys):
    torch.set_num_threads(1)
    out = tmp_path / method
    assert _onboard(stage1, method, out) == 0
    report = json.loads((out / "onboarding.json").read_text())
    cfg = load_experiment(out / "config.yaml")
    assert report["method"] == method and cfg.model["link"]["type"] == method
    # the reference schedule, from the method's train_defaults (epochs from --epochs)
    assert cfg.train.lr == pytest.approx(1e-3) and cfg.train.epochs == 1
    assert (cfg.train.lr_scheduler, cfg.train.milestones) == (("multistep", [5]) if method == "mpda" else (None, []))

    s2 = load_checkpoint(out / "checkpoints" / "latest.pth")["model"]
    trained = TRAINS[method]
    assert report["trainable_params_per_new_type"]["m3"] == report["trainable_params_total"] == \
        sum(v.numel() for k, v in s2.items() if k.startswith(trained) and v.is_floating_point()
            and "running_" not in k)
    # everything outside the trained part is bit-identical to stage 1, BatchNorm statistics included
    for t in ("m1", "m3"):
        s1 = load_checkpoint(stage1[t] / "checkpoints" / "latest.pth")["model"]
        prefixes = [f"encoders.{t}."] + (["fuse.", "post_fusion.", "head."] if t == "m1" else [])
        shared = [k for k in s1 if k.startswith(tuple(prefixes))]
        assert shared and all(torch.equal(s1[k], s2[k]) for k in shared)
        assert not any(k.startswith("link.") for k in s1 if k in s2)  # GenComm's link weights are not used
    assert set(s2) == {k for k in s2 if k.startswith(("encoders.", "fuse.", "post_fusion.", "head.", *trained))}
    assert any(k.startswith(trained) for k in s2)
    assert not any(k.startswith(trained) for k in load_checkpoint(stage1["m1"] / "checkpoints" / "latest.pth")["model"])

    capsys.readouterr()
    assert inference.main(["--model_dir", str(out), "--max_frames", "2"]) == 0
    res = json.loads((out / "eval_intermediate.json").read_text())
    H, W = 40, 40  # the tiny grid: 64 m at 0.8 m, backbone stride 2
    per_cell = 4 * 8 if method == "mpda" else 6  # float32 C = 8, or 3 x 2 uint8 codes
    assert res["bytes_per_message"] == HEADER_SIZE + per_cell * H * W
    assert all(v == v and 0.0 <= v <= 1.0 for order in res["ap"].values() for v in order.values())


@pytest.mark.parametrize("method", ["mpda", "codefilling"])
def test_trainable_set_is_exact_and_a_few_steps_change_nothing_else(stage1, tmp_path, method):
    """The freeze policy of the composed model trains exactly the method's modules; two optimiser
    steps in train mode leave every other tensor (parameters and buffers) bit-identical."""
    torch.set_num_threads(1)
    extra = [s for s in SMALL_MPDA if s != "--set"] if method == "mpda" else []
    plan = plan_onboarding(stage1["m1"], [stage1["m3"]], ["train.val_every=0", *extra], method=method)
    model, policy = build_onboarding_model(plan)
    policy.apply(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.named_parameters() if n.startswith(TRAINS[method])} != set()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ds = build_dataset(plan.config, "train", train=True)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    policy.train_mode(model)
    losses = set()
    for i in range(2):
        batch = collate_samples([ds[2 * i], ds[2 * i + 1]])
        out = model(batch)
        loss = model.loss(out, batch)
        losses |= set(loss.parts)
        opt.zero_grad()
        loss.total.backward()
        opt.step()
    assert ("domain" if method == "mpda" else "codebook") in losses
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(TRAINS[method]) for k in changed)

    # the cost hook: the trained part's parameters and its GFLOPs on one message of the model's grid
    params, gflops = plan.method.cost(model, "m3", batch)
    assert params == count_unique_parameters([model.get_submodule(TRAINS[method][0][:-1])]) == len(
        torch.nn.utils.parameters_to_vector([p for n, p in model.named_parameters() if n in trainable]))
    assert gflops > 0
