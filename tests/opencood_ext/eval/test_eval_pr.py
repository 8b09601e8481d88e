"""PR curves in the evaluation output (pr_<label>.png and the curves in eval_<label>.json) and
in REPORT.md, with a detector whose detections are known: every GT box (half of them with a
high score, half with a low one) and one far-away false positive per frame in between."""
import json

import numpy as np
import pytest
import torch
from torch import nn

from experiments.report import write_report
from experiments.results import Results
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.eval.evaluate import evaluate
from opencood_ext.comm.messages import Delivery, Messages
from opencood_ext.models.detector import Prediction
from opencood_ext.postprocess import Detections

from opencood_ext.data.synthetic import make_frame

RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)


class KnownDetections(nn.Module):
    """Not a detector: returns each sample's GT boxes (scores 0.9 / 0.3 alternating) and one
    false positive far outside every GT box (score 0.6), so the PR curve is known."""

    fusion = "none"

    def __init__(self):
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))  # evaluate() reads the device from a parameter

    def predict(self, batch, channel=None, keys=None):
        gt = batch.gt_boxes[0].float()
        fp = torch.tensor([[200.0, 200.0, -1.0, 4.0, 2.0, 1.5, 0.0]])
        scores = torch.tensor([0.9 if k % 2 == 0 else 0.3 for k in range(len(gt))] + [0.6])
        boxes = torch.cat([gt, fp])
        dets = [Detections(boxes=boxes, scores=scores, labels=torch.zeros(len(boxes), dtype=torch.long))]
        nothing = Messages.empty("bev")
        return Prediction(dets, Delivery(nothing, nothing, []))


def _dataset():
    frames = [make_frame(seed=s, num_agents=1, num_objects=6, timestamp=f"{s:06d}") for s in range(3)]
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()}, augment=AugmentConfig(enabled=False))
    return CooperativeDataset(frames, cfg, {"m1": (0.8, 0.8, 4.0)}, train=False, cooperation="ego_only")


def test_pr_curves_written_next_to_the_eval_json_and_in_the_report(tmp_path):
    ds = _dataset()
    res = evaluate(KnownDetections(), ds, out_dir=tmp_path, label="known", progress=False)
    n_gt = res.num_gt
    assert n_gt >= 6 and res.num_pred == n_gt + 3
    image = tmp_path / "pr_known.png"
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and res.pr_curves["image"] == str(image)
    stored = json.loads((tmp_path / "eval_known.json").read_text())["pr_curves"]
    assert stored["order"] == "global" and set(stored["curves"]) == {"0.3", "0.5", "0.7"}
    # global order: the high-score half of the GT boxes (precision 1), the 3 false positives, then the
    # low-score half, which ends at recall 1 with precision n / (n + 3), the best from there on
    high = sum((len(ds[i].gt_boxes) + 1) // 2 for i in range(3)) / n_gt
    c = stored["curves"]["0.5"]
    r, p = np.array(c["recall"]), np.array(c["precision"])
    assert r[0] == 0.0 and r[-1] == 1.0 and (np.diff(r) > 0).all() and (np.diff(p) <= 0).all()
    np.testing.assert_array_equal(p, np.where(r <= high + 1e-9, 1.0, round(n_gt / (n_gt + 3), 4)))
    assert res.ap["global"][0.5] == pytest.approx(high + (1 - high) * n_gt / (n_gt + 3))

    rows = [{"method_id": "known", "method": "Known detections", "eval": json.loads((tmp_path / "eval_known.json").read_text()),
             "train_wall_s": 1, "trainable_params": 1, "note": ""},
            {"method_id": "old", "method": "Old row without curves", "eval": {"ap": {"global": {"0.3": 0.1, "0.5": 0.1, "0.7": 0.1},
                                                                 "per_frame": {"0.3": 0.1, "0.5": 0.1, "0.7": 0.1}},
                                                          "bytes_per_message": 0},
             "train_wall_s": 1, "trainable_params": 1, "note": ""}]
    results = {"profile": "quick", "seed": 0, "data": "d", "rows": rows, "total_wall_s": 60,
               "onboarding": {"trainable_params_per_new_type": {"m3": 1}, "frozen_params": 1,
                              "frozen_batchnorm_layers": 0, "onboarding_wall_time_s": 1},
               "stage1_wall_s": {"m1": 1}}
    report_dir = tmp_path / "report"
    report_dir.mkdir()
    report = write_report(Results.from_dict(results), report_dir).read_text()
    assert "![PR curves](pr_curves.png)" in report
    assert (report_dir / "pr_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "[Known detections](../pr_known.png)" in report and "Old row without curves](" not in report
