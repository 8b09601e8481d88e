"""A resumed main job skips an evaluation whose command, code and inputs are unchanged since it
ran, and redoes it when anything it reads changed (gencomm.reproduce._run with a stamp)."""
import json
import logging
import os
import shutil
import sys

import pytest

from gencomm import reproduce
from robust_runs import trained_late_run

# appends one "x" to the file argv[1] and writes argv[2]: counts how often the step really ran
COUNT = ("import pathlib, sys; c = pathlib.Path(sys.argv[1]); "
         "c.write_text((c.read_text() if c.exists() else '') + 'x'); pathlib.Path(sys.argv[2]).write_text('out')")


def _step(tmp_path, data):
    return [sys.executable, "-c", COUNT, str(tmp_path / "count"), str(tmp_path / "out.json"),
            "--set", "data.root=/elsewhere", "--set", f"data.root={data}"]  # the last data.root counts


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
    run = lambda: reproduce._run(_step(tmp_path, data), **kw)  # noqa: E731
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
    other = _step(tmp_path, data) + ["--set", "eval.max_frames=3"]  # another command
    reproduce._run(other, **kw)
    assert _ran(tmp_path) == 6


def test_steps_without_a_stamp_or_a_data_root_always_run(world):
    tmp_path, data = world
    reproduce._run(_step(tmp_path, data))
    reproduce._run(_step(tmp_path, data))
    assert _ran(tmp_path) == 2
    no_root = [a for a in _step(tmp_path, data) if not a.startswith(("--set", "data.root"))]
    for _ in range(2):
        reproduce._run(no_root, stamp=tmp_path / "s.json", reads=[tmp_path / "run"])
    assert _ran(tmp_path) == 4 and not (tmp_path / "s.json").exists()


def test_a_failed_step_leaves_no_stamp(world):
    tmp_path, data = world
    stamp = tmp_path / "fail.inputs.json"
    with pytest.raises(RuntimeError, match="step failed"):
        reproduce._run([sys.executable, "-c", "raise SystemExit(3)", "--set", f"data.root={data}"], stamp=stamp)
    assert not stamp.exists()
    # a done step redone (its output was deleted) and interrupted after rewriting the output loses its
    # stamp, so the next rerun redoes it instead of trusting the half-written output
    flag = tmp_path / "interrupt"
    cmd = [sys.executable, "-c", COUNT + "; sys.exit(3 if pathlib.Path(sys.argv[3]).exists() else 0)",
           str(tmp_path / "count"), str(tmp_path / "out.json"), str(flag), "--set", f"data.root={data}"]
    kw = dict(stamp=tmp_path / "out.inputs.json", reads=[tmp_path / "run"], makes=[tmp_path / "out.json"])
    reproduce._run(cmd, **kw)
    (tmp_path / "out.json").unlink()
    flag.write_text("")
    with pytest.raises(RuntimeError, match="step failed"):
        reproduce._run(cmd, **kw)
    assert (tmp_path / "out.json").exists() and not kw["stamp"].exists()
    flag.unlink()
    reproduce._run(cmd, **kw)
    assert _ran(tmp_path) == 3 and kw["stamp"].exists()


def test_a_resumed_evaluation_is_skipped_and_redone_after_retraining(tmp_path_factory, tmp_path, caplog):
    shared = trained_late_run(tmp_path_factory)
    run = tmp_path / "run"  # a copy: the session's shared run folder stays as other tests expect it;
    shutil.copytree(shared, run, ignore=shutil.ignore_patterns("eval_*"))  # without other tests' evaluations
    profile = reproduce.Profile(scenarios=1, frames=1, overrides=[f"data.root={shared.parent / 'data'}",
                                                                  "eval.max_frames=2", "eval.plot_every=0"])
    caplog.set_level(logging.INFO, logger="gencomm.reproduce")
    first = reproduce.evaluate_run(run, "late", profile)
    written = (run / "eval_late.json").stat().st_mtime_ns
    assert reproduce.evaluate_run(run, "late", profile) == first
    assert (run / "eval_late.json").stat().st_mtime_ns == written
    assert "skip (done" in caplog.text
    stamp = json.loads((run / "eval_late.inputs.json").read_text())
    assert stamp["num_files"] >= 2 and "--fusion_method" in stamp["command"]
    ckpt = run / "checkpoints" / "latest.pth"
    os.utime(ckpt, ns=(ckpt.stat().st_atime_ns, ckpt.stat().st_mtime_ns + 10**9))  # as a retrained run
    caplog.clear()
    reproduce.evaluate_run(run, "late", profile)
    assert "skip (done" not in caplog.text
    assert (run / "eval_late.json").stat().st_mtime_ns != written


def test_an_edit_of_the_code_redoes_the_step_and_an_edit_of_the_docs_does_not(world, monkeypatch):
    tmp_path, data = world
    src = tmp_path / "checkout"
    for d in ("opencood_ext", "gencomm", "tools"):
        (src / d).mkdir(parents=True)
        (src / d / "mod.py").write_text("x = 1\n")
    monkeypatch.setattr(reproduce, "ROOT", src)
    kw = dict(stamp=tmp_path / "out.inputs.json", reads=[tmp_path / "run"], makes=[tmp_path / "out.json"])
    reproduce._run(_step(tmp_path, data), **kw)
    (src / "README.md").write_text("docs")
    reproduce._run(_step(tmp_path, data), **kw)
    assert _ran(tmp_path) == 1
    (src / "opencood_ext" / "mod.py").write_text("x = 2\n")
    reproduce._run(_step(tmp_path, data), **kw)
    assert _ran(tmp_path) == 2


def test_rerunning_a_finished_training_keeps_its_evaluation_skipped(tmp_path, caplog):
    """The main job's real order on a rerun: tools/train.py finds the run done (and rewrites nothing it
    read), then the evaluation is skipped."""
    from opencood_ext.cli import train
    from tiny_runs import PP, tiny_config, tiny_dataset

    data = tiny_dataset(tmp_path / "data")
    cfg = tiny_config(tmp_path, data, "none_m1", {"m1": PP}, {"fusion": "none"})
    run = tmp_path / "run"
    argv = ["-y", str(cfg), "--model_dir", str(run), "--set", "train.val_every=0"]
    assert train.main(argv) == 0
    profile = reproduce.Profile(scenarios=1, frames=1, overrides=[f"data.root={data}", "eval.max_frames=2",
                                                                  "eval.plot_every=0"])
    caplog.set_level(logging.INFO, logger="gencomm.reproduce")
    reproduce.evaluate_run(run, "none", profile)
    assert train.main(argv) == 0  # done: resumes, trains nothing
    caplog.clear()
    reproduce.evaluate_run(run, "none", profile)
    assert "skip (done" in caplog.text
