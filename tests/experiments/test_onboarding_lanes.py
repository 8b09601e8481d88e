"""The main job's onboardings side by side (experiments/lanes.py; issue 49, the learning curves on two
cores): with two lanes every onboarding of one seed runs in the lanes once the trainings are done, by the
very command the sequential steps then find finished, one lane per run folder; without lanes nothing
changes; the real lane work reports a failed onboarding as its step's one-line error."""
import dataclasses
from pathlib import Path

import pytest

from experiments import pipeline
from experiments.benchmark import METHODS
from experiments.lanes import LanePlan, side_by_side
from experiments.profiles import EGOTARGET_ONBOARDING, MAIN_ONBOARDING, PROFILES
from experiments.steps import Command, StepError
from opencood_ext.config_files import configs_root
from test_benchmark_alliance import _stage1_runs
from test_score_epochs import _fake_tools


def _job(tmp_path, monkeypatch, plan, **profile_fields):
    """One seed of the LiDAR-pair job (main table with the variant row, benchmark from the competitors' own
    stage-1 runs, 8 onboarding epochs, a feature cache) with stand-in tools; -> (every command in the
    order run, the commands handed to lanes)."""
    runs = tmp_path / "runs"
    _stage1_runs(runs, "gencomm")
    _stage1_runs(runs, "baseline")
    log, laned = [], []
    tools = _fake_tools(log)

    def fake_call(cmd):
        if cmd.program == "gencomm-onboard" or "--dynamic" in cmd:
            return tools(cmd)
        log.append(cmd)  # the main table's evaluations (evaluate_run) read nothing back here

    def lanes(tasks, plan, work, what="runs"):
        assert work is pipeline.onboard_in_lane and what == "onboardings" and plan == LanePlan(2, 1)
        for (cmd,) in tasks:
            laned.append(cmd)
            fake_call(cmd)
        return [Path(c.value("-o")).name for (c,) in tasks]
    monkeypatch.setattr(pipeline, "call", fake_call)
    monkeypatch.setattr(pipeline, "side_by_side", lanes)
    monkeypatch.setattr(pipeline, "train_side_by_side", lambda trainings, *a: [r.name for _, r in trainings])
    monkeypatch.setattr(pipeline, "train", lambda config, run, data, profile: 1.0)
    monkeypatch.setattr(pipeline, "evaluate_run", lambda run, fusion, profile: {"ap": {"0.5": 0.5}, "fusion": fusion})
    monkeypatch.setattr(pipeline, "count_trainable", lambda run: 1)
    monkeypatch.setattr(pipeline, "run_facts", lambda run, trained=True: {"protocol": "equalized"})
    fields = dict(benchmark=True, benchmark_types=("m1", "m3"), competitor_stage1="own", variant_rows=True,
                  onboard_epochs=8, feature_cache=str(tmp_path / "cache"))
    profile = dataclasses.replace(PROFILES["quick"], **{**fields, **profile_fields})
    pipeline.one_seed(tmp_path, runs, tmp_path / "data", profile, 0, pipeline.Steps(), configs_root(),
                      robustness=False, plan=plan)
    return log, laned


def test_lanes_onboard_exactly_what_the_sequential_steps_then_find_finished(tmp_path, monkeypatch):
    log, laned = _job(tmp_path, monkeypatch, LanePlan(2, 1))
    assert log[:len(laned)] == laned  # the lanes first, before any evaluation
    sequential = [c for c in log[len(laned):] if c.program == "gencomm-onboard"]
    assert laned == pipeline.one_per_folder(sequential)  # the same commands, in the same order
    folders = [Path(c.value("-o")).name for c in laned]
    # the main table's GenComm onboarding is the benchmark's: one lane for it, not two on one folder
    assert len(folders) == len(set(folders)) == len(METHODS) + 1
    assert folders[:2] == [MAIN_ONBOARDING, EGOTARGET_ONBOARDING]
    assert all(c.value("--epochs") == "8" and c.value("--feature_cache") == str(tmp_path / "cache") for c in laned)


def test_without_lanes_the_onboardings_run_when_their_rows_come(tmp_path, monkeypatch):
    log, laned = _job(tmp_path / "one", monkeypatch, LanePlan(1, 2))
    assert laned == []
    alone = [c.line() for c in log if c.program == "gencomm-onboard"]
    assert len(alone) == len(METHODS) + 2  # GenComm's twice: the main table's row, then the benchmark's
    log, laned = _job(tmp_path / "two", monkeypatch, LanePlan(2, 1))
    after_lanes = [c.line().replace(str(tmp_path / "two"), str(tmp_path / "one"))
                   for c in log[len(laned):] if c.program == "gencomm-onboard"]
    assert after_lanes == alone  # the sequential steps are the same with lanes before them


def test_a_lone_onboarding_runs_in_the_job_on_every_thread(tmp_path, monkeypatch):
    """The default main job (main table only, no variant row) onboards once: no lane for it."""
    log, laned = _job(tmp_path, monkeypatch, LanePlan(2, 1), benchmark=False, variant_rows=False)
    assert laned == [] and [Path(c.value("-o")).name for c in log if c.program == "gencomm-onboard"] == [MAIN_ONBOARDING]


def test_one_lane_per_run_folder():
    a1 = Command("gencomm-onboard", ["-y", "a.yaml", "-o", "runs/a"])
    a2 = Command("gencomm-onboard", ["-y", "other.yaml", "-o", "runs/a"])
    b = Command("gencomm-onboard", ["-y", "b.yaml", "-o", "runs/b"])
    assert pipeline.one_per_folder([a1, b, a1, a2]) == [a1, b]


def test_a_failed_onboarding_lane_stops_the_job_with_its_step_error(tmp_path):
    """The real lane work (gencomm-onboard in a spawned process) on a config that does not exist."""
    cmd = Command("gencomm-onboard", ["-y", tmp_path / "missing.yaml", "--ego", tmp_path / "e", "--new", tmp_path / "n",
                                      "-o", tmp_path / "runs" / "a"])
    with pytest.raises(StepError, match=r"step failed .*gencomm-onboard -y .*missing.yaml"):
        side_by_side([(cmd,)], LanePlan(2, 1), pipeline.onboard_in_lane, "onboardings")
    assert not (tmp_path / "runs" / "a" / "onboarding.json").exists()
