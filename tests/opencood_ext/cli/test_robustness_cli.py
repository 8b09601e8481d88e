"""tools/robustness.py end to end on a tiny trained run (resumable, same labels as tools/inference.py),
the tables and intervals it renders, and the main job's robustness step and REPORT section."""
import json
import os
import sys
from pathlib import Path

import pytest

from opencood_ext.eval.robustness import EFFECTS, format_tables, interval, parse_run
from robust_runs import trained_late_run

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import inference  # noqa: E402
import robustness  # noqa: E402

LEVELS = ["--noise", "0,3", "--latency", "0,2", "--drop", "0,1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, one_thread):
    return trained_late_run(tmp_path_factory)


def _points(data, effect, label):
    return data["effects"][effect]["results"][label]


def test_sweep_end_to_end_and_resume(run, tmp_path, capsys):
    assert inference.main(["--model_dir", str(run)]) == 0  # the plain evaluation, as the main job writes it
    plain = json.loads((run / "eval_late.json").read_text())
    out = tmp_path / "rob"
    args = ["--runs", f"Late={run}:late", "--runs", f"Off={run}:no", "--sweep", "all", "-o", str(out),
            "--no_progress", *LEVELS]
    assert robustness.main(args) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "robustness.json").read_text())
    assert [r["fusion"] for r in data["runs"]] == ["late", "none"]
    late = {e: _points(data, e, "Late") for e in EFFECTS}
    assert all(ps[0]["reused"] and ps[0]["eval"] == "eval_late.json" for ps in late.values())
    assert late["noise"][0]["ap"] == plain["ap"]["global"]
    assert late["noise"][1]["ap"]["0.5"] < late["noise"][0]["ap"]["0.5"] - 0.1
    assert late["drop"][1]["lost"] == late["drop"][1]["sent"] > 0
    off = data["effects"]["drop"]["off"]["Late"]
    assert late["drop"][1]["ap"] == off["ap"] and off["eval"] == "eval_none.json"
    for name in ("late_noise3m3deg", "late_latency2", "late_drop1", "none", "none_noise3m3deg", "none_latency2"):
        assert json.loads((run / f"eval_{name}.json").read_text())["frames"] == 5
    # nothing is sent without fusion: every level is the same evaluation
    aps = {json.dumps(p["ap"]) for e in EFFECTS for p in _points(data, e, "Off")}
    assert len(aps) == 1 and all(p["sent"] == 0 for e in EFFECTS for p in _points(data, e, "Off"))
    md = (out / "robustness.md").read_text()
    assert md in printed and "| run | 0 | 1 | collaborators off |" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| Late |")]
    assert len(rows) == 4 and rows[0].count("|") == 6  # the runs table, then noise / latency / drop
    assert (out / "robustness.png").stat().st_size > 5000

    # rerun: every evaluation is reused, no eval file is rewritten
    stamps = {p: p.stat().st_mtime_ns for p in run.glob("eval_*.json")}
    assert robustness.main(args) == 0
    again = json.loads((out / "robustness.json").read_text())
    assert all(p["reused"] for e in EFFECTS for lab in ("Late", "Off") for p in _points(again, e, lab))
    assert {p: p.stat().st_mtime_ns for p in run.glob("eval_*.json")} == stamps

    # another channel seed: new draws under new labels; the perfect channel's evaluations still count
    assert robustness.main(["--runs", f"Late={run}:late", "--sweep", "noise", "-o", str(out), "--no_progress",
                            "--noise", "0,3", "--channel_seed", "1"]) == 0
    seeded = _points(json.loads((out / "robustness.json").read_text()), "noise", "Late")
    assert seeded[0]["reused"] and not seeded[1]["reused"] and seeded[1]["eval"] == "eval_late_noise3m3deg_seed1.json"

    # weights newer than an evaluation, or an evaluation of other frames: evaluated again
    ckpt = run / "checkpoints" / "latest.pth"
    os.utime(ckpt, None)
    assert robustness.main(["--runs", f"Late={run}", "--sweep", "latency", "-o", str(out), "--no_progress",
                            "--latency", "0", "--max_frames", "3"]) == 0
    p = _points(json.loads((out / "robustness.json").read_text()), "latency", "Late")[0]
    assert not p["reused"] and p["frames"] == 3


