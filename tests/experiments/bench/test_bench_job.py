"""gencomm-bench job (experiments/bench/job_cost.py): the projection counts what the main job does.
Its timings are measurements, never asserted; these tests check the counts it multiplies by."""
import dataclasses
from pathlib import Path

import pytest

from experiments.bench import job_cost
from experiments.profiles import PROFILES


def test_train_frames_follow_the_simulators_split():
    # default: 400 scenes, split 0.85 / 0.05 / 0.1 -> 340 train and 20 validation scenes of 3 frames
    assert job_cost._train_frames(PROFILES["default"]) == (1020, 60)
    assert job_cost._train_frames(PROFILES["quick"]) == (6, 3)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="--steps"):
        job_cost.main(["--steps", "0"])
    with pytest.raises(SystemExit):
        job_cost.main(["--profile", "nope"])


def test_the_plan_follows_what_the_main_job_runs():
    default = job_cost.job_plan(PROFILES["default"])
    assert [n for n, _ in default.trainings] == ["m1_none", "m1m3_late", "m1m3_early", "m1m3_intermediate",
                                                 "gencomm_stage1_m1", "gencomm_stage1_m3"]
    assert default.onboardings == [("gencomm_m1_m3", "sim/stage2/gencomm_m1_m3.yaml")]
    # four baselines and GenComm; pose noise 0.4 and loss 0.5 (latency is not swept on one-frame scenes)
    assert (default.main_rows, default.sweep_levels, default.benchmark_evals, default.cameras) == (5, 2, 0, False)
    full = job_cost.job_plan(PROFILES["full"])
    assert [n for n, _ in full.onboardings] == ["gencomm_m1_m3", "gencomm_egotarget_m1_m3"]
    assert (full.main_rows, full.sweep_levels) == (6, 6)  # noise 0.2 / 0.4 / 0.6, loss 0.25 / 0.5 / 0.75
    bench = job_cost.job_plan(PROFILES["default"], benchmark=True)
    names = [n for n, _ in bench.trainings]
    assert names[6:] == ["gencomm_stage1_m2", "gencomm_stage1_m4", "baseline_stage1_m1", "baseline_stage1_m2",
                         "baseline_stage1_m3", "baseline_stage1_m4"]
    assert [n for n, c in bench.onboardings if c is None] == ["gencomm", "backalign", "stamp", "mpda",
                                                             "mpda_fusion_head", "codefilling"]
    assert bench.main_rows == 5 and bench.cameras and bench.benchmark_evals == 7 * 4 + 1


def test_the_projection_multiplies_each_step_by_the_plans_counts(monkeypatch):
    """With fixed step times (nothing is timed), every planned config is visited and the minutes add up."""
    seen = []

    def training(config, data, steps, profile):
        seen.append(("train", config.name))
        return {"step_s": 2.0, "steps": 216, "seconds": 600.0}

    def onboarding(config, data, steps, profile):
        seen.append(("onboard", config.name))
        return {"step_s": 1.0, "cached_step_s": 0.5, "steps": 216, "seconds": 120.0, "cached_seconds": 60.0}

    monkeypatch.setattr(job_cost, "_simulate", lambda root, profile, scenarios, cameras: 0.5)
    monkeypatch.setattr(job_cost, "_training", training)
    monkeypatch.setattr(job_cost, "_onboarding", onboarding)
    monkeypatch.setattr(job_cost, "_evaluation", lambda config, data, frames, profile: (0.4, 0.1))
    out = job_cost.project("default", steps=1, frames=1)
    assert [n for k, n in seen if k == "train"] == [f"{n}.yaml" for n, _ in job_cost.job_plan(PROFILES["default"]).trainings]
    assert seen[-1] == ("onboard", "gencomm_m1_m3.yaml")
    assert out["minutes: training"] == 60.0 and out["minutes: onboarding"] == 2.0
    assert out["minutes: simulation"] == round(0.5 * (1200 + 230) / 60, 1)
    assert out["minutes: evaluation"] == round(230 * 5 * 4 * 0.4 / 60, 1)  # 5 rows x (2 + 2 sweep levels)
    assert out["benchmark"] is False and "evaluate s/frame: benchmark alliance (cached)" not in out
    with_bench = job_cost.project("default", steps=1, frames=1, benchmark=True)
    assert with_bench["benchmark"] is True and "onboard codefilling: s/step (cached) x steps" in with_bench


