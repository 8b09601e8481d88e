"""REPORT.md from a results.json: every row, the paired 'collaborators off' column, the plot."""
import pytest

from experiments.evaluation import Evaluation
from experiments.report import write_report
from experiments.results import ResultRow, Results, ResultsError


def _eval(ap5, nbytes):
    aps = {"0.3": ap5 + 0.1, "0.5": ap5, "0.7": ap5 / 2}
    return {"ap": {"global": aps, "per_frame": aps}, "bytes_per_message": nbytes}


def test_report_lists_rows_and_ego_only_column(tmp_path):
    run = tmp_path / "runs" / "onboard_gencomm_m3"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("model: {fusion: intermediate, fusion_op: max}\ntrain: {epochs: 4}\n")
    rows = [
        {"method": "No fusion", "eval": _eval(0.5, 0), "ego_only": _eval(0.5, 0),
         "train_wall_s": 10, "trainable_params": 100, "note": "n"},
        {"method": "GenComm (m3 onboarded)", "eval": dict(_eval(0.6, 141004), recall_by_visibility={
            "ego": {"gt": 10, "recall": 0.8}, "collaborators_only": {"gt": 4, "recall": 0.25},
            "nobody": {"gt": 0, "recall": None}}, localisation={
            "all": {"gt": 14, "found": 9, "mean_iou": 0.65, "share_iou_0.7": 0.333, "median_centre_m": 0.31,
                    "median_length_m": 0.2, "median_width_m": 0.1, "median_yaw_deg": 9.25},
            "collaborators_only": {"gt": 4, "found": 1, "mean_iou": 0.75, "share_iou_0.7": 1.0}}),
         "ego_only": _eval(0.4, 0),
         "train_wall_s": 5, "trainable_params": 103156, "note": "stage 2 only", "run": str(run)},
        {"method_id": "old_run", "method": "Old run without the paired column", "eval": _eval(0.55, 10),
         "train_wall_s": 5, "trainable_params": 1, "note": ""},
    ]
    results = {"profile": "default", "seed": 0, "data": "data/sim", "rows": rows, "total_wall_s": 120,
               "onboarding": {"trainable_params_per_new_type": {"m3": 103156}, "frozen_params": 5,
                              "frozen_batchnorm_layers": 2, "onboarding_wall_time_s": 5},
               "stage1_wall_s": {"m1": 50, "m3": 60}}
    report = write_report(Results.from_dict(results), tmp_path).read_text()
    lines = [ln for ln in report.splitlines() if ln.startswith("| GenComm")]
    assert len(lines) == 3  # the comparison table, the visibility table, the box-precision table
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cells[1:4] == ["0.700", "0.600", "0.300"]
    assert cells[5] == "0.500 / 0.400 / 0.200"          # same weights, collaborators off
    assert cells[6].startswith("141,004 (2^17.1)")
    assert cells[9] == "stage 2 only; 4 epochs, max fusion"  # the budget, read from the run's config.yaml
    assert "| Old run without the paired column |" in report and "| - |" in report
    assert "onboarding 5 s vs stage 1 m1 50 s, m3 60 s" in report
    assert "training itself took 2 min" in report  # 10 + 5 + 50 + 60 + 5 s; GenComm's row is onboarding
    assert "| method | ego | collaborators only | nobody |" in report
    assert "| GenComm (m3 onboarded) | 0.800 of 10 | 0.250 of 4 | - |" in report
    assert "| GenComm (m3 onboarded) | 9 of 14 | 0.650 | 0.33 | 0.31 m | 9.2 deg | 1.00 of 1 |" in report
    assert (tmp_path / "ap_vs_bytes.png").stat().st_size > 1000
    assert "AP on the dataset's test split." in report  # results.json without test_data: an older run
    results["test_data"] = "data/sim_test"
    report = write_report(Results.from_dict(results), tmp_path).read_text()
    assert "AP on the separate test set `data/sim_test`" in report


