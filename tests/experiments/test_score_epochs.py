"""Scoring every onboarding epoch on the test set (issue 31 item 3, ``gencomm-reproduce --score_epochs``):
onboardings keep every epoch's weights, the benchmark evaluates each kept epoch dynamically, and the
report shows AP per epoch and what the camera adds at each (closed-form records from test_seeds)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.benchmark import METHODS, run_benchmark, stage2_config
from experiments.report_epochs import camera_steps, epoch_sections, scored_runs_per_seed
from experiments.evaluation import Evaluation
from experiments.results import ResultRow
from opencood_ext.experiment import load_experiment
from opencood_ext.run_folder import RunFolder, dynamic_label, evaluation_label
from test_benchmark_alliance import ALLIANCES, _stage1_runs, _write_config
from test_seeds import SCENES, _records


@pytest.mark.parametrize("types", ALLIANCES)
def test_every_onboarding_config_keeps_every_epoch(types):
    for _, method in METHODS:
        cfg = load_experiment(stage2_config("sim", method, types))
        assert cfg.train.keep_epoch_checkpoints is None, (method, types)  # None: no epoch file is pruned


def _fake_tools(log, epochs=3):
    """gencomm-onboard writes epoch_1..epochs.pth; gencomm-infer --dynamic writes the table of the
    checkpoint it names (the labels of opencood_ext.run_folder)."""
    def run(cmd, **resume):
        log.append(cmd)
        if cmd.program == "gencomm-onboard":
            out = Path(cmd.value("-o"))
            _write_config(out, Path(cmd.value("-y")))
            paths = RunFolder(out).checkpoints
            paths.dir.mkdir(parents=True, exist_ok=True)
            for n in range(1, epochs + 1):
                paths.epoch(n).write_bytes(b"w")
            RunFolder(out).onboarding_report.write_text(json.dumps(
                {"trainable_params_total": 1, "trainable_params_per_new_type": {"m3": 1},
                 "onboarding_wall_time_s": 1.0, "best_epoch": 1}))
            return
        out = Path(cmd.value("--model_dir") if "--model_dir" in cmd else cmd.value("-o"))
        out.mkdir(parents=True, exist_ok=True)
        ckpt = cmd.value("--checkpoint") if "--checkpoint" in cmd else None
        types = cmd.value("--dynamic").split(",")
        ev = {"ap": {"global": {"0.5": 0.5}}, "ap_ci": {}, "bytes_per_message": 1.0}
        folder = RunFolder(out)
        folder.evaluation(dynamic_label(ckpt)).write_text(json.dumps(
            [dict(ev, types=types[:k + 1]) for k in range(len(types))]))
        folder.evaluation(evaluation_label(alliance=types, checkpoint=ckpt)).write_text(json.dumps(ev))
    return run


def test_benchmark_scores_every_kept_epoch_of_every_onboarding_only_when_asked(tmp_path):
    gen = _stage1_runs(tmp_path, "gencomm")
    for score in (False, True):
        log = []
        runs = tmp_path / f"score_{score}"
        rows = run_benchmark(runs, gen, "sim", _fake_tools(log), [], types=("m1", "m3"), score_epochs=score)
        epochs = [c for c in log if c.program == "gencomm-infer" and "--checkpoint" in c]
        if not score:
            assert epochs == []
            continue
        assert len(epochs) == 3 * len(METHODS)  # one dynamic evaluation per kept epoch per method
        by_run = {}
        for c in epochs:
            assert c.value("--dynamic") == "m1,m3" and "--reuse" in c
            by_run.setdefault(c.value("--model_dir"), []).append(c.value("--checkpoint"))
        onboarded = {r.run for r in rows if r.onboard_method}
        assert set(by_run) == onboarded and all(v == ["epoch_1", "epoch_2", "epoch_3"] for v in by_run.values())
        for run in onboarded:  # the selected weights' table is still the default one
            assert RunFolder(run).evaluation("dynamic").is_file()
            assert RunFolder(run).dynamic_checkpoints() == ["epoch_1", "epoch_2", "epoch_3"]


def test_camera_steps_follow_the_joining_order():
    assert [s[0] for s in camera_steps(["m1", "m3"])] == []
    assert camera_steps(["m1", "m2"]) == [("+m2", ["m1", "m2"], ["m1"])]
    assert [(n, b) for n, _, b in camera_steps(["m1", "m2", "m3", "m4"])] == \
        [("+m2", ["m1"]), ("+m4", ["m1", "m2", "m3"])]
    steps = camera_steps(["m1", "m3", "m2", "m4"])
    assert steps[-1] == ("all cameras (m2, m4)", ["m1", "m3", "m2", "m4"], ["m1", "m3"])


def _scored_run(run: Path, epochs: dict, selected, best_epoch):
    """A camera-pair onboarding run: {checkpoint or None: (hit scenes {m1}, hit scenes {m1, m2})}; the
    tables' AP@0.5 of each alliance is hits / SCENES (the records' closed form)."""
    folder = RunFolder(run)
    run.mkdir(parents=True)
    for ckpt, (before, after) in [*((f"epoch_{n}", v) for n, v in epochs.items()), (None, selected)]:
        table = []
        for types, hits in ((["m1"], before), (["m1", "m2"], after)):
            _records(hits).save(folder.frames(evaluation_label(alliance=types, checkpoint=ckpt)))
            ap = len(hits) / SCENES
            table.append({"types": types, "ap": {"global": {"0.5": ap}, "per_frame": {"0.5": ap}}})
        folder.evaluation(dynamic_label(ckpt)).write_text(json.dumps(table))
    folder.onboarding_report.write_text(json.dumps({"best_epoch": best_epoch}))


def test_report_shows_ap_per_epoch_and_what_the_camera_adds_per_seed(tmp_path):
    runs = tmp_path / "runs"
    boot = Evaluation({}, details={"bootstrap": {"resamples": 200, "seed": 1}})
    # seed 0: the camera adds nothing at epoch 1 (4 vs 4 scenes), everything at epoch 2 (0 vs 10), and nothing
    # at best.pth; seed 1 scored epoch 1 only; STAMP was never scored, late fusion is no onboarding
    _scored_run(runs / "onboard_gencomm_m2", {1: (set(range(4)), set(range(4))), 2: (set(), set(range(10)))},
                ({1, 2}, {1, 2}), best_epoch=1)
    _scored_run(runs / "seed1" / "onboard_gencomm_m2", {1: (set(), set(range(SCENES)))}, (set(), set()), 1)
    (runs / "onboard_stamp_m2").mkdir()
    rows = [ResultRow("gencomm", "GenComm (m2 onboarded)", boot, table="heterogeneous",
                      run=str(runs / "onboard_gencomm_m2"), train_wall_s=0, trainable_params=0,
                      onboard_method="gencomm"),
            ResultRow("stamp", "STAMP (m2 onboarded)", boot, table="heterogeneous", run=str(runs / "onboard_stamp_m2"),
                      train_wall_s=0, trainable_params=0, onboard_method="stamp"),
            ResultRow("late_of_stage1", "Late fusion", boot, table="heterogeneous", run=str(runs / "late"),
                      train_wall_s=0, trainable_params=0)]
    per_seed = scored_runs_per_seed(rows, runs, [0, 1])
    assert {s: [r.method for r in v] for s, v in per_seed.items()} == \
        {0: ["GenComm (m2 onboarded)"], 1: ["GenComm (m2 onboarded)"]}
    results = SimpleNamespace(hetero_rows=lambda: rows, training_seeds=[0, 1])
    text = "\n".join(epoch_sections(results, tmp_path))
    assert "## AP per onboarding epoch" in text and "full alliance {m1, m2}" in text
    assert "Training seed 0:" in text and "Training seed 1:" in text
    assert "| method | epoch 1 | epoch 2 | best.pth |" in text
    assert "| GenComm (m2 onboarded) | 0.400 * | 1.000 | 0.200 |" in text
    assert "- GenComm (m2 onboarded): highest at epoch 2 (1.000); best.pth holds epoch 1 (0.400, 0.600 lower)." in text
    assert "| GenComm (m2 onboarded) | 1.000 * | 0.000 |" in text  # seed 1: epoch 1 only
    assert "## What the camera adds" in text
    assert "| GenComm (m2 onboarded) | +m2 | +0.000 [+0.00, +0.00] | +0.000 [+0.00, +0.00] | " \
           "**+1.000 [+1.00, +1.00]** |" in text
    assert "- GenComm (m2 onboarded), +m2: +0.000 at best.pth (interval includes 0); over 2 scored epochs " \
           "+0.000 to +1.000, a significant gain at epoch 2." in text
    assert "| GenComm (m2 onboarded) | +m2 | +0.000 [+0.00, +0.00] | **+1.000 [+1.00, +1.00]** |" in text  # seed 1
    assert "STAMP" not in text and "Late fusion" not in text


def test_no_scored_epoch_no_section(tmp_path):
    row = ResultRow("gencomm", "GenComm", Evaluation({}), table="heterogeneous", run=str(tmp_path), train_wall_s=0,
                    trainable_params=0, onboard_method="gencomm")
    assert epoch_sections(SimpleNamespace(hetero_rows=lambda: [row], training_seeds=[0]), tmp_path) == []


def test_reproduce_flag_reaches_the_job(monkeypatch, tmp_path):
    from experiments import reproduce
    seen = {}
    report = tmp_path / "REPORT.md"
    report.write_text("report")

    def fake(*args, **kwargs):
        seen.update(kwargs)
        return report
    monkeypatch.setattr(reproduce, "reproduce", fake)
    assert reproduce.main(["--quick", "--out", str(tmp_path), "--score_epochs"]) == 0
    assert seen["score_epochs"] == ["all"]
    assert reproduce.main(["--quick", "--out", str(tmp_path), "--score_epochs", "gencomm,stamp"]) == 0
    assert seen["score_epochs"] == ["gencomm", "stamp"]
    assert reproduce.main(["--quick", "--out", str(tmp_path)]) == 0
    assert seen["score_epochs"] == []


def test_scoring_some_methods_only(tmp_path):
    """``--score_epochs gencomm``: GenComm's epochs only (the camera question at a sixth of the cost);
    an unknown key is refused naming it."""
    from experiments.benchmark import scored_methods
    assert scored_methods(True) == [m for _, m in METHODS] == scored_methods(["all"])
    assert scored_methods(False) == [] == scored_methods(())
    with pytest.raises(ValueError, match="--score_epochs: unknown method 'genkomm'"):
        scored_methods(["genkomm"])
    gen = _stage1_runs(tmp_path, "gencomm")
    log = []
    run_benchmark(tmp_path / "some", gen, "sim", _fake_tools(log), [], types=("m1", "m3"), score_epochs=["gencomm"])
    scored = {c.value("--model_dir") for c in log if c.program == "gencomm-infer" and "--checkpoint" in c}
    assert [Path(r).name for r in scored] == ["onboard_gencomm_m3"]


@pytest.mark.slow
def test_a_real_onboarding_keeps_its_epochs_and_each_is_scored(tmp_path):
    """End to end on tiny runs: gencomm-onboard for 2 epochs keeps epoch_1.pth and epoch_2.pth, gencomm-infer
    --dynamic --checkpoint scores each beside the default table, and the report reads them back."""
    from experiments.report_epochs import ap_per_epoch_lines, scored_run
    from opencood_ext.cli import inference, onboard
    from tiny_runs import gencomm_stage1_runs

    runs = gencomm_stage1_runs(tmp_path / "stage1")
    out = tmp_path / "onboard"
    assert onboard.main(["--ego", str(runs["m1"]), "--new", str(runs["m3"]), "-o", str(out), "--epochs", "2",
                         "--set", "train.max_steps_per_epoch=1", "--set", "train.num_workers=0",
                         "--set", "train.val_every=1"]) == 0  # the tiny stage-1 runs skip validation; this does not
    assert list(RunFolder(out).checkpoints.epoch_files()) == [1, 2]
    argv = ["--model_dir", str(out), "--dynamic", "m1,m3", "--max_frames", "2", "--reuse"]
    for extra in ([], ["--checkpoint", "epoch_1"], ["--checkpoint", "epoch_2"]):
        assert inference.main(argv + extra) == 0
    scored = scored_run("GenComm", out)
    assert sorted(scored.epochs) == [1, 2] and scored.selected is not None
    assert scored.best_epoch in (1, 2)  # onboarding.json says which epoch best.pth holds
    text = "\n".join(ap_per_epoch_lines({0: [scored]}))
    assert "| method | epoch 1 | epoch 2 | best.pth |" in text and "full alliance {m1, m3}" in text
