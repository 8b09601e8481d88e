"""``gencomm-curves status``: which runs of each budget are finished, their epochs left and the core-hours
that is, from run folders written here (nothing is trained)."""
import json
from pathlib import Path

import pytest

from experiments.curves_run import main
from experiments.curves_status import RunStatus, budget_status, lanes_wall_hours, run_folders
from experiments.profiles import MAIN_ONBOARDING

ARCHIVE = Path(__file__).resolve().parents[2] / "archive" / "learning_curves" / "budget1"


def _run(folder: Path, epochs_total, times, threads=1):
    """A run folder: config.yaml with train.epochs (None: not written yet) and one epoch record per time."""
    folder.mkdir(parents=True, exist_ok=True)
    if epochs_total is not None:
        (folder / "config.yaml").write_text(f"model: {{}}\ntrain:\n  epochs: {epochs_total}\n")
    lines = [json.dumps({"kind": "step", "epoch": 1, "step": 3, "loss": 2.0})]
    lines += [json.dumps({"kind": "epoch", "epoch": k + 1, "steps": 72, "time_s": t, "threads": threads})
              for k, t in enumerate(times)]
    (folder / "train_log.jsonl").write_text("\n".join(lines) + "\n")


def test_the_runs_are_the_curves_jobs_runs():
    # the archived budget-1 job of the full profile: its run folders, less the two that only evaluate
    kept = {p.name for p in ARCHIVE.iterdir() if p.is_dir()} - {"late_of_stage1_m1m3", "none_of_stage1"}
    folders = run_folders("full")
    assert set(folders) == kept
    assert folders["m1_none"] == "training" and folders[MAIN_ONBOARDING] == "onboarding"
    assert sum(k == "onboarding" for k in folders.values()) == 7


def test_status_counts_epochs_and_core_hours_left(tmp_path, capsys):
    out = tmp_path / "curves"
    _run(out / "budget1" / "runs" / "m1_none", 8, [60.0] * 8)
    _run(out / "budget1" / "runs" / "gencomm_stage1_m1", 8, [100.0, 140.0], threads=2)  # 240 core-s an epoch
    _run(out / "budget2" / "runs" / "m1_none", 16, [90.0] * 4)                        # its own epochs: 90 s
    rows = {r.name: r for r in budget_status(out, 2, "full")}
    none = rows["m1_none"]
    assert (none.epochs_done, none.epochs_total, none.core_seconds_per_epoch) == (4, 16, 90.0)
    assert none.core_hours_left == pytest.approx(12 * 90.0 / 3600)
    stage1 = rows["gencomm_stage1_m1"]  # not started at 2x: budget 1's epochs doubled and its epoch cost
    assert (stage1.epochs_done, stage1.epochs_total, stage1.core_seconds_per_epoch) == (0, 16, 240.0)
    assert stage1.core_hours_left == pytest.approx(16 * 240.0 / 3600)
    unknown = rows[MAIN_ONBOARDING]
    assert unknown.epochs_total is None and unknown.core_hours_left is None and not unknown.finished
    one = {r.name: r for r in budget_status(out, 1, "full")}
    assert one["m1_none"].finished and one["m1_none"].core_hours_left == 0.0
    (out / "budget2" / "cache" / "features").mkdir(parents=True)
    with open(out / "budget2" / "cache" / "features" / "x.pt", "wb") as fh:
        fh.truncate(300_000_000)  # a sparse file: its size without the disk
    assert main(["status", str(out), "--profile", "full"]) == 0
    text = capsys.readouterr().out
    assert "## Budget 1x: 1 of 15 runs finished" in text
    assert f"## Budget 2x: 0 of 15 runs finished, about {12 * 90 / 3600 + 16 * 240 / 3600:.1f} core-hours left (+ " in text
    assert "On disk: run folders 0.0 GB, feature cache 0.3 GB" in text
    assert "| m1_none | training | 4/16 | 1.5 | 0.30 |" in text and "| gencomm_stage1_m1 | training | 0/16 | 4.0 | 1.07 |" in text
    (out / "budget2" / "runs" / "m1_none" / "config.yaml").write_text("train: [8]\n")
    assert main(["status", str(out), "--budgets", "2", "--profile", "full"]) == 2
    assert "m1_none/config.yaml: field 'train.epochs' unreadable" in capsys.readouterr().err
    assert main(["status", str(tmp_path / "empty")]) == 2
    assert "no budget<K>/ folder" in capsys.readouterr().err


def _left(name, kind, hours):
    return RunStatus(name, kind, 0, 1, hours * 3600.0)  # one epoch to go, of ``hours`` core-hours


def test_wall_hours_in_lanes_trainings_then_onboardings():
    rows = [_left("a", "training", 3.0), _left("b", "training", 2.0), _left("c", "training", 1.0),
            _left("x", "onboarding", 1.0), _left("y", "onboarding", 1.5), RunStatus("done", "training", 4, 4, 60.0),
            RunStatus("unmeasured", "onboarding", 0, None, None)]
    assert lanes_wall_hours(rows, 1) == pytest.approx(8.5)  # one lane: every core-hour left
    # two lanes: a | b then c (3 h), then the onboardings x | y (1.5 h): the stage-1 runs come first
    assert lanes_wall_hours(rows, 2) == pytest.approx(4.5)
    assert lanes_wall_hours(rows, 8) == pytest.approx(4.5)
    with pytest.raises(ValueError, match="--jobs must be a positive whole number"):
        lanes_wall_hours(rows, 0)


def test_status_gives_the_wall_clock_in_lanes_when_asked(tmp_path, capsys):
    out = tmp_path / "curves"
    _run(out / "budget2" / "runs" / "m1_none", 16, [90.0] * 4)         # 0.30 core-hours left
    _run(out / "budget2" / "runs" / "m1m3_late", 16, [45.0] * 8)       # 0.10
    assert main(["status", str(out), "--profile", "full", "--jobs", "2"]) == 0
    assert "about 0.4 core-hours left, about 0.3 h in 2 lanes (+ " in capsys.readouterr().out
    assert main(["status", str(out), "--profile", "full"]) == 0
    assert "lanes" not in capsys.readouterr().out
