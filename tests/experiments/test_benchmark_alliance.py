"""The heterogeneous benchmark on a chosen alliance (``gencomm-reproduce --benchmark_types``):
every method has a stage-2 config per alliance built from the same method fragment, a missing
alliance fails before anything trains, and the report names the alliance that ran."""
import dataclasses
from pathlib import Path

import pytest

import gencomm  # noqa: F401  (registers GenComm's link and onboarding)
from experiments.benchmark import METHODS, run_benchmark, stage2_config
from experiments.evaluation import Alliance, Evaluation
from experiments.results import ResultRow
from opencood_ext.config_files import configs_root
from opencood_ext.experiment import load_experiment

ALLIANCES = [("m1", "m3"), ("m1", "m2"), ("m1", "m2", "m3", "m4")]


@pytest.mark.parametrize("method", [m for _, m in METHODS])
@pytest.mark.parametrize("types", ALLIANCES)
def test_every_method_has_a_config_per_alliance(method, types):
    cfg = load_experiment(stage2_config("sim", method, types))
    assert set(cfg.model["agent_types"]) == set(types)
    assert list(cfg.stage.new_types) == list(types[1:]) and cfg.stage.method == method
    assert cfg.data.modality == "cycle:" + ",".join(types)
    if method == "mpda":
        assert cfg.model["link"]["adapted_types"] == list(types[1:])


@pytest.mark.parametrize("method", [m for _, m in METHODS])
def test_alliances_share_the_method_part(method):
    """Schedule and link come from one fragment (configs/sim/stage2/methods/), not per-alliance copies."""
    full, *smaller = (load_experiment(stage2_config("sim", method, t)) for t in reversed(ALLIANCES))
    strip = lambda link: {k: v for k, v in (link or {}).items() if k != "adapted_types"}  # noqa: E731
    for small in smaller:
        assert dataclasses.asdict(small.train) == dataclasses.asdict(full.train)
        assert strip(small.model.get("link")) == strip(full.model.get("link"))
        assert small.model.get("fusion") == full.model.get("fusion")


def test_main_table_onboarding_is_the_benchmark_gencomm_run_on_the_lidar_pair():
    from experiments.profiles import STAGE2
    assert configs_root() / STAGE2 == stage2_config("sim", "gencomm", ("m1", "m3"))


def test_stage2_configs_come_from_the_configs_root_given(tmp_path):
    (tmp_path / "sim" / "stage2").mkdir(parents=True)
    (tmp_path / "sim" / "stage2" / "stamp_m1_m3.yaml").write_text("name: x\n")
    assert stage2_config("sim", "stamp", ("m1", "m3"), tmp_path) == tmp_path / "sim" / "stage2" / "stamp_m1_m3.yaml"
    with pytest.raises(FileNotFoundError, match="gencomm_m1_m3.yaml"):
        stage2_config("sim", "gencomm", ("m1", "m3"), tmp_path)


def test_missing_alliance_fails_before_any_command(tmp_path):
    ran = []
    with pytest.raises(FileNotFoundError, match=r"gencomm_m1_m4\.yaml.*m1, m4"):
        run_benchmark(tmp_path, {"m1": tmp_path, "m4": tmp_path}, "sim", ran.append, [], types=("m1", "m4"))
    assert ran == []


def test_report_names_the_alliance_that_ran(tmp_path):
    from experiments.report_hetero import hetero_section
    ev = {"ap": {"global": {"0.3": 0.8, "0.5": 0.7, "0.7": 0.3}, "per_frame": {"0.3": 0.8, "0.5": 0.7, "0.7": 0.3}},
          "bytes_per_message": 100.0}
    rows = [ResultRow(name.split()[0].lower(), name, Evaluation.from_run_json(ev), table="heterogeneous",
                      trainable_params=p, train_wall_s=1.0,
                      alliances=[Alliance.from_run_json(dict(ev, types=["m1"])),
                                 Alliance.from_run_json(dict(ev, types=["m1", "m3"], onboard_params=p,
                                                             onboard_gflops=1.0))])
            for name, p in (("GenComm (m3 onboarded)", 100), ("STAMP (m3 onboarded)", 1000))]
    text = "\n".join(hetero_section(rows, tmp_path))
    assert "## Heterogeneous benchmark: m3 joins m1's alliance" in text
    assert "m1 PointPillars 64-beam, m3 SECOND 32-beam (the first is the ego)" in text
    assert "| method | {m1} | +m3 |" in text and "m2" not in text


