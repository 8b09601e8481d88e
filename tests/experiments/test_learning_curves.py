"""The learning curves' tooling (experiments.curves): points read from each budget's results.json and
run folders, the 2 % convergence rule, the ranking's settling budget, the report files and the CLI's
errors. The budget folders are written here with made-up figures; nothing is trained."""
import dataclasses
import json
from pathlib import Path

import pytest

from experiments.curves import CONVERGED_GAIN, best_val_loss, collect, converged_budget, settled_budget
from experiments.curves_report import line_styles, write_report
from experiments.curves_run import budgets_upto, main
from experiments.evaluation import Alliance, Evaluation
from experiments.results import ResultRow, Results
from scene_records import hit_records


def _eval(ap5, ap7, collab=None):
    ap = {"global": {"0.3": ap5 + 0.05, "0.5": ap5, "0.7": ap7}}
    ci = {"global": {t: [v - 0.02, v + 0.02] for t, v in ap["global"].items()}}
    recall = None if collab is None else {"collaborators_only": {"gt": collab[1], "recall": collab[0] / collab[1]},
                                          "ego": {"gt": 100, "recall": 0.8}}
    return Evaluation(ap=ap, ap_ci=ci, recall_by_visibility=recall)


def _run(folder: Path, losses, steps=72):
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"kind": "step", "epoch": 1, "step": 10, "loss": 9.0})]
    lines += [json.dumps({"kind": "epoch", "epoch": k + 1, "steps": steps, "time_s": 360.0, "threads": 2,
                          "val_detection_loss": v})
              for k, v in enumerate(losses)]
    (folder / "train_log.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder)


def _budget(out: Path, budget: int, figures: dict, stage1_collab=None, hits=None):
    """One budget's job folder: main rows {method_id: (ap5, ap7, collab, losses)} and a GenComm onboarding
    row in the benchmark table, each with a run folder holding its train log; hits: {method_id: the scenes
    its per-frame records detect} for the rows that keep records."""
    folder = out / f"budget{budget}"
    rows = []
    for mid, (ap5, ap7, collab, losses) in figures.items():
        run = _run(folder / "runs" / mid, losses)
        rows.append(ResultRow(mid, mid.replace("_", " "), _eval(ap5, ap7, collab), run=run, optimizer_steps=576 * budget,
                              train_wall_s=100.0 * budget, ego_only=_eval(ap5 - 0.1, ap7)))
    onboard = _run(folder / "runs" / "onboard_gencomm_m3", [1.0 / budget])
    # as the benchmark writes a row: eval is the whole alliance's evaluation file (with the recall); its
    # alliances keep AP, intervals and bytes only
    whole = _eval(0.55, 0.25, (3, 10))
    rows.append(ResultRow("gencomm", "GenComm (m3)", whole, table="heterogeneous", run=onboard,
                          optimizer_steps=576 * budget,
                          alliances=[Alliance(["m1"], _eval(0.4, 0.1)), Alliance(["m1", "m3"], _eval(0.55, 0.25))]))
    rows.append(ResultRow("late_of_stage1", "Late fusion (stage-1 models)", _eval(0.5, 0.2, (4, 10)),
                          table="heterogeneous", run=_run(folder / "runs" / "late_of_stage1_m1m3", []),
                          optimizer_steps=0))
    if "gencomm" in figures:  # the main table's GenComm row is the benchmark's GenComm onboarding
        rows[list(figures).index("gencomm")].run = onboard
    for row in rows:
        if row.method_id in (hits or {}):
            row.eval.records = f"eval_{row.table}_{row.method_id}_frames.npz"
            hit_records(hits[row.method_id]).save(Path(row.run) / row.eval.records)
    if stage1_collab is not None:  # the stage-1 run scored among its own type, as gencomm-infer writes it
        run = folder / "runs" / "gencomm_stage1_m1"
        _run(run, [0.9, 0.8])
        (run / "checkpoints").mkdir()
        doc = _eval(0.6, 0.3, stage1_collab).to_run_json(str(run))
        (run / "eval_intermediate.json").write_text(json.dumps(doc))
    Results(profile="default", seed=0, data="d", rows=rows, onboarding={}, stage1_wall_s={}, total_wall_s=1.0,
            command=f"gencomm-reproduce --budget {budget}", commit="abc1234").write(folder / "results.json")


def test_convergence_rule_and_ranking_settling():
    # 1.0 -> 0.9 gains 10 %, 0.9 -> 0.885 gains 1.7 % (< 2 %): converged at 4x
    assert converged_budget([(4, 0.885), (1, 1.0), (2, 0.9)]) == 4
    assert converged_budget([(1, 1.0), (2, 0.9), (4, 0.8)]) is None
    edge = 0.9 * (1.0 - CONVERGED_GAIN)
    assert converged_budget([(1, 0.9), (2, edge - 1e-9)]) is None and converged_budget([(1, 0.9), (2, edge + 1e-9)]) == 2
    assert converged_budget([(1, 1.0)]) is None
    assert settled_budget({1: ["a", "b"], 2: ["b", "a"], 4: ["b", "a"], 8: ["b", "a"]}) == 2
    assert settled_budget({1: ["a", "b"], 2: ["a", "b"], 4: ["b", "a"]}) == 4
    assert settled_budget({1: ["a"]}) is None
    assert budgets_upto(20) == [1, 2, 4, 8, 16] and budgets_upto(1) == [1]
    with pytest.raises(ValueError, match="max_budget"):
        budgets_upto(0)


def test_points_from_budget_folders_and_the_report(tmp_path):
    # late fusion leads at 1x, intermediate fusion from 2x on; GenComm's loss keeps falling
    _budget(tmp_path, 1, {"late": (0.80, 0.40, (10, 100), [1.2, 1.0]), "intermediate": (0.78, 0.40, (5, 100), [1.3, 1.1]),
                          "gencomm": (0.70, 0.30, (0, 100), [1.5, 1.4])}, stage1_collab=(0, 119),
            hits={"gencomm": range(6), "intermediate": range(10), "late": range(6)})
    _budget(tmp_path, 2, {"late": (0.81, 0.41, (11, 100), [0.99]), "intermediate": (0.83, 0.45, (20, 100), [0.9]),
                          "gencomm": (0.75, 0.35, (8, 100), [1.2])}, stage1_collab=(30, 119))
    _budget(tmp_path, 4, {"late": (0.81, 0.41, (11, 100), [0.985]), "intermediate": (0.84, 0.46, (21, 100), [0.89]),
                          "gencomm": (0.78, 0.38, (12, 100), [1.0])})
    curves = collect(tmp_path)
    series = curves.series()
    assert [p.budget for p in series["main/late"]] == [1, 2, 4]
    late1 = series["main/late"][0]
    assert late1.val_detection_loss == 1.0 and late1.optimizer_steps == 576 and late1.collaborator_only == [10, 100]
    assert late1.ap["0.5"] == 0.80 and late1.ap_ci["0.7"] == pytest.approx([0.38, 0.42])
    onboard = series["heterogeneous/gencomm"]
    assert onboard[0].ap["0.5"] == 0.55 and onboard[0].collaborator_only == [3, 10]  # the whole alliance's
    assert series["heterogeneous/late_of_stage1"][0].collaborator_only == [4, 10]
    stage1 = series["gencomm_stage1_m1"]
    assert [p.collaborator_only for p in stage1] == [[0, 119], [30, 119]] and stage1[0].val_detection_loss == 0.8
    assert stage1[0].optimizer_steps == 144
    assert curves.converged_at["main/late"] == 2          # 1.0 -> 0.99: 1 %
    assert curves.converged_at["main/intermediate"] == 4  # 1.1 -> 0.9 -> 0.89
    assert curves.converged_at["main/gencomm"] is None    # its onboarding run's: 1.0 -> 0.5 -> 0.25
    assert curves.rankings[1] == ["late", "intermediate", "gencomm"]
    assert curves.rankings[2] == curves.rankings[4] == ["intermediate", "late", "gencomm"]
    assert curves.ranking_settled_at == 2
    files = write_report(curves, tmp_path / "report")
    assert [f.name for f in files] == ["curves.json", "CURVES.md", "curves.png"]
    doc = json.loads(files[0].read_text())
    # budget 1's runs: 3 main rows of 2 epochs, the onboarding's 1 and the stage-1 run's 2: 9 epochs x 360 s x 2 threads
    assert doc["ranking_settled_at"] == 2 and doc["budgets"][0] == {"budget": 1, "command": "gencomm-reproduce --budget 1",
                                                                   "commit": "abc1234", "total_wall_s": 1.0,
                                                                   "train_core_hours": 1.8}
    assert [b["train_core_hours"] for b in doc["budgets"]] == [1.8, 1.2, 0.8]
    assert len(doc["points"]) == 3 * 3 + 3 * 2 + 2  # main rows, benchmark rows, stage-1 scorings
    md = files[1].read_text()
    assert "| late | 0.800 / 0.400 / 10/100 / 1.000 |" in md and "| 2x |" in md
    assert "no longer changes from 2x on" in md and "not yet |" in md
    assert "| 1x | abc1234 | 0.00 | 1.80 |" in md and "| all |  |  | 3.80 |" in md
    assert files[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # three sections; the benchmark's GenComm row is named as the main table's run, once per section
    sections = md.split("\n## ")
    assert [t.split()[0] for t in sections[1:7]] == ["Main", "Onboarding", "Stage-1", "Differences", "Ranking", "Cost"]
    assert "| GenComm (m3) (the main table's run) | 0.550 / 0.250 / 3/10 / 1.000 |" in sections[2]
    assert "| gencomm | 0.700 / 0.300 / 0/100 / 1.000 |" in sections[1]
    assert "| Late fusion (stage-1 models) | " + "0.500 / 0.200 / 4/10 / - | " * 3 + "- (trains nothing) |" in sections[2]
    # paired differences from GenComm, budget 1 only (the other budgets keep no records): intermediate fusion
    # detects 4 more scenes of 10 (+0.4; a draw of 10 scenes misses all 4 with probability 0.6^10 < 2.5 %),
    # late fusion the same ones (0 in every draw: not told apart)
    assert series["main/intermediate"][0].minus_gencomm["0.5"][0] == pytest.approx(0.4)
    assert series["main/intermediate"][0].minus_gencomm["0.7"][1] > 0
    assert series["main/late"][0].minus_gencomm["0.5"] == [0.0, 0.0, 0.0]
    assert series["main/gencomm"][0].minus_gencomm is None and series["main/late"][1].minus_gencomm is None
    differences = md.split("## Differences from GenComm")[1].split("## ")[0]
    assert "| intermediate | +0.400 [+0.100, +0.700]* / +0.400 [+0.100, +0.700]* | - | - |" in differences
    assert "| late | +0.000 [+0.000, +0.000] / +0.000 [+0.000, +0.000] | - | - |" in differences
    assert "GenComm (m3)" not in differences  # the twin of GenComm's own run
    # one line per run folder: no twin, nothing without steps, a colour each, GenComm's black
    styles = line_styles(curves)
    assert set(styles) == {"main/late", "main/intermediate", "main/gencomm", "gencomm_stage1_m1"}
    assert len({tuple(st["color"]) if not isinstance(st["color"], str) else st["color"] for st in styles.values()}) == 4
    assert styles["main/gencomm"]["color"] == "black" and styles["gencomm_stage1_m1"]["marker"] == "^"


def test_cli_report_and_its_errors(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no budget<K>/results.json" in capsys.readouterr().err
    _budget(tmp_path, 1, {"late": (0.8, 0.4, None, [1.0])})
    (tmp_path / "budgetX").mkdir()
    (tmp_path / "budgetX" / "results.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    assert "budgetX: a budget folder is named budget<K>" in capsys.readouterr().err
    (tmp_path / "budgetX" / "results.json").unlink()
    bad = tmp_path / "budget1" / "runs" / "late" / "train_log.jsonl"
    bad.write_text(bad.read_text() + "{torn\n")
    assert main(["report", str(tmp_path)]) == 2
    assert "train_log.jsonl: line 3 is not JSON" in capsys.readouterr().err
    bad.write_text("")
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "curves.png").is_file()
    assert best_val_loss(tmp_path / "nowhere") is None
    with pytest.raises(SystemExit):
        main(["run", "--out", str(tmp_path), "--budgets", "1,0"])
    assert "--budgets must be positive whole numbers" in capsys.readouterr().err


def test_budget_scales_every_training_and_onboarding(tmp_path):
    from opencood_ext.config_files import configs_root
    from experiments.profiles import PROFILES
    from experiments.reproduce import scale_budget
    default, quick = PROFILES["default"], PROFILES["quick"]
    assert scale_budget(default, 1, configs_root()) is default   # the same commands: earlier runs are reused
    doubled = scale_budget(default, 2, configs_root())
    assert doubled.overrides[-1] == "train.epochs=6" and doubled.onboard_epochs is None  # the profile's 3 epochs
    full = scale_budget(PROFILES["full"], 2, configs_root())  # the configs' own: 8 epochs, 4 per onboarding
    assert full.overrides[-1] == "train.epochs=16" and full.onboard_epochs == 8
    q = scale_budget(quick, 4, configs_root())
    assert q.overrides[-1] == "train.epochs=4" and q.onboard_epochs == 4  # the profile's own epochs win
    with pytest.raises(ValueError, match="positive whole number"):
        scale_budget(default, 0, configs_root())
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "base.yaml").write_text("train: {lr: 0.1}\n")
    with pytest.raises(ValueError, match=r"base.yaml: field 'train.epochs'"):
        scale_budget(dataclasses.replace(default, overrides=[]), 2, tmp_path)  # epochs from base.yaml


def test_seeds_at_one_budget_reuse_the_curves_seed_and_feed_the_fair_benchmark(tmp_path, monkeypatch, capsys):
    import experiments.fair
    import experiments.reproduce
    calls = []

    def fake_reproduce(folder, data, profile_name, **kw):
        calls.append((folder, data, profile_name, kw))
        (folder / "cache" / "features" / "abc").mkdir(parents=True)  # what the seeds' onboardings kept
        return folder / "REPORT.md"

    def fake_fair(folders, dest):
        calls.append(("fair", list(folders), dest))
        return dest / "REPORT.md"

    monkeypatch.setattr(experiments.reproduce, "reproduce", fake_reproduce)
    monkeypatch.setattr(experiments.fair, "write_fair_benchmark", fake_fair)
    (tmp_path / "fair").mkdir()
    (tmp_path / "fair" / "REPORT.md").write_text("fair report\n")
    out = tmp_path / "curves"
    assert main(["seeds", "--out", str(out), "--budget", "2"]) == 2
    assert "budget2: no results.json; run the curves to budget 2 first" in capsys.readouterr().err
    _budget(out, 2, {"late": (0.8, 0.4, None, [1.0])})
    assert main(["seeds", "--out", str(out), "--budget", "2", "--seeds", "1,2"]) == 2
    assert "--seeds must begin with the curves' own training seed 0" in capsys.readouterr().err
    assert not calls
    with pytest.raises(SystemExit):
        main(["seeds", "--out", str(out), "--budget", "2", "--seeds", "0,-1"])
    assert "--seeds must be whole numbers >= 0" in capsys.readouterr().err
    assert main(["seeds", "--out", str(out), "--budget", "2", "--data", str(tmp_path / "d"), "--profile", "full",
                 "--fair", str(tmp_path / "fair"), "--jobs", "2"]) == 0
    (folder, data, profile, kw), fair = calls
    assert folder == (out / "budget2").resolve() and data == (tmp_path / "d").resolve() and profile == "full"
    assert kw["seeds"] == [0, 1, 2] and kw["budget"] == 2 and kw["robustness"] is False and kw["jobs"] == 2
    assert kw["benchmark_types"] == ["m1", "m3"] and kw["command"].startswith("gencomm-curves seeds --out")
    assert fair == ("fair", [folder / "seeds" / f"seed{s}" for s in (0, 1, 2)], tmp_path / "fair")
    assert not (folder / "cache" / "features").exists()
    assert "fair report" in capsys.readouterr().out
    # the other seeds' runs (runs/seed1/...) are not the curves' cost
    before = collect(out).budgets[0]["train_core_hours"]
    _run(out / "budget2" / "runs" / "seed1" / "late", [1.0, 0.9])
    assert collect(out).budgets[0]["train_core_hours"] == before > 0


def test_run_drops_each_finished_budgets_feature_cache(tmp_path, monkeypatch):
    import experiments.curves_run
    import experiments.reproduce
    out = tmp_path / "curves"

    jobs = []

    def fake_reproduce(folder, data, profile_name, budget, **kw):  # the job: its results and a filled cache
        jobs.append(kw["jobs"])
        _budget(out, budget, {"late": (0.8, 0.4, None, [1.0 / budget])})
        (folder / "cache" / "features" / "abc").mkdir(parents=True)
        (folder / "cache" / "features" / "abc" / "x.pt").write_bytes(b"0" * 1000)
        return folder / "REPORT.md"

    monkeypatch.setattr(experiments.reproduce, "reproduce", fake_reproduce)
    monkeypatch.setattr(experiments.curves_run, "score_stage1", lambda *a, **k: [])
    assert main(["run", "--out", str(out), "--budgets", "1", "--data", str(tmp_path / "d")]) == 0
    assert not (out / "budget1" / "cache" / "features").exists() and (out / "CURVES.md").is_file()
    assert main(["run", "--out", str(out), "--budgets", "2", "--data", str(tmp_path / "d"), "--keep_feature_cache",
                 "--jobs", "2"]) == 0
    assert jobs == [None, 2]  # --jobs reaches the job (None: lanes by the thread count)
    assert (out / "budget2" / "cache" / "features" / "abc" / "x.pt").is_file()
    assert experiments.curves_run.drop_feature_cache(out / "budget2") == 1000
    assert experiments.curves_run.drop_feature_cache(out / "budget2") == 0  # nothing left to remove
