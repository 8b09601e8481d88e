"""BackAlign and STAMP end to end on a tiny dataset: GenComm stage-1 runs (tools/train.py) ->
tools/onboard.py --method -> tools/inference.py. Exactly the paper's trainable set trains,
everything else stays bit-identical to the stage-1 weights it came from, AP is finite and the
message is the C-channel float32 feature on the wire. Plus the shipped stage-2 configs."""
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from opencood_ext.comm.wire import HEADER_SIZE
from opencood_ext.experiment import build_dataset, collate, load_experiment
from opencood_ext.methods import ONBOARDING
from opencood_ext.models.second import SPCONV_CPU_ONLY
from opencood_ext.runs import load_run
from opencood_ext.training.checkpoint import load_checkpoint
from opencood_ext.training.onboarding import build_onboarding_model, plan_onboarding
from tiny_runs import gencomm_stage1_runs

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import inference  # noqa: E402
import onboard  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available() and SPCONV_CPU_ONLY,
                                reason="the trainer would put SECOND on CUDA, and this spconv is a CPU-only build")

TRAINS = {"backalign": ["encoders.m3"], "stamp": ["link.adapter.m3", "link.reverter.m3"]}


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    """GenComm's homogeneous stage-1 runs, m1 (PointPillars) and m3 (SECOND): every method starts here."""
    return gencomm_stage1_runs(tmp_path_factory.mktemp("stage1"))


def _under(key, prefixes):
    return any(key.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("method", ["backalign", "stamp"])
def test_onboard_trains_exactly_the_papers_set_then_evaluates(stage1, tmp_path, capsys, method):
    torch.set_num_threads(1)
    m = ONBOARDING.get_class(method, "method")()
    plan = plan_onboarding(stage1["m1"], [stage1["m3"]], method=method, epochs=1)
    model, policy = build_onboarding_model(plan)
    policy.apply(model)
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trains == {n for n, _ in model.named_parameters() if _under(n, TRAINS[method])} and trains
    assert m.trainable("m3") == TRAINS[method]
    assert plan.config.train.lr == m.train_defaults["lr"]
    assert plan.config.train.milestones == m.train_defaults["milestones"]

    out = tmp_path / method
    assert onboard.main(["--ego", str(stage1["m1"]), "--new", str(stage1["m3"]), "-o", str(out),
                         "--method", method, "--epochs", "1"]) == 0
    report = json.loads((out / "onboarding.json").read_text())
    assert report["method"] == method
    s1 = {t: load_checkpoint(r / "checkpoints" / "latest.pth")["model"] for t, r in stage1.items()}
    s2 = load_checkpoint(out / "checkpoints" / "latest.pth")["model"]
    origin = {**{p: "m1" for p in m.ego_prefixes("m1")}, **{p: "m3" for p in m.new_prefixes("m3")}}
    changed = []
    for k, v in s2.items():
        if _under(k, TRAINS[method]):
            source = s1["m3"] if method == "backalign" else None  # STAMP's adapters start from scratch
            changed += [k] if source is None or not torch.equal(source[k], v) else []
            continue
        src = [t for p, t in origin.items() if k.startswith(p)]
        assert src, f"{k} neither trains nor comes from a stage-1 run"
        assert torch.equal(s1[src[0]][k], v), f"{k} changed"
    weights = [k for k in changed if k.endswith("weight")]
    assert weights, "nothing trained"
    if method == "backalign":  # the stack continued from its stage-1 weights, the link has none
        assert not any(k.startswith("link.") for k in s2)
    else:  # the adapter and the reverter both moved off their initial layer scale, with the alignment on
        for side in ("adapter", "reverter"):
            assert not torch.allclose(s2[f"link.{side}.m3.blocks.0.gamma"], torch.full((64,), 1e-6))
        steps = [json.loads(ln) for ln in (out / "train_log.jsonl").read_text().splitlines()]
        steps = [r for r in steps if r["kind"] == "step"]
        assert steps and all(math.isfinite(r[k]) for r in steps for k in ("align_m2p", "align_p2m", "align_m2p2m"))
    # the cost hook: what trains, for one frame of the new type
    _, loaded = load_run(out)
    batch = collate([build_dataset(plan.config, plan.config.data.test_split, train=False)[0]])
    params, gflops = m.cost(loaded, "m3", batch)
    assert params == report["trainable_params_per_new_type"]["m3"] == sum(
        p.numel() for n, p in loaded.named_parameters() if _under(n, TRAINS[method]))
    assert gflops > 0

    capsys.readouterr()
    assert inference.main(["--model_dir", str(out), "--max_frames", "2"]) == 0
    res = json.loads((out / "eval_intermediate.json").read_text())
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for order in res["ap"].values() for v in order.values())
    H, W = loaded.grid.shape
    # the full feature (BackAlign) or the protocol feature (STAMP): C float32 channels plus the header
    assert res["bytes_per_message"] == HEADER_SIZE + loaded.channels * H * W * 4


def test_method_validates_the_stage1_runs(stage1, tmp_path):
    empty = tmp_path / "untrained"
    empty.mkdir()
    (empty / "config.yaml").write_text((stage1["m3"] / "config.yaml").read_text())
    for method in ("backalign", "stamp"):
        with pytest.raises(ValueError, match="untrained.*stage-1 weights|untrained.*frozen"):
            plan_onboarding(stage1["m1"], [empty], method=method)


@pytest.mark.parametrize("family", ["sim", "opv2v_h"])
@pytest.mark.parametrize("method", ["backalign", "stamp"])
def test_shipped_stage2_configs_follow_the_method(family, method):
    cfg = load_experiment(ROOT / "configs" / family / "stage2" / f"{method}_m1_m2m3m4.yaml")
    m = ONBOARDING.get_class(method, "method")()
    assert cfg.stage.method == method and cfg.stage.new_types == ["m2", "m3", "m4"]
    assert set(cfg.model["agent_types"]) == {"m1", "m2", "m3", "m4"}
    assert cfg.model["link"] == m.link(None, "m1", cfg.stage.new_types)  # the composed link, protocol m1
    # the sim gives every method the same 4 epochs (equal budgets, tests/experiments/test_equal_budgets.py), with
    # the x0.1 milestones at the same fractions of the schedule as the reference's
    scaled = {"epochs", "milestones"} if family == "sim" else set()
    for key, value in m.train_defaults.items():
        if key not in scaled:
            assert getattr(cfg.train, key) == value, key
    if family == "sim":
        ref = m.train_defaults["epochs"]
        assert cfg.train.epochs == 4
        assert cfg.train.milestones == [round(e * 4 / ref) for e in m.train_defaults["milestones"]]
