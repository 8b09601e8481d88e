"""REPORT.md's "AP per scene family" section (experiments.report_family) and results.json's scene_families
(experiments.family_figures):
fake per-frame records whose AP is known in closed form (a hit scene detects its one car exactly in every
frame, a miss scene detects nothing: AP = hit scenes / scenes at every IoU) on a tiny fake test root whose
data_protocol.yaml files name each scene's family."""
import json

import numpy as np
import pytest

from experiments.evaluation import Alliance, Evaluation
from experiments.family_figures import FAMILY_POOL, FamilyFigure, FamilyRow, compute_family_figures, family_figures
from experiments.method_ids import legacy_method_id
from experiments.report import write_report
from experiments.report_family import family_section
from experiments.results import ResultRow, Results, ResultsError
from opencood_ext.eval.bootstrap import bootstrap_ap
from opencood_ext.eval.records import FrameRecords

SCENES, FRAMES = 10, 2
JUNCTION, ROAD = range(0, 5), range(5, 10)   # scenes 0-4 junction, 5-9 road
BOOT = {"interval": "percentile bootstrap, 95%", "unit": "scene", "resamples": 200, "seed": 3}
# hit scenes per row: late fusion leads every feature-level row on junctions only
MAIN = {"No fusion": {0, 5}, "Late fusion": {0, 1, 2, 3, 4, 5}, "Intermediate (full feature)": {0, 1, 5, 6, 7, 8, 9},
        "GenComm (m3 onboarded)": {0, 1, 2, 5, 6, 7, 8}}
