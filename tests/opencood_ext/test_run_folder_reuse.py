"""The run folder's names and its one reuse rule (opencood_ext/run_folder.py): a stamp goes stale when
the code, the command, the config, a checkpoint or the test data changes; labels stay byte-identical
to the ones committed archives were written under."""
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from opencood_ext.comm.channel import ChannelConfig
from opencood_ext.eval.reuse import EvaluationSettings, evaluated_data, evaluation_stamp
from opencood_ext.data.data_config import DataConfig
from opencood_ext.run_folder import (CheckpointPaths, EvaluationStamp, RunFolder, code_digest, evaluation_label,
                                     files_digest, package_sources)


def _run(tmp_path) -> RunFolder:
    folder = RunFolder(tmp_path / "run")
    folder.checkpoints.dir.mkdir(parents=True)
    folder.config.write_text("name: x\n")
    folder.checkpoints.best.write_bytes(b"weights")
    return folder


def _data(tmp_path) -> Path:
    test = tmp_path / "data" / "test" / "scene0" / "1"
    test.mkdir(parents=True)
    (test / "000068.pcd").write_bytes(b"points")
    return tmp_path / "data" / "test"


def _stamp(folder, data, command=("gencomm-infer", "--model_dir", "run"), code="c0"):
    return EvaluationStamp.of(command, [*folder.inputs(), data], code=code)


