"""Late fusion built from separately trained single-type runs (the benchmark's 'Late fusion' row):
each collaborator detects with its own run's model and sends boxes; the ego's run receives. And the
dynamic evaluation writes one eval per alliance with the onboarding cost of the newest type."""
import json

import pytest
import torch

from opencood_ext.data.batch import collate_samples
from opencood_ext.eval.dynamic import run_dynamic
from opencood_ext.run_folder import evaluation_label
from opencood_ext.experiment import build_dataset
from opencood_ext.models.second import SPCONV_CPU_ONLY
from opencood_ext.runs import late_fusion_of, load_run
from opencood_ext.training.onboarding import build_onboarding_model, plan_onboarding
from tiny_runs import gencomm_stage1_runs


pytestmark = pytest.mark.skipif(torch.cuda.is_available() and SPCONV_CPU_ONLY,
                                reason="the trainer would put SECOND on CUDA, and this spconv is a CPU-only build")


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    """GenComm's homogeneous stage-1 runs, m1 (PointPillars) and m3 (SECOND): every method starts here."""
    return gencomm_stage1_runs(tmp_path_factory.mktemp("stage1"))


def test_each_collaborator_detects_with_its_own_runs_model(stage1):
    cfg, model = late_fusion_of(stage1, "m1")
    assert model.fusion == "late" and set(model.encoders) == {"m1", "m3"} and set(model.sender_detectors) == {"m3"}
    _, m1 = load_run(stage1["m1"])
    _, m3 = load_run(stage1["m3"])
    for key, value in m1.head.state_dict().items():
        assert torch.equal(model.head.state_dict()[key], value)
    ds = build_dataset(cfg, "test", train=False)
    batch = collate_samples([ds[0]])
    assert "m3" in batch.agent_types[1:]
    with torch.no_grad():
        pred = model.predict(batch)
        feats = model.encode(batch).feats
    rows = pred.delivery.sent.source_row
    for k, r in enumerate(rows):
        t = batch.agent_types[r]
        own = (m3 if t == "m3" else m1)
        with torch.no_grad():
            want = own.decode(own.detect(feats[r:r + 1]), gt_range=None)[0]
        sent = pred.delivery.sent.payload[k]
        assert len(sent) == len(want.boxes)
        torch.testing.assert_close(sent[:, :7], want.boxes)
    # m3's encoder is its own run's
    torch.testing.assert_close(next(iter(model.encoders["m3"].state_dict().values())),
                               next(iter(m3.encoders["m3"].state_dict().values())))
    with pytest.raises(ValueError, match="ego type m2"):
        late_fusion_of(stage1, "m2")


def test_dynamic_evaluation_writes_each_alliance_with_the_newest_types_cost(stage1, tmp_path):
    plan = plan_onboarding(stage1["m1"], [stage1["m3"]], method="gencomm", epochs=1)
    model, _ = build_onboarding_model(plan)
    model.eval()
    rows = run_dynamic(plan.config, model, ["m1", "m3"], "test", out_dir=tmp_path)
    assert [r.types for r in rows] == [["m1"], ["m1", "m3"]]
    assert rows[0].onboard_params is None
    assert rows[1].onboard_params == sum(p.numel() for p in model.link.dme["m3"].parameters())
    assert rows[1].onboard_gflops > 0
    for name in ("eval_dyn_m1.json", "eval_dyn_m1+m3.json", "eval_dynamic.json"):
        assert (tmp_path / name).is_file()
    # the benchmark and the report find each alliance's files by this label
    assert [evaluation_label(alliance=r.types) for r in rows] == ["dyn_m1", "dyn_m1+m3"]
    with pytest.raises(ValueError, match="ego"):
        evaluation_label(alliance=[])
    dyn = json.loads((tmp_path / "eval_dynamic.json").read_text())
    assert dyn[1]["ap_ci"]["global"].keys() == dyn[1]["ap"]["global"].keys()