@pytest.mark.parametrize("t", ["m1", "m2", "m3", "m4"])
def test_competitor_stage1_differs_from_gencomm_stage1_only_in_the_link(t):
    """The competitors' own stage 1 (the reference's baselines/stage1): same data, schedule, stack
    and fusion op as GenComm's stage 1; full features on the wire."""
    from experiments.profiles import COMPETITOR_STAGE1, STAGE1
    own, gen = load_experiment(configs_root() / COMPETITOR_STAGE1[t]), load_experiment(configs_root() / STAGE1[t])
    assert own.model["link"]["type"] == "full_feature" and gen.model["link"]["type"] == "gencomm"
    assert dataclasses.asdict(own.train) == dataclasses.asdict(gen.train)
    assert dataclasses.asdict(own.data) == dataclasses.asdict(gen.data) and own.data.modality == f"all:{t}"
    strip = lambda m: {k: v for k, v in m.items() if k != "link"}  # noqa: E731
    assert strip(own.model) == strip(gen.model)


def _write_config(run: Path, config: Path) -> None:
    """The run folder's config.yaml as a tool writes it (the resolved experiment)."""
    import yaml

    from opencood_ext.config import config_to_dict
    from opencood_ext.run_folder import RunFolder
    run.mkdir(parents=True, exist_ok=True)
    RunFolder(run).config.write_text(yaml.safe_dump(config_to_dict(load_experiment(config))))


def _stage1_runs(tmp_path, kind: str, types=("m1", "m3")) -> dict:
    """Stage-1 run folders (config only) of ``kind`` ("gencomm" or "baseline") per type."""
    runs = {t: tmp_path / f"{kind}_stage1_{t}" for t in types}
    for t, run in runs.items():
        _write_config(run, configs_root() / "sim" / f"{kind}_stage1_{t}.yaml")
    return runs


def _fake_tools(log):
    """Stands in for gencomm-onboard and gencomm-infer --dynamic: records the command and
    writes the files the benchmark reads back."""
    import json
    from pathlib import Path

    def run(cmd, **resume):
        log.append(cmd)
        if cmd.program == "gencomm-onboard":
            out = Path(cmd.value("-o"))
            out.mkdir(parents=True, exist_ok=True)
            _write_config(out, Path(cmd.value("-y")))
            (out / "onboarding.json").write_text(json.dumps({"trainable_params_total": 1,
                                                             "trainable_params_per_new_type": {"m3": 1},
                                                             "onboarding_wall_time_s": 1.0}))
            return
        out = Path(cmd.value("--model_dir") if "--model_dir" in cmd else cmd.value("-o"))
        out.mkdir(parents=True, exist_ok=True)
        types = cmd.value("--dynamic").split(",")
        ev = {"ap": {"global": {"0.5": 0.5}}, "ap_ci": {}, "bytes_per_message": 1.0}
        dyn = [dict(ev, types=types[:k + 1]) for k in range(len(types))]
        (out / "eval_dynamic.json").write_text(json.dumps(dyn))
        (out / f"eval_dyn_{'+'.join(types)}.json").write_text(json.dumps(ev))
    return run


def test_competitors_start_from_their_own_stage1_runs(tmp_path):
    gen = _stage1_runs(tmp_path, "gencomm")
    own = _stage1_runs(tmp_path, "baseline")
    log = []
    rows = run_benchmark(tmp_path, gen, "sim", _fake_tools(log), [], types=("m1", "m3"), competitor_stage1=own)
    onboard = {Path(c.value("-y")).name: c for c in log if c.program == "gencomm-onboard"}
    assert len(onboard) == len(METHODS)
    for cfg, cmd in onboard.items():
        start = gen if cfg.startswith("gencomm") else own
        assert cmd.value("--ego") == str(start["m1"]) and cmd.value("--new") == str(start["m3"])
        out = cmd.value("-o")
        assert out.endswith("_m3") if cfg.startswith("gencomm") else out.endswith("_m3_own_stage1")
    evaluations = [c for c in log if c.program == "gencomm-infer"]
    assert len(evaluations) == len(METHODS) + 2 and all("--reuse" in c for c in evaluations)
    # every row states its protocol, training seed and optimizer steps (0: built from stage-1 runs)
    assert {r.protocol for r in rows} == {"equalized"} and {r.training_seed for r in rows} == {0}
    assert [r.optimizer_steps for r in rows][-2:] == [0, 0]
    notes = {r.method: r.note for r in rows}
    assert "from full-feature stage-1 runs" in notes["BackAlign (m3 onboarded)"]
    assert "from GenComm's stage-1 runs" in notes["GenComm (m3 onboarded)"]
    origin = {r.method: r.stage1 for r in rows}
    assert origin["BackAlign (m3 onboarded)"] == "full_feature" and origin["GenComm (m3 onboarded)"] == "gencomm"


