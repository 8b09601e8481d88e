"""evaluate() writes 95% scene-bootstrap intervals (ap_ci) and the per-frame records; tools/compare.py
pairs two evaluations of the same frames; REPORT.md shows the intervals and the differences vs GenComm.
The 'detector' returns every GT box (or every other one) as its detections, so the AP is known."""
import json
import re

import numpy as np
import pytest
import torch
from torch import nn

from experiments.report import write_report
from experiments.results import Results
from opencood_ext.cli.compare import main as compare_main, parse_spec
from opencood_ext.comm.messages import Delivery, Messages
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.eval.bootstrap import bootstrap_ap
from opencood_ext.eval.records import FrameRecords
from opencood_ext.eval.run_records import compare_runs
from opencood_ext.eval.evaluate import evaluate
from opencood_ext.models.detector import Prediction
from opencood_ext.postprocess import Detections

from opencood_ext.data.synthetic import make_frame

RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)


class GTDetector(nn.Module):
    """Detects GT box k when k % every == 0 (score 0.9 - 0.01 k), nothing else."""

    fusion = "none"

    def __init__(self, every=1):
        super().__init__()
        self.every = every
        self.unused = nn.Parameter(torch.zeros(1))  # evaluate() reads the device from a parameter

    def predict(self, batch, channel=None, keys=None):
        gt = batch.gt_boxes[0].float()[::self.every]
        scores = 0.9 - 0.01 * torch.arange(len(gt), dtype=torch.float32)
        nothing = Messages.empty("bev")
        return Prediction([Detections(boxes=gt, scores=scores, labels=torch.zeros(len(gt), dtype=torch.long))],
                          Delivery(nothing, nothing, []))


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    frames = [make_frame(seed=s, num_agents=1, num_objects=6, scenario=f"scene{s // 2}", timestamp=f"{s:06d}")
              for s in range(8)]
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()}, augment=AugmentConfig(enabled=False))
    ds = CooperativeDataset(frames, cfg, {"m1": (0.8, 0.8, 4.0)}, train=False, cooperation="ego_only")
    full = evaluate(GTDetector(1), ds, out_dir=out, label="full", progress=False, resamples=300)
    half = evaluate(GTDetector(2), ds, out_dir=out, label="half", progress=False, resamples=300)
    again = evaluate(GTDetector(1), ds, out_dir=out, label="again", progress=False, resamples=300)
    return out, full, half, again


def test_evaluate_writes_intervals_and_the_frames_file(evaluated):
    out, full, half, _ = evaluated
    stored = json.loads((out / "eval_half.json").read_text())
    assert set(stored["ap_ci"]) == set(stored["ap"]) == {"global", "per_frame"}
    for order in stored["ap"]:
        assert set(stored["ap_ci"][order]) == set(stored["ap"][order]) == {"0.3", "0.5", "0.7"}
        for t, (lo, hi) in stored["ap_ci"][order].items():
            assert lo <= hi
    assert stored["num_scenes"] == 4 and stored["frames"] == 8
    assert stored["bootstrap"] == {"interval": "percentile bootstrap, 95%", "unit": "scene", "resamples": 300,
                                   "seed": 0}
    assert stored["frames_file"] == str(out / "eval_half_frames.npz")
    rec = FrameRecords.load(stored["frames_file"])
    assert rec.num_frames == 8 and rec.scene_ids == [f"scene{k}" for k in range(4)]
    assert list(rec.frames[:2]) == ["scene0/000000", "scene0/000001"]
    assert rec.num_gt.sum() == stored["num_gt"] and len(rec.scores) == stored["num_pred"]
    boot = bootstrap_ap(rec, resamples=300)
    for order in ("global", "per_frame"):  # the records reproduce the evaluation's AP exactly
        assert list(boot.ap[order]) == [stored["ap"][order][t] for t in ("0.3", "0.5", "0.7")]
    assert boot.ci_json() == stored["ap_ci"]
    # every GT detected in every frame: AP 1 on every resample; half of them: an interval below 1
    assert full.ap_ci["global"]["0.5"] == [1.0, 1.0]
    assert half.ap_ci["global"]["0.5"][1] < 1.0
    assert "95% intervals over 4 test scenes, global order: IoU 0.3 [" in half.table()


