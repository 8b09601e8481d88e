"""A resumed main job skips an evaluation whose command, code and inputs are unchanged since it
ran, and redoes it when anything it reads changed (experiments.steps.run_step with a stamp)."""
import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from experiments import pipeline, steps
from experiments.profiles import Profile
from experiments.steps import Command
from robust_runs import trained_late_run

LOGGER = "experiments.steps"


def _count_main(argv):
    """Stands in for a program: appends one "x" to the file argv[0] and writes argv[1] (counts how
    often the step really ran); exits with argv[2]'s integer when argv[2] names an existing file."""
    c = Path(argv[0])
    c.write_text((c.read_text() if c.exists() else "") + "x")
    Path(argv[1]).write_text("out")
    return 3 if len(argv) > 2 and not argv[2].startswith("--") and Path(argv[2]).exists() else 0


@pytest.fixture(autouse=True)
def fake_program(monkeypatch):
    monkeypatch.setitem(steps.PROGRAMS, "gencomm-infer", lambda: _count_main)


def _step(tmp_path, data):
    return Command("gencomm-infer", [tmp_path / "count", tmp_path / "out.json",
                                     "--set", "data.root=/elsewhere", "--set", f"data.root={data}"])  # the last counts


def _ran(tmp_path):
    return len((tmp_path / "count").read_text())


@pytest.fixture
def world(tmp_path):
    data = tmp_path / "data"
    (data / "test" / "scn").mkdir(parents=True)
    (data / "test" / "scn" / "000.pcd").write_text("points")
    (data / "train").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "best.pth").write_text("weights")
    return tmp_path, data


def test_a_done_step_is_skipped_until_an_input_changes(world):
    tmp_path, data = world
    kw = dict(stamp=tmp_path / "out.inputs.json", reads=[tmp_path / "run"], makes=[tmp_path / "out.json"])
    run = lambda: steps.run_step(_step(tmp_path, data), **kw)  # noqa: E731
    run()
    run()
    assert _ran(tmp_path) == 1
    (tmp_path / "run" / "best.pth").write_text("weights, retrained")  # the run read changed
    run()
    assert _ran(tmp_path) == 2
    (data / "test" / "scn" / "001.pcd").write_text("a new test frame")  # the test split changed
    run()
    assert _ran(tmp_path) == 3
    (data / "train" / "new.pcd").write_text("training data")  # an evaluation reads only the test split
    run()
    assert _ran(tmp_path) == 3
    (tmp_path / "out.json").unlink()  # an output is gone
    run()
    assert _ran(tmp_path) == 4
    (tmp_path / "out.inputs.json").write_text("{not json")  # a damaged stamp
    run()
    assert _ran(tmp_path) == 5
    run()
    assert _ran(tmp_path) == 5
    other = Command("gencomm-infer", [*_step(tmp_path, data).argv, "--set", "eval.max_frames=3"])  # another command
    steps.run_step(other, **kw)
    assert _ran(tmp_path) == 6


def test_steps_without_a_stamp_or_a_data_root_always_run(world):
    tmp_path, data = world
    steps.run_step(_step(tmp_path, data))
    steps.run_step(_step(tmp_path, data))
    assert _ran(tmp_path) == 2
    no_root = Command("gencomm-infer",
                      [a for a in _step(tmp_path, data).argv if not a.startswith(("--set", "data.root"))])
    for _ in range(2):
        steps.run_step(no_root, stamp=tmp_path / "s.json", reads=[tmp_path / "run"])
    assert _ran(tmp_path) == 4 and not (tmp_path / "s.json").exists()


def test_a_failed_step_leaves_no_stamp(world, monkeypatch):
    tmp_path, data = world
    stamp = tmp_path / "fail.inputs.json"
    monkeypatch.setitem(steps.PROGRAMS, "gencomm-train", lambda: lambda argv: 3)
    with pytest.raises(steps.StepError, match="step failed \\(exit 3\\): gencomm-train --set"):
        steps.run_step(Command("gencomm-train", ["--set", f"data.root={data}"]), stamp=stamp)
    assert not stamp.exists()
    # a done step redone (its output was deleted) and interrupted after rewriting the output loses its
    # stamp, so the next rerun redoes it instead of trusting the half-written output
    flag = tmp_path / "interrupt"
    cmd = Command("gencomm-infer", [tmp_path / "count", tmp_path / "out.json", flag, "--set", f"data.root={data}"])
    kw = dict(stamp=tmp_path / "out.inputs.json", reads=[tmp_path / "run"], makes=[tmp_path / "out.json"])
    steps.run_step(cmd, **kw)
    (tmp_path / "out.json").unlink()
    flag.write_text("")
    with pytest.raises(steps.StepError, match="step failed"):
        steps.run_step(cmd, **kw)
    assert (tmp_path / "out.json").exists() and not kw["stamp"].exists()
    flag.unlink()
    steps.run_step(cmd, **kw)
    assert _ran(tmp_path) == 3 and kw["stamp"].exists()