def test_competitor_stage1_must_cover_the_alliance(tmp_path):
    log = []
    with pytest.raises(ValueError, match="competitor stage-1 runs for"):
        run_benchmark(tmp_path, {"m1": tmp_path, "m3": tmp_path}, "sim", _fake_tools(log), [],
                      types=("m1", "m3"), competitor_stage1={"m1": tmp_path})
    assert log == []


def test_report_says_which_stage1_the_competitors_started_from(tmp_path):
    from experiments.report_hetero import hetero_section
    ev = {"ap": {"global": {"0.3": 0.8, "0.5": 0.7, "0.7": 0.3}, "per_frame": {"0.3": 0.8, "0.5": 0.7, "0.7": 0.3}},
          "bytes_per_message": 100.0}

    def rows(origin):
        return [ResultRow(name.split()[0].lower(), name, Evaluation.from_run_json(ev), table="heterogeneous",
                          trainable_params=1, train_wall_s=1.0, stage1=o,
                          alliances=[Alliance.from_run_json(dict(ev, types=["m1"])),
                                     Alliance.from_run_json(dict(ev, types=["m1", "m3"], onboard_params=1,
                                                                 onboard_gflops=1.0))])
                for name, o in (("GenComm (m3 onboarded)", "gencomm"), ("STAMP (m3 onboarded)", origin))]
    assert "the other methods start from homogeneous full-feature" in "\n".join(
        hetero_section(rows("full_feature"), tmp_path))
    assert "Every method starts from the same GenComm stage-1 runs" in "\n".join(
        hetero_section(rows("gencomm"), tmp_path))


def test_evaluations_read_the_separate_test_set_and_onboarding_does_not(tmp_path):
    gen = _stage1_runs(tmp_path, "gencomm")
    log = []
    run_benchmark(tmp_path, gen, "sim", _fake_tools(log), ["data.root=/d"], types=("m1", "m3"),
                  eval_overrides=["data.root=/d_test"])
    onboard = [c for c in log if c.program == "gencomm-onboard"]
    infer = [c for c in log if c.program == "gencomm-infer"]
    assert len(onboard) == len(METHODS) and len(infer) == len(METHODS) + 2  # + late and no fusion of stage 1
    assert all("data.root=/d" in c and "data.root=/d_test" not in c for c in onboard)
    # the test set's root comes after the dataset's, so it wins (a later --set overrides an earlier one)
    assert all([a for a in c.argv if a.startswith("data.root=")] == ["data.root=/d", "data.root=/d_test"]
               for c in infer)


def test_every_onboarding_and_evaluation_shares_the_feature_cache(tmp_path):
    """The benchmark passes one --feature_cache folder to every onboarding and evaluation (frozen
    stage-1 encoders then encode each frame once), and none without it."""
    gen = _stage1_runs(tmp_path, "gencomm")
    for cache in (None, str(tmp_path / "cache")):
        log = []
        run_benchmark(tmp_path, gen, "sim", _fake_tools(log), ["data.root=/d"], types=("m1", "m3"),
                      feature_cache=cache)
        used = {c.value("--feature_cache") if "--feature_cache" in c else None for c in log}
        assert used == {cache} and {c.program for c in log} == {"gencomm-onboard", "gencomm-infer"}


@pytest.mark.parametrize("competitor_stage1", ["own", "gencomm"])
def test_the_job_plan_prices_the_onboardings_the_benchmark_runs(tmp_path, competitor_stage1):
    """gencomm-bench job's plan and run_benchmark ask one rule (profiles.starts_from_own_stage1) for which
    folder each method onboards into, so the plan prices every benchmark onboarding but the one that is the
    main table's run (MAIN_ONBOARDING), once each."""
    from experiments.bench.job_cost import job_plan
    from experiments.profiles import BASELINES, MAIN_ONBOARDING, PROFILES
    profile = dataclasses.replace(PROFILES["full"], benchmark_types=("m1", "m3"), competitor_stage1=competitor_stage1)
    gen = _stage1_runs(tmp_path, "gencomm")
    own = _stage1_runs(tmp_path, "baseline") if competitor_stage1 == "own" else None
    log = []
    run_benchmark(tmp_path, gen, "sim", _fake_tools(log), [], types=("m1", "m3"), competitor_stage1=own)
    ran = {Path(c.value("-o")).name: Path(c.value("-y")).stem.rsplit("_m1_m3", 1)[0]
           for c in log if c.program == "gencomm-onboard"}
    plan = job_plan(profile, True, robustness=False)
    benchmark_onboardings = plan.onboardings[plan.main_rows - len(BASELINES):]
    assert [m for m, _ in benchmark_onboardings] == [m for folder, m in ran.items() if folder != MAIN_ONBOARDING]
    assert MAIN_ONBOARDING in ran
