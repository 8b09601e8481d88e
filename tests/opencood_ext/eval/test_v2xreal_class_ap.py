"""AP per class (V2X-Real's vehicle / pedestrian / truck) as GenComm's inference_v2xreal reports it:
each class's detections against that class's ground truth only, and mAP the mean over classes; on
hand-made predictions whose AP is worked out by hand, and through evaluate() (JSON and table)."""
import json

import numpy as np
import pytest
import torch
from torch import nn

from opencood_ext.comm.messages import Delivery, Messages
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.synthetic import make_frame
from opencood_ext.eval.class_ap import ClassAP
from opencood_ext.eval.evaluate import evaluate
from opencood_ext.models.detector import Prediction
from opencood_ext.postprocess import Detections

CLASSES = ["vehicle", "pedestrian", "truck"]


def _box(x, y, l=4.0, w=2.0):
    return [x, y, -1.0, l, w, 1.5, 0.0]


def test_hand_made_frame():
    """vehicle: 2 GT; detections TP (0.9), FP (0.8), TP (0.7): precision 1, 1/2, 2/3 at recall
    1/2, 1/2, 1: VOC AP 1/2 * 1 + 1/2 * 2/3 = 5/6. pedestrian: 1 GT, found by a vehicle-labelled box
    (which does not count for it: for vehicle it is one more FP at 0.95) and by nothing of its own
    class: AP 0. truck: 1 GT, one truck detection on it: AP 1. mAP = (5/6 + 0 + 1) / 3."""
    gt = np.array([_box(0, 0), _box(10, 0), _box(20, 0, 0.8, 0.8), _box(30, 0, 8.0, 2.5)])
    gt_cls = np.array([0, 0, 1, 2])
    pred = np.array([_box(0, 0), _box(50, 50), _box(10, 0), _box(20, 0, 0.8, 0.8), _box(30, 0, 8.0, 2.5)])
    scores = np.array([0.9, 0.8, 0.7, 0.95, 0.6])
    labels = np.array([0, 0, 0, 0, 2])
    acc = ClassAP(CLASSES)
    acc.add(pred, scores, labels, gt, gt_cls)
    s = acc.summary()
    # vehicle with the pedestrian-shaped FP first: precision 0, 1/2, 1/3, 1/2 at recall 0, 1/2, 1/2, 1
    assert s["classes"]["vehicle"]["global"][0.5] == pytest.approx(0.5 * 0.5 + 0.5 * 0.5)
    assert s["classes"]["pedestrian"]["global"][0.5] == 0.0
    assert s["classes"]["truck"]["global"][0.5] == pytest.approx(1.0)
    assert s["map"]["global"][0.5] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert s["classes"]["vehicle"]["num_gt"] == 2 and s["classes"]["vehicle"]["num_pred"] == 4
    # without the mislabelled box: the 5/6 of the docstring
    keep = np.arange(5) != 3
    acc = ClassAP(CLASSES)
    acc.add(pred[keep], scores[keep], labels[keep], gt, gt_cls)
    assert acc.summary()["classes"]["vehicle"]["per_frame"][0.5] == pytest.approx(5 / 6)


def test_class_without_ground_truth_is_left_out_of_the_mean():
    acc = ClassAP(CLASSES)
    acc.add(np.array([_box(0, 0)]), np.array([0.9]), np.array([0]), np.array([_box(0, 0)]), np.array([0]))
    s = acc.summary()
    assert s["classes"]["pedestrian"]["global"][0.5] is None and s["classes_in_map"] == ["vehicle"]
    assert s["map"]["global"][0.5] == pytest.approx(1.0)


def test_bad_indices_refused():
    acc = ClassAP(CLASSES)
    with pytest.raises(ValueError, match=r"labels must be class indices in 0\.\.2"):
        acc.add(np.array([_box(0, 0)]), np.array([0.9]), np.array([3]), np.zeros((0, 7)), np.zeros(0, int))
    with pytest.raises(ValueError, match="two or more"):
        ClassAP(["vehicle"])


class ClassSwap(nn.Module):
    """Returns each sample's GT boxes with their GT class, except that every box of class 1 is
    reported as class 0 (so class 1 is never found and class 0 gains false positives)."""

    fusion = "none"

    def __init__(self):
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))

    def predict(self, batch, channel=None, keys=None):
        gt, cls = batch.gt_boxes[0].float(), batch.gt_classes[0].clone()
        cls[cls == 1] = 0
        dets = [Detections(boxes=gt, scores=torch.linspace(0.9, 0.3, len(gt)), labels=cls)]
        nothing = Messages.empty("bev")
        return Prediction(dets, Delivery(nothing, nothing, []))


def test_evaluate_writes_class_ap(tmp_path):
    frames = [make_frame(seed=s, num_agents=1, num_objects=6, timestamp=f"{s:06d}") for s in range(2)]
    for f in frames:  # object types by id: the classes of the three groups in turn
        for k, oid in enumerate(sorted(f.objects)):
            f.objects[oid].obj_type = ("Car", "Pedestrian", "Truck")[k % 3]
    cfg = DataConfig(lidar_range=(-32.0, -32.0, -3.0, 32.0, 32.0, 1.0), agent_types={"m1": AgentTypeData()},
                     augment=AugmentConfig(enabled=False),
                     class_groups={"vehicle": ["Car"], "pedestrian": ["Pedestrian"], "truck": ["Truck"]})
    ds = CooperativeDataset(frames, cfg, {"m1": (0.8, 0.8, 4.0)}, train=False, cooperation="ego_only")
    res = evaluate(ClassSwap(), ds, out_dir=tmp_path, label="swap", progress=False)
    stored = json.loads((tmp_path / "eval_swap.json").read_text())["ap_by_class"]
    assert list(stored["classes"]) == CLASSES
    assert stored["classes"]["truck"]["global"]["0.5"] == pytest.approx(1.0)
    assert stored["classes"]["pedestrian"]["global"]["0.5"] == 0.0
    assert 0.0 < stored["classes"]["vehicle"]["global"]["0.5"] < 1.0
    assert stored["map"]["global"]["0.5"] == pytest.approx(np.mean(
        [stored["classes"][c]["global"]["0.5"] for c in CLASSES]))
    table = res.table()
    assert "pedestrian" in table and "mAP" in table
    # a one-class dataset has no per-class table
    one = CooperativeDataset(frames, DataConfig(lidar_range=(-32.0, -32.0, -3.0, 32.0, 32.0, 1.0),
                                                agent_types={"m1": AgentTypeData()}),
                             {"m1": (0.8, 0.8, 4.0)}, train=False, cooperation="ego_only")
    assert evaluate(ClassSwap(), one, progress=False).ap_by_class is None
