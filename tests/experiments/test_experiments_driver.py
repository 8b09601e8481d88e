"""The experiment driver runs its steps in-process (a command-line program's main(argv), no
subprocess), restores the process state a step changes, stops on a failed step with its command
line, and reads and writes results.json through typed records that round-trip every committed file."""
import dataclasses
import json
import logging
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments import pipeline, steps
from experiments.profiles import PROFILES
from experiments.archives import load_archive
from experiments.evaluation import Evaluation
from experiments.results import ResultRow, Results, ResultsError
from experiments.steps import Command, StepError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_subprocess(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError(f"a step started a subprocess: {a}")
    monkeypatch.setattr(subprocess, "Popen", refuse)


def test_a_training_step_calls_the_train_program_in_process(tmp_path, monkeypatch, no_subprocess):
    seen = []

    def fake_train(argv):
        seen.append(argv)
        os.chdir(tmp_path)  # state a program may change: all of it is restored after the step
        torch.set_num_threads(1)
        random.seed(123)
        np.random.seed(123)
        torch.manual_seed(123)
        logging.getLogger().addHandler(logging.NullHandler())
        return 0
    monkeypatch.setitem(steps.PROGRAMS, "gencomm-train", lambda: fake_train)
    monkeypatch.setattr(pipeline, "training_wall_time", lambda run: 12.5)
    cwd, threads, handlers = os.getcwd(), torch.get_num_threads(), list(logging.getLogger().handlers)
    before = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    wall = pipeline.train(tmp_path / "cfg.yaml", tmp_path / "run", tmp_path / "data", PROFILES["quick"])
    assert wall == 12.5 and before != expected
    assert seen == [["-y", str(tmp_path / "cfg.yaml"), "--model_dir", str(tmp_path / "run"),
                     "--set", f"data.root={tmp_path / 'data'}", *steps.sets(PROFILES["quick"].overrides)]]
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert os.getcwd() == cwd and torch.get_num_threads() == threads and logging.getLogger().handlers == handlers


@pytest.mark.parametrize("outcome, message", [
    (lambda argv: 2, r"step failed \(exit 2\): gencomm-infer --model_dir 'r un'$"),
    (lambda argv: (_ for _ in ()).throw(SystemExit(2)), r"step failed \(exit 2\): gencomm-infer"),
    (lambda argv: 1 / 0, r"step failed \(ZeroDivisionError: division by zero\): gencomm-infer --model_dir 'r un'")])
def test_a_failed_step_stops_the_job_with_its_command_line(monkeypatch, no_subprocess, outcome, message):
    monkeypatch.setitem(steps.PROGRAMS, "gencomm-infer", lambda: outcome)
    with pytest.raises(StepError, match=message):
        steps.call(Command("gencomm-infer", ["--model_dir", "r un"]))


def test_every_step_program_is_a_command_line_main():
    for name, load in steps.PROGRAMS.items():
        assert callable(load()), name
    with pytest.raises(ValueError, match="unknown program 'tools/train.py'"):
        Command("tools/train.py", [])


def test_every_evaluation_of_the_main_job_reuses_by_the_run_folders_rule(tmp_path, monkeypatch):
    """The driver keeps no reuse rule of its own: each evaluation is ``gencomm-infer --reuse``."""
    calls = []
    monkeypatch.setattr(pipeline, "call", calls.append)
    monkeypatch.setattr(pipeline.RunFolder, "read_evaluation", lambda self, label: {"label": label})
    assert pipeline.evaluate_run(tmp_path / "run", "no", PROFILES["quick"]) == {"label": "none"}
    assert calls[0].program == "gencomm-infer" and "--reuse" in calls[0]


def test_the_robustness_sweep_runs_every_row_in_process(tmp_path, monkeypatch, no_subprocess):
    calls = []
    monkeypatch.setattr(pipeline, "call", calls.append)
    rows = [ResultRow("no_fusion", "No fusion", Evaluation({}, details={"fusion": "none"}), 1.0, 1, run="/r/none"),
            ResultRow("gencomm", "GenComm (m3 onboarded)", Evaluation({}, details={"fusion": "intermediate"}), 1.0, 1,
                      run="/r/gc")]
    path = pipeline.robustness_sweep(rows, tmp_path / "rob", PROFILES["quick"], seed=3)
    cmd = calls[0]
    assert path == tmp_path / "rob" / "robustness.json" and cmd.program == "gencomm-robustness"
    assert "No fusion=/r/none:none" in cmd and "GenComm (m3 onboarded)=/r/gc:intermediate" in cmd
    assert cmd.value("--channel_seed") == "3" and cmd.value("--noise") == "0,0.6"
    # the quick profile's separate test set has one frame per scene: latency cannot delay anything there
    assert cmd.value("--latency") == "0" and cmd.value("--drop") == "0,1"
    calls.clear()
    own_split = dataclasses.replace(PROFILES["quick"], test_scenes=0)  # the dataset's 3-frame scenes: swept
    pipeline.robustness_sweep(rows, tmp_path / "rob", own_split, seed=3)
    assert calls[0].value("--latency") == "0,3"


def _committed(pattern):
    found = sorted(ROOT.glob(pattern))
    assert found, pattern
    return found


# archive/fair_benchmark/results.json is the fair benchmark's combined document, not one main job's
# Results (tests/experiments/test_fair_benchmark.py checks it); its seed archives round-trip below
@pytest.mark.parametrize("path", [p for p in _committed("archive/*/results.json") if p.parent.name != "fair_benchmark"],
                         ids=lambda p: p.parent.name)
def test_every_committed_results_json_round_trips(path):
    doc = json.loads(path.read_text())
    results = Results.load(path)
    assert results.to_dict() == doc  # the ids these files predate are derived on reading, not written back
    assert Results.from_json(results.to_json()) == results
    assert results.main_rows() and all(r.table == "main" for r in results.main_rows())
    assert [r.method_id for r in results.main_rows()] == ["no_fusion", "late", "early", "intermediate", "gencomm"]
    hetero = {r.method_id for r in results.hetero_rows()}
    if path.parent.name == "main_default":  # the default main job runs no benchmark (--benchmark adds it)
        assert not hetero
    else:
        assert hetero >= {"gencomm", "backalign", "late_of_stage1", "none_of_stage1"}


@pytest.mark.parametrize("path", _committed("archive/main_table*/seed*/rows.json")
                         + _committed("archive/main_default/seeds/seed*/rows.json")
                         + _committed("archive/fair_benchmark/*/seed*/rows.json"),
                         ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_every_committed_seed_archive_row_round_trips(path):
    doc = json.loads(path.read_text())
    archive = load_archive(path.parent)
    assert [r.to_archive() for r in archive.rows] == doc["rows"]
    assert [r.to_archive() for r in archive.benchmark] == doc.get("benchmark", [])


def test_a_malformed_results_json_is_one_error_naming_file_and_field(tmp_path):
    good = Results(profile="quick", seed=0, data="d",
                   rows=[ResultRow("no_fusion", "No fusion", Evaluation({}), 1.0, 10)],
                   onboarding={}, stage1_wall_s={"m1": 1.0}, total_wall_s=2.0)
    path = good.write(tmp_path / "results.json")
    assert Results.load(path) == good
    for change, field in (({"seed": "0"}, "key 'seed': expected an integer"),
                          ({"rows": {}}, "key 'rows': expected a list"),
                          ({"extra": 1}, "key 'extra': unknown key for Results")):
        path.write_text(json.dumps({**good.to_dict(), **change}))
        with pytest.raises(ResultsError, match=f"^{path}: {field}"):
            Results.load(path)
    doc = good.to_dict()
    doc["rows"][0]["trainable_params"] = 1.5
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=r"key 'rows\.0\.trainable_params': expected an integer, got 1\.5"):
        Results.load(path)
    doc["rows"][0] = {**good.rows[0].to_dict(), "table": "side"}
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=r"key 'rows\.0\.table': must be one of \['main', 'heterogeneous'\]"):
        Results.load(path)
    path.write_text("{")
    with pytest.raises(ResultsError, match="not a results.json"):
        Results.load(path)


def test_the_main_job_keeps_frozen_features_in_one_folder_unless_told_not_to(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(pipeline, "call", calls.append)
    monkeypatch.setattr(pipeline.RunFolder, "read_evaluation", lambda self, label: {"label": label})
    cached = dataclasses.replace(PROFILES["quick"], feature_cache=str(tmp_path / "cache"))
    pipeline.evaluate_run(tmp_path / "run", "no", cached)
    pipeline.evaluate_run(tmp_path / "run", "no", PROFILES["quick"])
    rows = [ResultRow("no_fusion", "No fusion", Evaluation({}, details={"fusion": "none"}), 1.0, 1, run="/r/none")]
    pipeline.robustness_sweep(rows, tmp_path / "rob", cached, seed=0)
    assert [c.value("--feature_cache") if "--feature_cache" in c else None for c in calls] == [
        str(tmp_path / "cache"), None, str(tmp_path / "cache")]
    assert PROFILES["default"].feature_cache is None  # reproduce() sets <out>/cache/features per invocation