def _hetero_row(name, ap5, params, nbytes):
    dyn = [{"types": ["m1", "m2", "m3", "m4"][:k + 1], **_eval(ap5 + 0.01 * k, nbytes),
            "onboard_params": None if k == 0 else params // 3, "onboard_gflops": None if k == 0 else 1.5}
           for k in range(4)]
    return {"method": f"{name} (m2, m3, m4 onboarded)", "table": "heterogeneous", "eval": _eval(ap5 + 0.03, nbytes),
            "dynamic": dyn, "trainable_params": params, "train_wall_s": 42.0, "note": ""}


def test_report_heterogeneous_section_seed_spread_and_step_times(tmp_path):
    from test_seeds import HITS, _rows
    from experiments.archives import archive_seed
    main = {"method": "No fusion", "table": "main", "eval": _eval(0.5, 0), "train_wall_s": 1, "trainable_params": 1,
            "note": ""}
    hetero = [_hetero_row("GenComm", 0.6, 309468, 25804), _hetero_row("STAMP", 0.55, 756096, 3277004)]
    archives = [str(archive_seed(_rows(tmp_path, s, HITS[s]), s, tmp_path / "seeds",
                                 {"profile": "default", "data_seed": 0})) for s in (0, 1)]
    results = {"profile": "default", "seed": 0, "data": "d", "rows": [main, *hetero], "total_wall_s": 600,
               "onboarding": {"trainable_params_per_new_type": {"m3": 1}, "frozen_params": 1,
                              "frozen_batchnorm_layers": 0, "onboarding_wall_time_s": 1},
               "stage1_wall_s": {"m1": 1}, "seed_archives": archives,
               "steps": [{"step": "simulate", "seconds": 60}, {"step": "train m1_none", "seconds": 540}]}
    report = write_report(Results.from_dict(results), tmp_path).read_text()
    main_table = report.split("## Heterogeneous")[0]
    assert "STAMP" not in main_table  # the main table holds the main rows only
    assert "| method | {m1} | +m2 | +m3 | +m4 |" in report
    assert "| GenComm (m2, m3, m4 onboarded) | 0.600 / 0.300 | 0.610 / 0.305 | 0.620 / 0.310 | 0.630 / 0.315 |" in report
    assert "| 756,096 | m2 252,032, m3 252,032, m4 252,032 | m2 1.50, m3 1.50, m4 1.50 | 42 s |" in report
    assert "## Run-to-run spread over training seeds" in report  # experiments.seeds' section (tests/experiments/test_seeds.py)
    assert "| No fusion | 0.450 ± 0.071 | 0.450 ± 0.071 | 0.450 ± 0.071 | 0.500, 0.400 |" in report
    assert "| train m1_none | 9.0 |" in report and "| **total** | **10.0** |" in report
    assert "From scratch" not in report  # older results do not say whether they were
    assert (tmp_path / "hetero_costs.png").stat().st_size > 1000


def test_from_scratch_is_what_an_invocation_found(tmp_path):
    """results.json's from_scratch: nothing to reuse (dataset, separate test set, run folders) at the start;
    the steps section says which, so a total with skipped steps is never read as the whole cost."""
    from experiments.pipeline import found_finished
    from experiments.report import steps_section
    out, data = tmp_path / "results", tmp_path / "data" / "sim"
    assert found_finished(out, data) == []
    (out / "runs").mkdir(parents=True)  # an empty folder holds nothing to reuse
    assert found_finished(out, data) == []
    (tmp_path / "data" / "sim_test").mkdir(parents=True)
    (tmp_path / "data" / "sim_test" / "test").mkdir()
    (out / "runs" / "m1_none").mkdir()
    assert found_finished(out, data) == [str(tmp_path / "data" / "sim_test"), str(out / "runs")]
    base = {"steps": [{"step": "simulate", "seconds": 60}], "total_wall_s": 60, "profile": "quick", "seed": 0,
            "data": "d", "rows": [], "onboarding": {}, "stage1_wall_s": {}}
    assert "From scratch: nothing existed" in "\n".join(steps_section(Results.from_dict(
        {**base, "from_scratch": True, "found_finished": []})))
    text = "\n".join(steps_section(Results.from_dict({**base, "from_scratch": False,
                                                      "found_finished": [str(out / "runs")]})))
    assert f"Not from scratch: this invocation found `{out / 'runs'}`" in text


def test_cost_table_groups_every_step_by_kind():
    """The steps section sums the steps of each kind (simulation, training, onboarding, evaluation,
    robustness) with its share of the total, then lists every step; it names the feature cache."""
    from experiments.pipeline import step_name
    from experiments.report import steps_section
    from experiments.steps import Command
    assert step_name(Command("gencomm-onboard", ["-y", "c.yaml", "-o", "/r/onboard_stamp_m2"])) == \
        "onboard onboard_stamp_m2"
    assert step_name(Command("gencomm-infer", ["--late_of", "m1=/a", "-o", "/r/late_of_stage1", "--dynamic",
                                               "m1,m3"])) == "evaluate late_of_stage1 (m1,m3)"
    steps = [("simulate", 60), ("simulate the test set", 60), ("train gencomm_stage1_m1", 600),
             ("onboard onboard_stamp_m2", 240), ("evaluate m1_none", 120), ("evaluate late_of_stage1 (m1,m3)", 120),
             ("robustness sweep", 300)]
    doc = {"steps": [{"step": n, "seconds": s} for n, s in steps], "total_wall_s": 1500.0, "profile": "quick",
           "seed": 0, "data": "d", "rows": [], "onboarding": {}, "stage1_wall_s": {},
           "feature_cache": "/out/cache/features"}
    text = "\n".join(steps_section(Results.from_dict(doc)))
    for row in ("| training (stage 1, baselines) | 1 | 10.0 | 40% |", "| robustness sweep | 1 | 5.0 | 20% |",
                "| onboarding | 1 | 4.0 | 16% |", "| evaluation | 2 | 4.0 | 16% |", "| simulation | 2 | 2.0 | 8% |",
                "| **total** | 7 | **25.0** | |", "| evaluate late_of_stage1 (m1,m3) | 2.0 |"):
        assert row in text, row
    assert "`/out/cache/features`" in text
    assert "No feature cache" in "\n".join(steps_section(Results.from_dict({**doc, "feature_cache": None})))
    chosen = {"choice": "float32", "reason": "this CPU has no bf16 instructions", "cpu_bf16": False}
    text = "\n".join(steps_section(Results.from_dict({**doc, "precision": chosen})))
    assert "Precision: float32 (this CPU has no bf16 instructions)." in text
    with pytest.raises(ResultsError, match="key 'precision': expected a mapping"):
        Results.from_dict({**doc, "precision": "bf16"})


def test_report_says_what_each_new_type_adds_paired_on_the_same_run(tmp_path):
    """The increment of +m2 is the same run's {m1, m2} evaluation minus its {m1} one on the same frames:
    a closed form (every scene hit vs none: +1, interval [+1, +1], significant; equal records: 0, not)."""
    from test_seeds import SCENES, _records
    from experiments.report_hetero import increments_section
    helps, idle, alone = (tmp_path / name for name in ("helps", "idle", "alone"))
    for run, before, after in ((helps, set(), set(range(SCENES))), (idle, {1, 2}, {1, 2})):
        run.mkdir()
        _records(before).save(run / "eval_dyn_m1_frames.npz")
        _records(after).save(run / "eval_dyn_m1+m2_frames.npz")
    alone.mkdir()
    _records({1}).save(alone / "eval_dyn_m1_frames.npz")  # no fusion: one evaluation for every alliance
    boot = Evaluation({}, details={"bootstrap": {"resamples": 200, "seed": 1}})
    rows = [ResultRow(name.lower(), name, boot, run=str(run), train_wall_s=0, trainable_params=0)
            for name, run in (("GenComm", helps), ("STAMP", idle), ("No fusion", alone))]
    text = "\n".join(increments_section(rows, ["m1", "m2"]))
    assert "| method | +m2 |" in text
    assert "| GenComm | **+1.000 [+1.00, +1.00]** / **+1.000 [+1.00, +1.00]** |" in text
    assert "| STAMP | +0.000 [+0.00, +0.00] / +0.000 [+0.00, +0.00] |" in text
    assert "| No fusion | - |" in text


def test_increment_of_alliances_on_different_frames_says_so(tmp_path):
    from test_seeds import _records
    from experiments.report_hetero import increments_section
    from opencood_ext.eval.records import FrameRecords
    run = tmp_path / "run"
    run.mkdir()
    _records({1}).save(run / "eval_dyn_m1_frames.npz")
    full = _records({1})
    keep = full.offsets[:3]  # the first two frames only
    FrameRecords(full.thresholds, full.scores[:keep[-1]], full.tp[:, :keep[-1]], keep, full.num_gt[:2],
                 full.scenes[:2], full.frames[:2]).save(run / "eval_dyn_m1+m2_frames.npz")
    row = ResultRow("gencomm", "GenComm", Evaluation({}), run=str(run), train_wall_s=0, trainable_params=0)
    text = "\n".join(increments_section([row], ["m1", "m2"]))
    assert "| GenComm | not paired: " in text


def test_the_robustness_section_says_latency_was_not_swept_on_one_frame_scenes(tmp_path):
    import json as _json
    from experiments.report import robustness_section
    point = {"ap": {"0.3": 0.8, "0.5": 0.7, "0.7": 0.3}}
    effects = {"latency": {"title": "Latency", "axis": "frames", "levels": [0], "results": {"No fusion": [point]}},
               "noise": {"title": "Pose noise", "axis": "m", "levels": [0.0, 0.2],
                         "results": {"No fusion": [point, point]}}}
    (tmp_path / "robustness").mkdir()
    (tmp_path / "robustness" / "robustness.json").write_text(_json.dumps(
        {"settings": {"channel_seed": 0}, "runs": [{"label": "No fusion", "run_dir": "/r/m1_none"}], "effects": effects}))
    text = "\n".join(robustness_section(tmp_path))
    assert "Latency is not swept here" in text
    effects["latency"]["levels"] = [0, 1]
    effects["latency"]["results"]["No fusion"] = [point, point]
    (tmp_path / "robustness" / "robustness.json").write_text(_json.dumps(
        {"settings": {"channel_seed": 0}, "runs": [{"label": "No fusion", "run_dir": "/r/m1_none"}], "effects": effects}))
    assert "Latency is not swept" not in "\n".join(robustness_section(tmp_path))