def _bump(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_names_of_a_run_folder(tmp_path):
    f = RunFolder(tmp_path)
    assert f.config == tmp_path / "config.yaml" and f.checkpoints.dir == tmp_path / "checkpoints"
    assert f.checkpoints.best.name == "best.pth" and f.checkpoints.epoch(3).name == "epoch_3.pth"
    assert (f.evaluation("late").name, f.frames("late").name, f.stamp("late").name, f.pr_plot("late").name) == \
        ("eval_late.json", "eval_late_frames.npz", "eval_late.inputs.json", "pr_late.png")
    assert f.bev_image("none", 7) == tmp_path / "bev" / "none_00007.png"
    assert (f.train_log.name, f.tensorboard.name, f.onboarding_report.name) == ("train_log.jsonl", "tb", "onboarding.json")
    f.frames("dyn_m1+m3").write_bytes(b"")
    f.frames("late").write_bytes(b"")
    assert f.evaluation_labels() == ["dyn_m1+m3", "late"]
    assert isinstance(f.checkpoints, CheckpointPaths)


def test_reference_weights_best_first(tmp_path):
    for name in ("net_epoch3.pth", "net_epoch12.pth", "net_epoch_bestval_at5.pth", "net_epochX.pth"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in RunFolder(tmp_path).reference_weights()] == \
        ["net_epoch_bestval_at5.pth", "net_epoch12.pth", "net_epoch3.pth"]


@pytest.mark.parametrize("args, label", [
    (("late",), "late"),
    (("no",), "none"),
    (("late", ChannelConfig(pose_noise_m=0.2, pose_noise_deg=0.2)), "late_noise0.2m0.2deg"),
    (("late", ChannelConfig(pose_noise_m=3, pose_noise_deg=3, seed=1)), "late_noise3m3deg_seed1"),
    (("late", ChannelConfig(drop=0.25), 2, "float16"), "late_drop0.25_latency2_float16"),
    (("late", ChannelConfig(seed=4)), "late"),  # a perfect channel's seed draws nothing
    (("intermediate", ChannelConfig(seed=1), 2), "intermediate_latency2_seed1"),
])
def test_labels_are_the_archived_ones(args, label):
    assert evaluation_label(*args) == label


def test_alliance_and_split_labels():
    assert evaluation_label(alliance=["m1", "m3"]) == "dyn_m1+m3"
    assert evaluation_label("late", split_suffix="_validate") == "late_validate"
    with pytest.raises(ValueError, match="at least the ego"):
        evaluation_label(alliance=[])


def test_a_stamp_is_current_until_anything_it_depends_on_changes(tmp_path):
    folder, data = _run(tmp_path), _data(tmp_path)
    stamp = _stamp(folder, data)
    assert not folder.evaluation_current("late", stamp)  # nothing evaluated yet
    folder.evaluation("late").write_text("{}")
    folder.write_stamp("late", stamp)
    assert folder.evaluation_current("late", _stamp(folder, data))
    assert not folder.evaluation_current("late", _stamp(folder, data, code="c1"))  # the code changed
    assert not folder.evaluation_current("late", _stamp(folder, data, command=("gencomm-infer", "--split", "val")))
    assert not folder.evaluation_current("none", _stamp(folder, data))  # another evaluation
    for changed in (folder.config, folder.checkpoints.best, next(data.rglob("*.pcd"))):
        before = _stamp(folder, data)
        _bump(changed)
        assert not folder.evaluation_current("late", _stamp(folder, data)), changed
        folder.write_stamp("late", _stamp(folder, data))
        assert before != _stamp(folder, data)
    folder.checkpoints.latest.write_bytes(b"new")  # a new file under checkpoints/
    assert not folder.evaluation_current("late", _stamp(folder, data))
    other = tmp_path / "other" / "test"
    other.mkdir(parents=True)
    assert not folder.evaluation_current("late", EvaluationStamp.of(stamp.command, [*folder.inputs(), other], "c0"))


def test_a_missing_or_cut_result_or_stamp_is_not_current(tmp_path):
    folder, data = _run(tmp_path), _data(tmp_path)
    stamp = _stamp(folder, data)
    folder.write_stamp("late", stamp)
    assert not folder.evaluation_current("late", stamp)  # no eval_late.json
    folder.evaluation("late").write_text("{}")
    folder.stamp("late").write_text('{"command": ["x"], "code"')
    assert folder.read_stamp("late") is None and not folder.evaluation_current("late", stamp)
    folder.stamp("late").write_text(json.dumps({"command": "x", "code": "c", "files": "f", "num_files": 1}))
    assert folder.read_stamp("late") is None


def test_evaluate_once_runs_when_stale_and_stamps(tmp_path):
    folder, data = _run(tmp_path), _data(tmp_path)
    calls = []

    def evaluate():
        calls.append(1)
        folder.evaluation("late").write_text("{}")

    assert folder.evaluate_once("late", _stamp(folder, data), evaluate)
    assert not folder.evaluate_once("late", _stamp(folder, data), evaluate) and len(calls) == 1
    assert folder.evaluate_once("late", _stamp(folder, data, code="c2"), evaluate) and len(calls) == 2

    def fails():
        raise RuntimeError("killed")
    with pytest.raises(RuntimeError):
        folder.evaluate_once("late", _stamp(folder, data, code="c3"), fails)
    assert not folder.stamp("late").exists()  # the old stamp does not vouch for what a failed run left
    with pytest.raises(FileNotFoundError, match="eval_none.json"):
        folder.evaluate_once("none", _stamp(folder, data), lambda: None)


def test_files_digest_counts_missing_paths(tmp_path):
    a = files_digest([tmp_path / "absent"])
    (tmp_path / "absent").write_text("x")
    assert files_digest([tmp_path / "absent"]) != a and files_digest([tmp_path / "absent"])[1] == 1


def test_code_digest_covers_the_installed_packages_sources():
    names = [rel for rel, _ in package_sources()]
    assert "opencood_ext/run_folder.py" in names and "gencomm/link.py" in names
    assert not any(n.startswith("tests/") for n in names)
    assert code_digest() == code_digest() and len(code_digest()) == 64
    assert package_sources(("no_such_package_here",)) == []


def test_evaluation_settings_spell_out_the_inference_command(tmp_path):
    data = _data(tmp_path)
    cfg = SimpleNamespace(data=DataConfig(root=str(data.parent)))  # all evaluated_data reads
    plain = EvaluationSettings(tmp_path / "run", "late", "test", None, "late", channel=ChannelConfig(seed=3))
    assert plain.argv() == ["gencomm-infer", "--model_dir", str(tmp_path / "run"), "--fusion_method", "late",
                            "--split", "test", "--label", "late"]
    noisy = EvaluationSettings(tmp_path / "run", "late", "test", 5, "late_noise1m1deg_seed3",
                               channel=ChannelConfig(1, 1, seed=3), overrides=("data.root=x",))
    assert noisy.argv()[7:] == ["--max_frames", "5", "--pose_noise", "1,1", "--drop", "0", "--channel_seed", "3",
                                "--label", "late_noise1m1deg_seed3", "--set", "data.root=x"]
    assert evaluated_data(cfg, "test") == [data]
    late = EvaluationSettings(tmp_path / "out", "late", "test", None, "late", late_of=("m1=/r/a", "m3=/r/b"))
    assert late.runs() == [Path("/r/a"), Path("/r/b")]
    dyn = EvaluationSettings(tmp_path / "run", "intermediate", "test", None, "x", dynamic=("m1", "m3"))
    assert dyn.stamp_label == "dynamic" and dyn.argv()[-2:] == ["--dynamic", "m1,m3"]
    s1 = evaluation_stamp(plain, cfg, code="c")
    _bump(next(data.rglob("*.pcd")))
    assert evaluation_stamp(plain, cfg, code="c") != s1
