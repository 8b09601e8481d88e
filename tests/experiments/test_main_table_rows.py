"""The main job's rows for one training seed (:func:`experiments.pipeline.one_seed`) with fake steps:
GenComm's faithful onboarding row, then right after it the ego-encoder-target variant (beyond the
paper, issue 49 item 5), onboarded from the same stage-1 runs into its own folder by its own config,
each row carrying its method id."""
import dataclasses
import json
from pathlib import Path

from experiments import pipeline
from experiments.method_ids import GENCOMM, GENCOMM_EGOTARGET, INTERMEDIATE
from experiments.profiles import PROFILES, STAGE1, STAGE2, STAGE2_EGOTARGET
from experiments.results import ResultRow
from opencood_ext.config_files import configs_root
from opencood_ext.run_folder import RunFolder


def test_the_main_table_has_the_ego_encoder_target_row_right_after_gencomms(tmp_path, monkeypatch):
    calls = []

    def fake_call(cmd):
        calls.append(cmd)
        if cmd.program == "gencomm-onboard":  # what a finished onboarding leaves: its onboarding.json
            report = RunFolder(Path(cmd.value("-o"))).onboarding_report
            report.parent.mkdir(parents=True, exist_ok=True)
            report.write_text(json.dumps({"onboarding_wall_time_s": 3.0, "trainable_params_total": 7}))
    evaluated = []

    def fake_evaluate(run, fusion, profile):
        evaluated.append((Path(run).name, fusion))
        return {"ap": {"0.5": 0.5}, "fusion": fusion}
    monkeypatch.setattr(pipeline, "call", fake_call)
    monkeypatch.setattr(pipeline, "train", lambda config, run, data, profile: 1.0)
    monkeypatch.setattr(pipeline, "evaluate_run", fake_evaluate)
    monkeypatch.setattr(pipeline, "count_trainable", lambda run: 1)
    monkeypatch.setattr(pipeline, "run_facts", lambda run, trained=True: {"protocol": "equalized"})
    profile = dataclasses.replace(PROFILES["quick"], benchmark=False)
    runs, configs = tmp_path / "runs", configs_root()
    result = pipeline.one_seed(tmp_path, runs, tmp_path / "data", profile, 0, pipeline.Steps(), configs,
                               robustness=False)
    ids = [r.method_id for r in result.rows]
    assert ids[ids.index(INTERMEDIATE) + 1:] == [GENCOMM, GENCOMM_EGOTARGET]
    faithful, variant = result.rows[-2:]
    assert isinstance(variant, ResultRow) and variant.table == "main"
    assert variant.method == "GenComm, ego-encoder target (beyond the paper)"
    assert variant.run == str(runs / "onboard_gencomm_egotarget_m3") and faithful.run == str(runs / "onboard_gencomm_m3")
    onboards = [c for c in calls if c.program == "gencomm-onboard"]
    assert [c.value("-y") for c in onboards] == [str(configs / STAGE2), str(configs / STAGE2_EGOTARGET)]
    for c in onboards:  # the same stage-1 runs for both
        assert c.value("--ego") == str(runs / Path(STAGE1["m1"]).stem)
        assert c.value("--new") == str(runs / Path(STAGE1["m3"]).stem)
    assert ("onboard_gencomm_egotarget_m3", "intermediate") in evaluated
    # the main table's onboarding record stays the faithful GenComm's
    assert result.onboarding == {"onboarding_wall_time_s": 3.0, "trainable_params_total": 7}


def test_a_profile_without_variant_rows_ends_the_main_table_at_gencomm(tmp_path, monkeypatch):
    """The default main job leaves the row beyond the paper out (its 90-minute budget); ``full`` keeps it."""
    onboarded = []
    monkeypatch.setattr(pipeline, "onboard_m3_row", lambda method_id, *a, **k: (
        onboarded.append(method_id) or ResultRow(method_id, method_id, None, run="r"), {}))
    monkeypatch.setattr(pipeline, "train", lambda config, run, data, profile: 1.0)
    monkeypatch.setattr(pipeline, "evaluate_run", lambda run, fusion, profile: {"ap": {"0.5": 0.5}, "fusion": fusion})
    monkeypatch.setattr(pipeline, "count_trainable", lambda run: 1)
    monkeypatch.setattr(pipeline, "run_facts", lambda run, trained=True: {"protocol": "equalized"})
    assert PROFILES["default"].variant_rows is False and PROFILES["full"].variant_rows is True
    profile = dataclasses.replace(PROFILES["quick"], benchmark=False, variant_rows=False)
    result = pipeline.one_seed(tmp_path, tmp_path / "runs", tmp_path / "data", profile, 0, pipeline.Steps(),
                               configs_root(), robustness=False)
    assert onboarded == [GENCOMM] and result.rows[-1].method_id == GENCOMM