def test_compare_runs_pairs_the_same_frames(evaluated, capsys):
    out = evaluated[0]
    d = compare_runs(out, out, "half", "full", resamples=300)
    assert d.significant("global").all() and (d.hi["global"] < 0).all()
    same = compare_runs(out, out, "again", "full", resamples=300)
    assert (same.lo["global"] == 0).all() and (same.hi["global"] == 0).all()
    assert compare_main([f"{out}:full", f"{out}:half", f"{out}:again", "--resamples", "200",
                         "--json", str(out / "cmp.json")]) == 0
    text = capsys.readouterr().out
    assert re.search(r":half\s+-0\.\d{3} \[-0\.\d{3}, -0\.\d{3}\] \*", text)
    assert re.search(r":again\s+\+0\.000 \[\+0\.000, \+0\.000\]\s", text)
    summary = json.loads((out / "cmp.json").read_text())
    assert summary["reference"] == f"{out}:full" and summary["scenes"] == 4
    assert summary["runs"][1]["minus_reference"]["global"]["0.5"]["significant"] is True
    assert summary["runs"][2]["minus_reference"]["global"]["0.5"]["significant"] is False
    # --reference picks the run the others are compared with
    assert compare_main([f"{out}:full", f"{out}:half", "--reference", f"{out}:half", "--resamples", "50"]) == 0
    assert re.search(r":full\s+\+0\.\d{3} \[\+0\.\d{3}, \+0\.\d{3}\] \*", capsys.readouterr().out)
    # without a label the folder must hold one evaluation
    assert compare_main([str(out), f"{out}:half"]) == 2
    assert "several evaluations" in capsys.readouterr().err
    assert parse_spec(f"{out}:half") == (out, "half") and parse_spec(str(out)) == (out, None)


def _report_results(rows):
    return Results.from_dict({"profile": "quick", "seed": 0, "data": "d", "rows": rows, "total_wall_s": 60,
            "onboarding": {"trainable_params_per_new_type": {"m3": 1}, "frozen_params": 1,
                           "frozen_batchnorm_layers": 0, "onboarding_wall_time_s": 1},
            "stage1_wall_s": {"m1": 1}})


def test_report_shows_intervals_and_paired_differences_vs_gencomm(evaluated, tmp_path):
    out = evaluated[0]
    load = lambda label: json.loads((out / f"eval_{label}.json").read_text())  # noqa: E731
    row = lambda method_id, method, label: {"method_id": method_id, "method": method,  # noqa: E731
                                            "eval": load(label), "train_wall_s": 1, "trainable_params": 1, "note": ""}
    old = {"ap": {o: {"0.3": 0.5, "0.5": 0.4, "0.7": 0.2} for o in ("global", "per_frame")}, "bytes_per_message": 0}
    rows = [row("half", "Half detections", "half"), row("gencomm", "GenComm (m3 onboarded)", "full"),
            row("same", "Same as GenComm", "again"),
            {"method_id": "old", "method": "Old row", "eval": old, "train_wall_s": 1, "trainable_params": 1, "note": ""}]
    report = write_report(_report_results(rows), tmp_path).read_text()
    half = load("half")
    cells = [c.strip() for c in next(ln for ln in report.splitlines()
                                     if ln.startswith("| Half detections |")).strip("|").split("|")]
    lo, hi = half["ap_ci"]["global"]["0.5"]
    assert cells[2] == f"{half['ap']['global']['0.5']:.3f} [{lo:.2f}, {hi:.2f}]"
    assert re.fullmatch(r"\d\.\d{3} \[\d\.\d{2}, \d\.\d{2}\] / \d\.\d{3} \[\d\.\d{2}, \d\.\d{2}\]", cells[4])
    assert "| Old row | 0.500 | 0.400 | 0.200 |" in report  # rows without intervals still render
    assert "over the 4 test scenes (300 resamples of whole scenes, seed 0" in report
    section = report.split("## Paired differences against GenComm (m3 onboarded)")[1]
    diff_row = next(ln for ln in section.splitlines() if ln.startswith("| Half detections |"))
    assert diff_row.count("**-0.") == 3 and diff_row.endswith("| AP@0.3, AP@0.5, AP@0.7 |")
    assert "| Same as GenComm | +0.000 [+0.00, +0.00] | +0.000 [+0.00, +0.00] | +0.000 [+0.00, +0.00] | none |" \
        in section
    assert "| Old row | - | - | - | no per-frame records |" in section
    assert "Significant: Half detections (AP@0.3, AP@0.5, AP@0.7)." in section
    assert "Not significant: Same as GenComm (AP@0.3, AP@0.5, AP@0.7)." in section
    assert np.isfinite(lo) and lo < hi
