"""Both best.pth and the last epoch are there to evaluate: gencomm-infer --checkpoint best|last|epoch_N."""
import json

import pytest
import torch

from opencood_ext.cli import inference, train
from opencood_ext.run_folder import CheckpointPaths, RunFolder, check_checkpoint_name, evaluation_label
from opencood_ext.runs import checkpoint_of, load_run
from opencood_ext.training.checkpoint import load_checkpoint
from tiny_runs import GENCOMM, PP, tiny_config, tiny_dataset

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A GenComm m1 run, 2 epochs of 1 step each, validated every epoch."""
    tmp = tmp_path_factory.mktemp("ckpt")
    cfg = tiny_config(tmp, tiny_dataset(tmp / "data"), "two_epochs", {"m1": PP},
                      {"fusion": "intermediate", "link": GENCOMM})
    out = tmp / "run"
    assert train.main(["-y", str(cfg), "--model_dir", str(out), "--set", "train.epochs=2",
                       "--set", "train.max_steps_per_epoch=1", "--set", "train.num_workers=0"]) == 0
    return out


def test_named_checkpoints_of_a_run_folder(tmp_path):
    paths = CheckpointPaths(tmp_path)
    paths.dir.mkdir()
    for name in ("best.pth", "latest.pth", "epoch_2.pth"):
        (paths.dir / name).write_bytes(b"x")
    assert [paths.named(w).name for w in ("best", "last", "epoch_2")] == ["best.pth", "latest.pth", "epoch_2.pth"]
    with pytest.raises(FileNotFoundError, match=r"epoch_1.*no checkpoints/epoch_1.pth.*kept: epoch_2"):
        paths.named("epoch_1")
    for bad in ("epoch_0", "epoch_x", "latest", "../best", "epoch_1.pth"):
        with pytest.raises(ValueError, match="best, last or epoch_N"):
            check_checkpoint_name(bad)
    assert evaluation_label("intermediate", checkpoint="epoch_3") == "intermediate_epoch_3"
    assert evaluation_label("no", checkpoint="last", split_suffix="_validate") == "none_last_validate"


def test_a_run_keeps_best_and_last_and_loads_either(run):
    paths = RunFolder(run).checkpoints
    best, last = load_checkpoint(paths.best), load_checkpoint(paths.latest)
    assert last["epoch"] == 2 and best["epoch"] in (1, 2)
    assert checkpoint_of(run) == paths.best and checkpoint_of(run, "last") == paths.latest
    epoch1 = load_checkpoint(paths.epoch(1))["model"]
    _, model = load_run(run, checkpoint="epoch_1")
    assert all(torch.equal(v, epoch1[k]) for k, v in model.state_dict().items() if k in epoch1)
    assert any(not torch.equal(epoch1[k], last["model"][k]) for k in epoch1)  # the two epochs' weights differ


def test_infer_scores_a_named_epoch_into_its_own_label(run, capsys):
    argv = ["--model_dir", str(run), "--max_frames", "1", "--plot_every", "0"]
    assert inference.main(argv + ["--checkpoint", "epoch_1"]) == 0
    folder = RunFolder(run)
    assert folder.evaluation("intermediate_epoch_1").is_file()
    stamp = json.loads(folder.stamp("intermediate_epoch_1").read_text())
    assert "--checkpoint" in json.dumps(stamp) and "epoch_1" in json.dumps(stamp)
    assert not folder.evaluation("intermediate").exists()  # the default evaluation is not overwritten
    assert inference.main(argv + ["--checkpoint", "epoch_7"]) == 2
    assert "--checkpoint epoch_7: no checkpoints/epoch_7.pth" in capsys.readouterr().err
    assert inference.main(argv + ["--checkpoint", "newest"]) == 2
    assert "--checkpoint must be best, last or epoch_N" in capsys.readouterr().err
    assert inference.main(["--late_of", f"m1={run}", "-o", str(run.parent / "late"), "--checkpoint", "last",
                           "--dynamic", "m1", "--max_frames", "1"]) == 2
    assert "not with --late_of" in capsys.readouterr().err


def _files(folder: RunFolder, label: str):
    return [folder.evaluation(label), folder.frames(label)]  # an alliance's evaluation and records (no stamp)


def test_dynamic_with_a_checkpoint_writes_labelled_files_and_keeps_the_default_ones(run, capsys):
    """--dynamic --checkpoint epoch_1: eval_dyn_m1_epoch_1.json and eval_dynamic_epoch_1.json with its own
    stamp; the default (best) files written before are untouched, --reuse tells the two apart."""
    argv = ["--model_dir", str(run), "--dynamic", "m1", "--max_frames", "1", "--reuse"]
    folder = RunFolder(run)
    assert inference.main(argv) == 0
    default = {p: p.read_bytes() for p in [*_files(folder, "dyn_m1"), folder.evaluation("dynamic"),
                                           folder.stamp("dynamic")]}
    capsys.readouterr()
    assert inference.main(argv + ["--checkpoint", "epoch_1"]) == 0
    assert "is current" not in capsys.readouterr().out  # the default's stamp does not count for epoch_1
    assert all(p.is_file() for p in [*_files(folder, "dyn_m1_epoch_1"), folder.evaluation("dynamic_epoch_1"),
                                     folder.stamp("dynamic_epoch_1")])
    assert {p: p.read_bytes() for p in default} == default  # nothing of the default evaluation changed
    table = folder.read_evaluation("dynamic_epoch_1")
    assert [row["types"] for row in table] == [["m1"]]
    assert table[0]["frames_file"].endswith("eval_dyn_m1_epoch_1_frames.npz")
    stamp = json.loads(folder.stamp("dynamic_epoch_1").read_text())["command"]
    assert stamp[stamp.index("--checkpoint") + 1] == "epoch_1"
    assert folder.dynamic_checkpoints() == ["epoch_1"]
    assert inference.main(argv + ["--checkpoint", "epoch_1"]) == 0  # now current: reused
    assert "eval_dynamic_epoch_1.json is current" in capsys.readouterr().out
    assert inference.main(argv) == 0
    assert "eval_dynamic.json is current" in capsys.readouterr().out


def test_dynamic_labels_carry_the_checkpoint(tmp_path):
    from opencood_ext.run_folder import dynamic_label
    assert evaluation_label(alliance=["m1", "m2"], checkpoint="epoch_2") == "dyn_m1+m2_epoch_2"
    assert evaluation_label(alliance=["m1", "m2"]) == "dyn_m1+m2"
    assert (dynamic_label(), dynamic_label("epoch_2"), dynamic_label("last")) == \
        ("dynamic", "dynamic_epoch_2", "dynamic_last")
    with pytest.raises(ValueError, match="best, last or epoch_N"):
        dynamic_label("epoch_0")
    folder = RunFolder(tmp_path)
    for label in ("dynamic", "dynamic_epoch_10", "dynamic_epoch_2", "dynamic_last", "dyn_m1_epoch_3", "dynamic_x"):
        folder.evaluation(label).write_text("[]")
    assert folder.dynamic_checkpoints() == ["epoch_2", "epoch_10", "last"]