BENCH = {"GenComm (m2, m3, m4 onboarded)": {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, "Late fusion (stage-1 models)": {0, 1, 2, 3}}


def _scene(s):
    return f"2024_01_01_00_00_{s:02d}"


def _records(hits):
    out = []
    for s in range(SCENES):
        for f in range(FRAMES):
            gt = np.array([[5.0 * f, 3.0, 0.0, 4.0, 1.8, 1.5, 0.0]])
            pred, score = (gt, np.array([0.9])) if s in hits else (np.zeros((0, 7)), np.zeros(0))
            out.append((pred, score, gt, _scene(s), f"{_scene(s)}/{f:06d}"))
    return FrameRecords.from_detections(out)


def _test_root(tmp_path, road=ROAD):
    root = tmp_path / "sim_test"
    for s in range(SCENES):
        folder = root / "test" / _scene(s)
        folder.mkdir(parents=True)
        (folder / "data_protocol.yaml").write_text(f"scenario: {{layout: {'road' if s in road else 'junction'}}}\n")
    return root


def _row(tmp_path, k, method, hits, table):
    """A row as the main job records it: eval.ap / ap_ci from evaluate()'s bootstrap of its frames file."""
    rec = _records(hits)
    path = rec.save(tmp_path / f"row{k}_frames.npz")
    boot = bootstrap_ap(rec, BOOT["resamples"], BOOT["seed"])
    ap = {str(t): float(v) for t, v in zip(boot.thresholds, boot.ap["global"])}
    ev = {"ap": {"global": ap, "per_frame": ap}, "ap_ci": boot.ci_json(), "bootstrap": BOOT, "num_scenes": SCENES,
          "frames_file": str(path), "bytes_per_message": 0}
    dynamic = [Alliance.from_run_json({"types": ["m1", "m2", "m3", "m4"][:k], **ev}) for k in (1, 4)] \
        if table == "heterogeneous" else None
    return ResultRow(legacy_method_id(method, table), method, Evaluation.from_run_json(ev), train_wall_s=0.0,
                     trainable_params=0, table=table, alliances=dynamic)


def _rows(tmp_path):
    tables = [*((m, h, "main") for m, h in MAIN.items()), *((m, h, "heterogeneous") for m, h in BENCH.items())]
    return [_row(tmp_path, k, m, h, t) for k, (m, h, t) in enumerate(tables)]


def _results(tmp_path, rows, test_root, **extra):
    return Results(profile="default", seed=0, data=str(tmp_path / "sim"), rows=rows, onboarding={
        "trainable_params_per_new_type": {"m3": 1}, "frozen_params": 1, "frozen_batchnorm_layers": 0,
        "onboarding_wall_time_s": 1}, stage1_wall_s={"m1": 1.0}, total_wall_s=1.0, test_data=str(test_root), **extra)


def test_figures_per_family_pool_equals_the_rows_own_ap_and_pairing_per_family(tmp_path):
    rows, root = _rows(tmp_path), _test_root(tmp_path)
    fig = family_figures(rows, root)
    assert fig.families == {"junction": 5, "road": 5} and fig.test_data == str(root)
    by = {(e.table, e.method_id): e for e in fig.rows}
    assert [e.table for e in fig.rows] == ["main"] * 4 + ["heterogeneous"] * 2
    for e, r in zip(fig.rows, rows):
        hits = (MAIN | BENCH)[e.method]
        pool = e.families["pool"]
        assert pool.ap == r.eval.ap["global"] and pool.ap_ci == r.eval.ap_ci["global"]  # all frames
        assert pool.frames == SCENES * FRAMES and pool.scenes == SCENES
        for fam, scenes in (("junction", JUNCTION), ("road", ROAD)):
            part = e.families[fam]
            assert part.scenes == 5 and part.frames == 5 * FRAMES
            assert part.ap["0.5"] == pytest.approx(len(hits & set(scenes)) / 5)
            lo, hi = part.ap_ci["0.7"]
            assert lo <= part.ap["0.7"] <= hi
    # paired against its own table's GenComm row, per family: the difference is the hit-scene difference / 5
    inter = by["main", "intermediate"]
    assert inter.reference == "GenComm (m3 onboarded)" and by["main", "gencomm"].reference is None
    assert inter.families["junction"].vs_reference["0.5"].diff == pytest.approx(-0.2)
    assert inter.families["road"].vs_reference["0.5"].diff == pytest.approx(+0.2)
    assert inter.families["pool"].vs_reference["0.5"].diff == pytest.approx(0.0)
    late_b = by["heterogeneous", "late_of_stage1"]
    assert late_b.reference == "GenComm (m2, m3, m4 onboarded)"
    road = late_b.families["road"].vs_reference["0.5"]  # 0 of 5 vs 5 of 5 road scenes, whatever the draw
    assert road.diff == pytest.approx(-1.0) and road.ci == [-1.0, -1.0] and road.significant


def test_section_shows_both_families_and_what_late_fusion_leads(tmp_path):
    rows, root = _rows(tmp_path), _test_root(tmp_path)
    results = _results(tmp_path, rows, root, scene_families=family_figures(rows, root))
    report = write_report(results, tmp_path).read_text()
    section = report.split("## AP per scene family")[1].split("\n## ")[0]
    assert ("| method | junction AP@0.5 | junction AP@0.7 | road AP@0.5 | road AP@0.7 | pool AP@0.5 | pool AP@0.7 |"
            in section)
    assert "### Main table" in section and "### Benchmark, full alliance" in section
    assert "junction 5, road 5 scenes" in section
    late = next(ln for ln in section.splitlines() if ln.startswith("| Late fusion |"))
    cells = [c.strip() for c in late.strip("|").split("|")]
    assert cells[1] == "1.000 [1.00, 1.00]" and cells[3].startswith("0.200 [") and len(cells) == 7
    # the intro's sentence is generated from the figures: late fusion leads on junctions only
    main_line = next(ln for ln in section.splitlines() if ln.startswith("- Main table:"))
    assert "on junction scenes late fusion (1.000) is ahead of every feature-level row" in main_line
    assert "on road scenes Intermediate (full feature), GenComm (m3 onboarded) beat late fusion (0.200)" in main_line
    assert "AP@0.5: on junction" in main_line and "AP@0.7: on junction" in main_line  # both thresholds said
    assert main_line.endswith("late fusion's lead is confined to junction scenes.")
    bench_line = next(ln for ln in section.splitlines() if ln.startswith("- Benchmark, full alliance:"))
    assert "late fusion leads in no family" in bench_line
    assert "| Late fusion (stage-1 models) |" in section and "**-1.000 [-1.00, -1.00]**" in section
    # results.json keeps the figures; they read back equal
    back = Results.from_json(results.to_json(), "results.json")
    assert back.scene_families == results.scene_families
    assert [r.method_id for r in back.scene_families.rows] == ["no_fusion", "late", "intermediate", "gencomm",
                                                              "gencomm", "late_of_stage1"]
    assert json.loads(results.to_json())["scene_families"]["rows"][0]["method_id"] == "no_fusion"
    # an older results.json without them: the report computes them from the rows' records and test_data
    again = write_report(_results(tmp_path, rows, root), tmp_path).read_text()
    assert again.split("## AP per scene family")[1] == report.split("## AP per scene family")[1]


def test_one_family_test_set_is_one_line_and_missing_families_say_why(tmp_path):
    rows, root = _rows(tmp_path), _test_root(tmp_path, road=())
    fig = family_figures(rows, root)
    assert fig.families == {"junction": 10} and fig.rows == []
    lines = [ln for ln in family_section(fig) if ln]
    assert lines == ["## AP per scene family",
                     f"The test set `{root}` holds one scene family only: junction (10 scenes); no per-family split."]
    (root / "test" / _scene(3) / "data_protocol.yaml").write_text("world: {seed: 1}\n")
    fig, why = compute_family_figures(rows, root)
    assert fig is None and "data_protocol.yaml" in why and "scenario.layout" in why and "\n" not in why
    assert family_section(None, why)[2] == f"Not computed: {why}"
    assert family_figures([ResultRow("x", "x", Evaluation(ap={}), train_wall_s=0, trainable_params=0)], root) is None
    assert family_section(None) == []   # no row with per-frame records: no section


def test_malformed_scene_families_name_the_field(tmp_path):
    rows, root = _rows(tmp_path)[:2], _test_root(tmp_path)
    doc = _results(tmp_path, rows, root, scene_families=family_figures(rows, root)).to_dict()
    doc["scene_families"]["rows"][1]["families"]["road"]["scenes"] = "five"
    with pytest.raises(ResultsError, match=r"^r\.json: key 'scene_families\.rows\.1\.families\.road\.scenes': "
                                           r"expected an integer, got 'five'$"):
        Results.from_dict(doc, "r.json")
    doc["scene_families"]["rows"][1]["families"]["ring"] = {"scenes": 1, "frames": 1}
    del doc["scene_families"]["rows"][1]["families"]["road"]
    with pytest.raises(ResultsError, match=r"key 'scene_families\.rows\.1\.families\.ring': 'ring' is not a family"):
        Results.from_dict(doc, "r.json")
    doc["scene_families"] = {"test_data": "x", "families": {"road": 1}}
    with pytest.raises(ResultsError, match=r"key 'scene_families': missing required key\(s\) \['rows'\]"):
        Results.from_dict(doc, "r.json")


def test_a_tie_with_late_fusion_is_no_lead():
    """Equal APs (e.g. every row at 0 on a tiny test set) are neither a lead nor a loss for late fusion."""
    from experiments.report_family import _late_clause

    def entry(method, junction, road):
        aps = {"junction": junction, "road": road, FAMILY_POOL: (junction + road) / 2}
        return FamilyRow(legacy_method_id(method, "main"), method, "main",
                         {f: FamilyFigure(scenes=1, frames=1, ap={"0.5": v}) for f, v in aps.items()})

    tie = _late_clause([entry("Late fusion", 0.0, 0.0), entry("GenComm (m3 onboarded)", 0.0, 0.0)],
                       ["junction", "road"])[0]
    assert "ties GenComm (m3 onboarded), and no feature-level row is ahead" in tie
    assert "is ahead of every" not in tie and tie.endswith("late fusion leads in no family.")
    split = _late_clause([entry("Late fusion", 0.6, 0.4), entry("GenComm (m3 onboarded)", 0.5, 0.5)],
                         ["junction", "road"])[0]
    assert split.endswith("late fusion's lead is confined to junction scenes.")