def test_overrides_reach_the_joined_experiment(stage1, tmp_path):
    """``tools/inference.py --late_of ... --set data.root=...`` evaluates on that data (the main job's separate
    test set); the members' own configs stay as they were trained."""
    cfg, _ = late_fusion_of(stage1, "m1", [f"data.root={tmp_path}", "eval.max_frames=2"])
    assert cfg.data.root == str(tmp_path) and cfg.eval.max_frames == 2
    assert load_run(stage1["m3"])[0].data.root != str(tmp_path)
    plain, _ = late_fusion_of(stage1, "m1")
    assert plain.data.root == load_run(stage1["m1"])[0].data.root


def test_blank_messages_evaluation_lands_beside_the_plain_one(stage1, tmp_path, capsys):
    """``tools/inference.py --blank_messages m1 --label blank_m1``: a separate evaluation of the same run with
    its m1 collaborators sending zeros; the run's own evaluation is left as it was."""
    import shutil

    from opencood_ext.cli import inference

    run = tmp_path / "run"
    shutil.copytree(stage1["m1"], run)
    args = ["--model_dir", str(run), "--set", "eval.max_frames=2", "--set", "eval.plot_every=0"]
    assert inference.main(args) == 0
    plain = json.loads((run / "eval_intermediate.json").read_text())
    assert inference.main(args + ["--blank_messages", "m1", "--label", "blank_m1"]) == 0
    blank = json.loads((run / "eval_blank_m1.json").read_text())
    assert json.loads((run / "eval_intermediate.json").read_text()) == plain
    assert blank["frames"] == plain["frames"] and blank["bytes_per_message"] == plain["bytes_per_message"]
    assert inference.main(args + ["--blank_messages", "m1"]) != 0  # without --label it would overwrite
    assert "--blank_messages needs --label" in capsys.readouterr().err
    assert inference.main(args + ["--blank_messages", "m9", "--label", "x"]) != 0
    assert "types ['m9'] are not in this model" in capsys.readouterr().err


def _alone(model, batch, fusion):
    """(cls, reg, dir) head maps of each sample's ego under ``fusion`` with nothing arrived (the
    generator's diffusion noise drawn from the same seed each time)."""
    from opencood_ext.comm.messages import Messages

    model.set_fusion(fusion)
    torch.manual_seed(0)
    with torch.no_grad():
        head = model.method.receive(model, batch, model.encode(batch).feats, Messages.empty("bev")).head
    return head.cls, head.reg, head.dir


@pytest.mark.parametrize("protocol", ["reference", "native"])
def test_an_ego_alone_detects_alike_under_every_fusion(stage1, protocol):
    """The same weights with nothing arrived give the same head maps under fusion ``none``, late fusion
    (also of separately trained runs, ``--late_of``) and intermediate fusion. Under protocol reference a
    GenComm head reads the ego's feature regenerated from its own message, as the reference's model
    does for every agent; issue 31's reference pair had its stage 1 detect nothing alone (0.000 AP,
    no fusion and late fusion of the stage-1 runs, and GenComm's 'collaborators off') because
    ``none`` and late fusion fed the head the raw feature."""
    sets = [f"protocol={protocol}"]
    cfg, own = load_run(stage1["m1"], sets)
    batch = collate_samples([build_dataset(cfg, "test", train=False)[0]])
    want = _alone(own, batch, "intermediate")
    raw = own.detect(own.encode(batch).feats[batch.ego_index])
    _, joined = late_fusion_of(stage1, "m1", sets)
    for model, fusion in ((own, "none"), (own, "late"), (joined, "late"), (joined, "none")):
        for got, ref in zip(_alone(model, batch, fusion), want):
            torch.testing.assert_close(got, ref, msg=lambda m: f"{fusion}: {m}")
    # the ego's own view is the raw feature only where the protocol says so
    assert torch.equal(raw.cls, want[0]) == (protocol == "native")