def test_a_resumed_evaluation_is_skipped_and_redone_after_retraining(tmp_path_factory, tmp_path, caplog, monkeypatch):
    monkeypatch.undo()  # the real gencomm-infer
    shared = trained_late_run(tmp_path_factory)
    run = tmp_path / "run"  # a copy: the session's shared run folder stays as other tests expect it;
    shutil.copytree(shared, run, ignore=shutil.ignore_patterns("eval_*"))  # without other tests' evaluations
    profile = Profile(scenarios=1, frames=1, overrides=[f"data.root={shared.parent / 'data'}",
                                                                  "eval.max_frames=2", "eval.plot_every=0"])
    caplog.set_level(logging.INFO, logger=LOGGER)
    first = pipeline.evaluate_run(run, "late", profile)
    written = (run / "eval_late.json").stat().st_mtime_ns
    assert pipeline.evaluate_run(run, "late", profile) == first
    assert (run / "eval_late.json").stat().st_mtime_ns == written
    assert "skip (done" in caplog.text
    stamp = json.loads((run / "eval_late.inputs.json").read_text())
    assert stamp["num_files"] >= 2 and stamp["command"][:2] == ["gencomm-infer", "--model_dir"]
    assert "--fusion_method" in stamp["command"]
    ckpt = run / "checkpoints" / "latest.pth"
    os.utime(ckpt, ns=(ckpt.stat().st_atime_ns, ckpt.stat().st_mtime_ns + 10**9))  # as a retrained run
    caplog.clear()
    pipeline.evaluate_run(run, "late", profile)
    assert "skip (done" not in caplog.text
    assert (run / "eval_late.json").stat().st_mtime_ns != written


def test_an_edit_of_the_code_redoes_the_step_and_an_edit_of_the_docs_does_not(world, monkeypatch):
    tmp_path, data = world
    src = tmp_path / "site-packages"
    for d in ("opencood_ext", "gencomm", "experiments"):
        (src / d).mkdir(parents=True)
        (src / d / "mod.py").write_text("x = 1\n")
    monkeypatch.setattr(steps, "source_packages", lambda: [src / d for d in ("opencood_ext", "gencomm", "experiments")])
    kw = dict(stamp=tmp_path / "out.inputs.json", reads=[tmp_path / "run"], makes=[tmp_path / "out.json"])
    steps.run_step(_step(tmp_path, data), **kw)
    (src / "README.md").write_text("docs")
    steps.run_step(_step(tmp_path, data), **kw)
    assert _ran(tmp_path) == 1
    (src / "opencood_ext" / "mod.py").write_text("x = 2\n")
    steps.run_step(_step(tmp_path, data), **kw)
    assert _ran(tmp_path) == 2


def test_rerunning_a_finished_training_keeps_its_evaluation_skipped(tmp_path, caplog, monkeypatch):
    """The main job's real order on a rerun: gencomm-train finds the run done (and rewrites nothing it
    read), then the evaluation is skipped."""
    monkeypatch.undo()  # the real gencomm-infer
    from opencood_ext.cli import train
    from tiny_runs import PP, tiny_config, tiny_dataset

    data = tiny_dataset(tmp_path / "data")
    cfg = tiny_config(tmp_path, data, "none_m1", {"m1": PP}, {"fusion": "none"})
    run = tmp_path / "run"
    argv = ["-y", str(cfg), "--model_dir", str(run), "--set", "train.val_every=0"]
    assert train.main(argv) == 0
    profile = Profile(scenarios=1, frames=1, overrides=[f"data.root={data}", "eval.max_frames=2",
                                                                  "eval.plot_every=0"])
    caplog.set_level(logging.INFO, logger=LOGGER)
    pipeline.evaluate_run(run, "none", profile)
    assert train.main(argv) == 0  # done: resumes, trains nothing
    caplog.clear()
    pipeline.evaluate_run(run, "none", profile)
    assert "skip (done" in caplog.text
