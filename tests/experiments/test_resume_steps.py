"""A resumed main job skips an evaluation whose command, code and inputs are unchanged since it
ran, and redoes it when anything it reads changed: its evaluations are ``gencomm-infer --reuse``, so
the rule is the run folder's stamp (opencood_ext.run_folder; its unit tests are in
test_run_folder_reuse.py). These tests run the driver's real evaluation step end to end."""
import json
import os
import shutil

from experiments import pipeline
from experiments.profiles import Profile
from robust_runs import trained_late_run

CURRENT = "is current"  # what gencomm-infer --reuse prints when it skips


def test_a_resumed_evaluation_is_skipped_and_redone_after_retraining(tmp_path_factory, tmp_path, capsys):
    shared = trained_late_run(tmp_path_factory)
    run = tmp_path / "run"  # a copy: the session's shared run folder stays as other tests expect it;
    shutil.copytree(shared, run, ignore=shutil.ignore_patterns("eval_*"))  # without other tests' evaluations
    profile = Profile(scenarios=1, frames=1, overrides=[f"data.root={shared.parent / 'data'}",
                                                                  "eval.max_frames=2", "eval.plot_every=0"])
    first = pipeline.evaluate_run(run, "late", profile)
    written = (run / "eval_late.json").stat().st_mtime_ns
    capsys.readouterr()
    assert pipeline.evaluate_run(run, "late", profile) == first
    assert (run / "eval_late.json").stat().st_mtime_ns == written
    assert CURRENT in capsys.readouterr().out
    stamp = json.loads((run / "eval_late.inputs.json").read_text())
    assert stamp["num_files"] >= 2 and stamp["command"][:2] == ["gencomm-infer", "--model_dir"]
    assert "--fusion_method" in stamp["command"]
    ckpt = run / "checkpoints" / "latest.pth"
    os.utime(ckpt, ns=(ckpt.stat().st_atime_ns, ckpt.stat().st_mtime_ns + 10**9))  # as a retrained run
    pipeline.evaluate_run(run, "late", profile)
    assert CURRENT not in capsys.readouterr().out
    assert (run / "eval_late.json").stat().st_mtime_ns != written


def test_rerunning_a_finished_training_keeps_its_evaluation_skipped(tmp_path, capsys):
    """The main job's real order on a rerun: gencomm-train finds the run done (and rewrites nothing it
    read), then the evaluation is skipped."""
    from opencood_ext.cli import train
    from tiny_runs import PP, tiny_config, tiny_dataset

    data = tiny_dataset(tmp_path / "data")
    cfg = tiny_config(tmp_path, data, "none_m1", {"m1": PP}, {"fusion": "none"})
    run = tmp_path / "run"
    argv = ["-y", str(cfg), "--model_dir", str(run), "--set", "train.val_every=0"]
    assert train.main(argv) == 0
    profile = Profile(scenarios=1, frames=1, overrides=[f"data.root={data}", "eval.max_frames=2",
                                                                  "eval.plot_every=0"])
    pipeline.evaluate_run(run, "none", profile)
    assert train.main(argv) == 0  # done: resumes, trains nothing
    capsys.readouterr()
    pipeline.evaluate_run(run, "none", profile)
    assert CURRENT in capsys.readouterr().out