@pytest.mark.parametrize("argv, message", [
    (["--runs", "no-label-here"], "LABEL=RUN_DIR"),
    (["--runs", "A=/nonexistent/run"], "does not exist"),
    (["--runs", "A={run}", "--runs", "A={run}"], "distinct"),
    (["--runs", "A={run}", "--noise", "0,x"], "--noise: 'x' is not a number"),
    (["--runs", "A={run}", "--latency", "0,1.5"], "--latency: '1.5' is not an integer"),
    (["--runs", "A={run}", "--drop", "0,2"], "--drop: level 2 must be >= 0 and <= 1"),
])
def test_bad_input_is_a_clear_error(run, tmp_path, capsys, argv, message):
    argv = [a.format(run=run) for a in argv]
    assert robustness.main([*argv, "-o", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_parse_run_and_intervals():
    methods = ["none", "late", "early", "intermediate", "no"]
    spec = parse_run("GenComm (m3)=runs/a:b:intermediate", methods)
    assert (spec.label, str(spec.run_dir), spec.fusion) == ("GenComm (m3)", "runs/a:b", "intermediate")
    spec = parse_run("X=runs/a:b", methods)
    assert (str(spec.run_dir), spec.fusion) == ("runs/a:b", None)
    p = {"ap": {"0.5": 0.5, "0.7": 0.2}}
    assert interval(p, "0.5") is None
    for ci in ({"0.5": [0.4, 0.6]}, {"global": {"0.5": [0.4, 0.6]}}, {"0.5": {"lo": 0.4, "hi": 0.6}}):
        assert interval(dict(p, ap_ci=ci), "0.5") == (0.4, 0.6)


def _data(with_ci):
    def pt(level, a5, a7):
        p = {"level": level, "ap": {"0.3": a5, "0.5": a5, "0.7": a7}, "frames": 48, "sent": 96, "lost": 0}
        if with_ci:
            p["ap_ci"] = {"0.5": [a5 - 0.05, a5 + 0.05], "0.7": [a7 - 0.02, a7 + 0.02]}
        return p
    effects = {name: {"title": e.title, "axis": e.axis, "levels": [0, 1], "results": {
        "Late fusion": [pt(0, 0.7, 0.2), pt(1, 0.45, 0.1)], "GenComm": [pt(0, 0.65, 0.16), pt(1, 0.4, 0.12)]}}
        for name, e in EFFECTS.items()}
    effects["drop"]["off"] = {"Late fusion": pt(None, 0.45, 0.1), "GenComm": pt(None, 0.398, 0.12)}
    return {"settings": {"channel_seed": 0, "split": None, "max_frames": None, "overrides": [],
                         "levels": {n: [0, 1] for n in EFFECTS}},
            "runs": [{"label": "Late fusion", "run_dir": "runs/late", "fusion": "late", "split": "test"},
                     {"label": "GenComm", "run_dir": "runs/gc", "fusion": "intermediate", "split": "test"}],
            "effects": effects}


def test_tables_show_intervals_when_present():
    plain = "\n".join(format_tables(_data(False)))
    assert "| GenComm | 0.650 / 0.160 | 0.400 / 0.120 |" in plain
    assert "| GenComm | 0.650 / 0.160 | 0.400 / 0.120 | 0.398 / 0.120 |" in plain  # drop: collaborators off
    ci = "\n".join(format_tables(_data(True)))
    assert "| Late fusion | 0.700 (0.650-0.750) / 0.200 (0.180-0.220) |" in ci


def test_report_section_from_robustness_json(tmp_path):
    from experiments.report import robustness_section
    from experiments.evaluation import Evaluation
    from experiments.results import ResultRow
    assert robustness_section(tmp_path) == []
    (tmp_path / "robustness").mkdir()
    (tmp_path / "robustness" / "robustness.json").write_text(json.dumps(_data(False)))
    text = "\n".join(robustness_section(tmp_path))
    assert text.startswith("## Robustness")
    assert "![AP under channel effects](robustness/robustness.png)" in text
    assert "### Pose noise" in text and "| Late fusion | 0.700 / 0.200 | 0.450 / 0.100 |" in text
    assert "Late fusion +0.000, GenComm +0.002" in text  # drop 1 against collaborators off, AP@0.5
    assert "earlier invocation" not in text
    swept = sorted({str(Path(r["run_dir"]).parent) for r in _data(False)["runs"]})
    same = [ResultRow("x", "x", Evaluation({}), 0.0, 0, run=str(Path(d) / "x")) for d in swept]
    assert "earlier invocation" not in "\n".join(robustness_section(tmp_path, same))
    other = "\n".join(robustness_section(tmp_path, [ResultRow("x", "x", Evaluation({}), 0.0, 0,
                                                              run="/results/runs/seed1/m1_none")]))
    assert "This sweep comes from an earlier invocation, on the runs in `" + swept[0] in other