def test_one_learning_curve_budget_is_the_lidar_pair_with_its_benchmark_and_no_sweep(monkeypatch):
    plan = job_cost.job_plan(dataclasses.replace(PROFILES["full"], benchmark_types=("m1", "m3")), True,
                             robustness=False)
    assert [n for n, _ in plan.trainings][6:] == ["baseline_stage1_m1", "baseline_stage1_m3"]
    # the benchmark's GenComm onboarding of m3 is the main table's run (same folder, same config): priced once
    assert [n for n, _ in plan.onboardings] == ["gencomm_m1_m3", "gencomm_egotarget_m1_m3", "backalign", "stamp",
                                                "mpda", "mpda_fusion_head", "codefilling"]
    assert (plan.sweep_levels, plan.cameras, plan.benchmark_evals) == (0, False, 7 * 2 + 1)
    seen = []
    monkeypatch.setattr(job_cost, "project", lambda *a, **k: seen.append((a, k)) or {})
    job_cost.main(["--profile", "full", "--benchmark_types", "m1,m3", "--no_robustness"])
    assert seen[0][0][5] is None and seen[0][0][6] == ["m1", "m3"] and seen[0][1] == {"robustness": False}


@pytest.mark.parametrize("name", sorted(PROFILES))
@pytest.mark.parametrize("benchmark", [False, True])
def test_the_plan_prices_the_runs_the_pipeline_trains(tmp_path, name, benchmark):
    """job_plan and experiments.pipeline ask the same trained_types, so the projection's trainings are
    exactly the runs one seed of the main job trains (the pipeline's lanes list them longest first)."""
    from experiments.pipeline import trainings_longest_first
    from experiments.profiles import trained_types
    profile = PROFILES[name]
    planned = {n for n, _ in job_cost.job_plan(profile, benchmark).trainings}
    stage1, competitors = trained_types(profile, benchmark)
    trained = {run.name for _, run in trainings_longest_first(tmp_path, tmp_path / "runs", stage1, competitors)}
    assert planned == trained
    assert {"gencomm_stage1_m1", "gencomm_stage1_m3"} <= trained
    assert (len(trained) > 6) == (benchmark and profile.competitor_stage1 == "own" or
                                  benchmark and any(t not in ("m1", "m3") for t in profile.benchmark_types))


def test_the_lidar_pairs_benchmark_gencomm_run_is_the_main_tables_folder(tmp_path):
    """What lets the plan price it once: the benchmark names its GenComm m3 onboarding exactly as the main
    table's (MAIN_ONBOARDING, the pipeline's folder), so its gencomm-onboard finds that run finished; the other
    methods and alliances get folders of their own."""
    from experiments import benchmark
    from experiments.profiles import MAIN_ONBOARDING, onboarding_folder
    assert MAIN_ONBOARDING == "onboard_gencomm_m3"
    assert onboarding_folder("stamp", ("m1", "m3"), True) == "onboard_stamp_m3_own_stage1"
    assert onboarding_folder("gencomm", ("m1", "m2", "m3", "m4")) == "onboard_gencomm_m2m3m4"
    seen = []

    def run_cmd(command):
        seen.append((command.program, Path(command.argv[command.argv.index("-o") + 1]).name))
        raise StopIteration  # the first onboarding is all this test needs

    with pytest.raises(StopIteration):
        benchmark.run_benchmark(tmp_path / "runs", {"m1": tmp_path / "a", "m3": tmp_path / "b"}, "sim", run_cmd, [],
                                types=("m1", "m3"))
    assert seen == [("gencomm-onboard", MAIN_ONBOARDING)]
