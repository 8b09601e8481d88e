"""REPORT.md's distance from the plateau (experiments/plateau.py): each run's last doubling from its
train_log.jsonl, the learning curves' 2 % rule."""
import json

from experiments.plateau import plateau_of, plateau_section


def _run(folder, losses):
    folder.mkdir(parents=True)
    lines = [json.dumps({"kind": "step", "epoch": 1})]
    lines += [json.dumps({"kind": "epoch", "epoch": k + 1, "val_detection_loss": v}) for k, v in enumerate(losses)]
    (folder / "train_log.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_the_last_doubling_of_a_run(tmp_path):
    still = plateau_of(_run(tmp_path / "a", [1.8, 2.0, 1.6, 1.3, 1.0, 0.9, 0.85, 0.8]))
    assert (still.epochs, still.half, still.end) == (8, 1.3, 0.8)
    assert abs(still.gain - (1 - 0.8 / 1.3)) < 1e-12 and not still.at_plateau
    flat = plateau_of(_run(tmp_path / "b", [1.0, 0.80, 0.79, 0.795]))   # 0.80 -> 0.79: 1.25 % lower
    assert flat.at_plateau and flat.half == 0.80
    assert plateau_of(_run(tmp_path / "c", [0.7])) is None            # one validated epoch: no half
    assert plateau_of(tmp_path / "nothing") is None                    # no log (late fusion of stage-1 models)


def test_the_report_section(tmp_path):
    a = _run(tmp_path / "runs" / "m1_none", [1.8, 1.2, 1.0, 0.9])
    b = _run(tmp_path / "runs" / "gencomm_stage1_m1", [1.0, 0.99, 0.985, 0.984])
    lines = plateau_section([("No fusion", str(a)), ("GenComm stage 1, m1", str(b)), ("Late", str(tmp_path / "x"))])
    text = "\n".join(lines)
    assert lines[0] == "## Distance from the plateau"
    assert "| No fusion | m1_none | 4 | 1.200 | 0.900 | 25.0 % | still improving |" in text
    assert "| GenComm stage 1, m1 | gencomm_stage1_m1 | 4 | 0.990 | 0.984 | 0.6 % | at its plateau |" in text
    assert "Late" not in text and "1 of 2 runs were still improving" in text
    assert plateau_section([("Late", str(tmp_path / "x"))]) == []
