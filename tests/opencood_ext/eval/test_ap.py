"""AP evaluator against hand-computed values, in both accumulation orders.

Boxes are 2 x 2 squares on the x axis. A prediction equal to a GT box has IoU 1;
one shifted by d along x has IoU (2 - d) * 2 / (8 - (2 - d) * 2) = (2 - d) / (2 + d):
d = 0.5 gives 0.6 (TP at 0.3 and 0.5, FP at 0.7), d = 1 gives 1/3 (TP at 0.3 only).
"""
import math

import numpy as np
import pytest
import torch

from opencood_ext.eval import APAccumulator, format_ap_table, plot_pr_curves, pr_envelope, voc_ap
from opencood_ext.geometry import bev_iou


def sq(x):
    return [x, 0.0, 0.0, 2.0, 2.0, 1.5, 0.0]


FAR = 100.0  # a prediction with IoU 0 with everything


def boxes(*xs):
    return np.array([sq(x) for x in xs], dtype=np.float64).reshape(-1, 7)


def test_voc_ap_by_hand():
    # TP FP TP FP with 3 GT: recall 1/3 1/3 2/3 2/3, precision 1 1/2 2/3 1/2.
    # Non-increasing from the right: 1 2/3 2/3 1/2; recall steps at 1/3 (p 1) and 2/3 (p 2/3):
    # AP = 1/3 * 1 + 1/3 * 2/3 = 5/9.
    assert voc_ap([1 / 3, 1 / 3, 2 / 3, 2 / 3], [1, 1 / 2, 2 / 3, 1 / 2]) == pytest.approx(5 / 9)
    assert voc_ap([], []) == 0.0


def test_single_frame_thresholds_and_duplicate():
    # GT at 0, 10, 20. Predictions by score:
    #   .9 on GT0 (IoU 1)           TP at all thresholds
    #   .8 far away                 FP
    #   .7 shifted 0.5 from GT1     IoU 0.6: TP at 0.3 / 0.5, FP at 0.7
    #   .6 on GT0 again (duplicate) GT0 already consumed, best unmatched IoU 0: FP
    # 0.3 and 0.5: TP FP TP FP -> AP 5/9 (see test_voc_ap_by_hand).
    # 0.7: TP FP FP FP -> recall 1/3 then flat, AP = 1/3 * 1 = 1/3.
    acc = APAccumulator()
    acc.add(boxes(FAR, 0, 10.5, 0), np.array([0.8, 0.9, 0.7, 0.6]), boxes(0, 10, 20))
    for global_sort in (True, False):
        res = acc.result(global_sort)
        assert res.ap[0.3] == pytest.approx(5 / 9)
        assert res.ap[0.5] == pytest.approx(5 / 9)
        assert res.ap[0.7] == pytest.approx(1 / 3)
        np.testing.assert_allclose(res.precision[0.5], [1, 1 / 2, 2 / 3, 1 / 2])
        np.testing.assert_allclose(res.recall[0.5], [1 / 3, 1 / 3, 2 / 3, 2 / 3])
        assert (res.num_gt, res.num_pred, res.num_frames) == (3, 4, 1)
    assert acc.result(True).order == "global" and acc.result(False).order == "per_frame"


def test_match_uses_best_still_unmatched_gt():
    # GT at 0 and 1.5; two identical predictions at 0.5 (scores .9, .8).
    # IoU(pred, GT0) = 0.6, IoU(pred, GT1) = 1/3.
    # First takes GT0 at every threshold. Second: GT0 is consumed, its best remaining
    # is GT1 with 1/3 -> TP at 0.3, FP at 0.5 and 0.7.
    # 0.3: TP TP, 2 GT -> AP 1.   0.5: TP FP -> recall 1/2 at p 1 -> AP 1/2.   0.7: FP FP -> 0.
    acc = APAccumulator()
    acc.add(boxes(0.5, 0.5), [0.9, 0.8], boxes(0, 1.5))
    res = acc.result(False)
    assert res.ap == pytest.approx({0.3: 1.0, 0.5: 0.5, 0.7: 0.0})


def test_ties_keep_input_order_within_and_across_frames():
    # One GT; an FP and a TP with equal score 0.5. Stable sort keeps input order.
    # FP first: recall 0, 1; precision 0, 1/2 -> AP = 1 * 1/2 = 0.5.
    # TP first: recall 1, 1; precision 1, 1/2 -> AP = 1.
    fp_first = APAccumulator([0.5])
    fp_first.add(boxes(FAR, 0), [0.5, 0.5], boxes(0))
    tp_first = APAccumulator([0.5])
    tp_first.add(boxes(0, FAR), [0.5, 0.5], boxes(0))
    for global_sort in (True, False):
        assert fp_first.result(global_sort).ap[0.5] == pytest.approx(0.5)
        assert tp_first.result(global_sort).ap[0.5] == pytest.approx(1.0)
    # Across frames (global order): frame 1 holds the FP, frame 2 the TP, equal scores:
    # frame order is kept -> FP, TP -> AP 0.5; swapping the frames gives 1.
    acc = APAccumulator([0.5])
    acc.add(boxes(FAR), [0.5], boxes())
    acc.add(boxes(0), [0.5], boxes(0))
    assert acc.result(True).ap[0.5] == pytest.approx(0.5)
    acc = APAccumulator([0.5])
    acc.add(boxes(0), [0.5], boxes(0))
    acc.add(boxes(FAR), [0.5], boxes())
    assert acc.result(True).ap[0.5] == pytest.approx(1.0)


def test_global_and_per_frame_orders_differ():
    # Frame A: GT a1 (x 0), a2 (x 10). Predictions TP .9 on a1, FP .3 far.
    # Frame B: GT b1 (x 0), b2 (x 10). Predictions TP .8 on b1, TP .6 on b2, FP .5 far.
    # 4 GT in all (a2 is missed).
    # Per-frame order: TP FP | TP TP FP
    #   recall .25 .25 .5 .75 .75; precision 1 .5 2/3 .75 .6
    #   non-increasing from right: 1 .75 .75 .75 .6
    #   AP = .25 * 1 + .25 * .75 + .25 * .75 = .625
    # Global order (scores .9 .8 .6 .5 .3): TP TP TP FP FP
    #   recall .25 .5 .75 .75 .75; precision 1 1 1 .75 .6 -> AP = .75 * 1 = .75
    acc = APAccumulator()
    acc.add(boxes(0, FAR), [0.9, 0.3], boxes(0, 10))
    acc.add(boxes(FAR, 0, 10), [0.5, 0.8, 0.6], boxes(0, 10))
    per_frame, glob = acc.result(False), acc.result(True)
    for t in (0.3, 0.5, 0.7):
        assert per_frame.ap[t] == pytest.approx(0.625)
        assert glob.ap[t] == pytest.approx(0.75)
    np.testing.assert_allclose(per_frame.precision[0.7], [1, 0.5, 2 / 3, 0.75, 0.6])
    np.testing.assert_allclose(per_frame.recall[0.7], [0.25, 0.25, 0.5, 0.75, 0.75])
    np.testing.assert_allclose(glob.precision[0.7], [1, 1, 1, 0.75, 0.6])
    np.testing.assert_allclose(glob.recall[0.7], [0.25, 0.5, 0.75, 0.75, 0.75])
    both = acc.results()
    assert both["global"].ap == glob.ap and both["per_frame"].ap == per_frame.ap


def test_frames_without_gt_or_without_detections():
    # Frame 1: GT at 0, TP .9.  Frame 2: no GT, one FP .95.  Frame 3: GT at 0, no predictions.
    # 2 GT. Per-frame: TP FP -> recall .5 .5, precision 1 .5 -> AP .5.
    # Global: FP(.95) TP(.9) -> recall 0 .5, precision 0 .5 -> AP = .5 * .5 = .25.
    acc = APAccumulator()
    acc.add(boxes(0), [0.9], boxes(0))
    acc.add(boxes(0), [0.95], boxes())
    acc.add(boxes(), np.zeros(0), boxes(0))
    assert acc.result(False).ap[0.5] == pytest.approx(0.5)
    assert acc.result(True).ap[0.5] == pytest.approx(0.25)
    assert acc.result(True).num_frames == 3


def test_no_detections_at_all_is_zero():
    acc = APAccumulator()
    acc.add(boxes(), [], boxes(0, 10))
    acc.add(np.zeros((0, 7)), np.zeros(0), boxes(3))
    for global_sort in (True, False):
        res = acc.result(global_sort)
        assert res.ap == {0.3: 0.0, 0.5: 0.0, 0.7: 0.0}
        assert res.num_gt == 3 and res.num_pred == 0 and res.precision[0.5].shape == (0,)


def test_no_ground_truth_anywhere_is_nan():
    acc = APAccumulator()
    assert math.isnan(acc.result(True).ap[0.5])  # nothing added at all
    acc.add(boxes(0, 5), [0.9, 0.2], boxes())
    res = acc.result(False)
    assert all(math.isnan(v) for v in res.ap.values())
    np.testing.assert_array_equal(res.precision[0.5], [0, 0])
    assert np.isnan(res.recall[0.5]).all()
    assert "n/a" in format_ap_table({"empty": res})


def test_torch_input_and_bev5_match_numpy():
    rng = np.random.default_rng(0)
    np_acc, t_acc, b5_acc = APAccumulator(), APAccumulator(), APAccumulator()
    for _ in range(5):
        gt = np.column_stack([rng.uniform(-20, 20, (6, 2)), np.zeros(6), rng.uniform(1, 4, (6, 3)),
                              rng.uniform(-3, 3, 6)])
        pred = gt[rng.integers(0, 6, 8)] + np.concatenate([rng.normal(0, 0.3, (8, 2)),
                                                           np.zeros((8, 5))], axis=1)
        sc = rng.uniform(size=8)
        np_acc.add(pred, sc, gt)
        t_acc.add(torch.as_tensor(pred, dtype=torch.float32), torch.as_tensor(sc),
                  torch.as_tensor(gt))
        b5_acc.add(pred[:, [0, 1, 3, 4, 6]], sc, gt[:, [0, 1, 3, 4, 6]])
    for g in (True, False):
        ref = np_acc.result(g).ap
        assert 0 < ref[0.7] < ref[0.3] <= 1
        assert t_acc.result(g).ap == pytest.approx(ref, abs=1e-6)
        assert b5_acc.result(g).ap == ref


def test_bad_input_names_the_field():
    acc = APAccumulator()
    with pytest.raises(ValueError, match="pred_boxes"):
        acc.add(np.zeros((2, 6)), [0.1, 0.2], boxes(0))
    with pytest.raises(ValueError, match="gt_boxes"):
        acc.add(boxes(0), [0.1], np.zeros((1, 3)))
    with pytest.raises(ValueError, match="scores"):
        acc.add(boxes(0, 1), [0.1], boxes(0))
    with pytest.raises(ValueError, match="scores"):
        acc.add(boxes(0), [np.nan], boxes(0))
    with pytest.raises(ValueError, match="iou_thresholds"):
        APAccumulator((0.5, 1.5))


def test_table_and_plot(tmp_path):
    acc = APAccumulator()
    acc.add(boxes(FAR, 0, 10.5, 0), np.array([0.8, 0.9, 0.7, 0.6]), boxes(0, 10, 20))
    table = format_ap_table({"late fusion": acc.result(True), "late fusion ": acc.result(False)})
    lines = table.splitlines()
    assert lines[0].split() == ["name", "order", "AP@0.3", "AP@0.5", "AP@0.7", "num_gt", "num_pred"]
    assert "global" in lines[2] and "per_frame" in lines[3]
    assert "0.5556" in lines[2] and "0.3333" in lines[2]
    path = plot_pr_curves(acc.result(True), tmp_path / "plots" / "pr.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _plain_ap(frames, ious, thr, global_sort):
    """Straightforward re-statement of the protocol, one frame and one prediction at a time."""
    records, n_gt = [], 0
    for (pred, scores, gt), iou in zip(frames, ious):
        n_gt += len(gt)
        order = sorted(range(len(scores)), key=lambda k: -scores[k])  # stable
        free = list(range(len(gt)))
        for k in order:
            best = max(free, key=lambda g: iou[k, g], default=None)
            ok = best is not None and iou[k, best] >= thr
            if ok:
                free.remove(best)
            records.append((scores[k], ok))
    if global_sort:
        records = sorted(records, key=lambda r: -r[0])
    tp = fp = 0
    points = [(0.0, 0.0)]
    for _, ok in records:
        tp, fp = tp + ok, fp + (not ok)
        points.append((tp / n_gt, tp / (tp + fp)))
    points.append((1.0, 0.0))
    prec = [p for _, p in points]
    for k in range(len(prec) - 2, -1, -1):
        prec[k] = max(prec[k], prec[k + 1])
    return sum((points[k][0] - points[k - 1][0]) * prec[k] for k in range(1, len(points))
               if points[k][0] != points[k - 1][0])


@pytest.mark.parametrize("batch_pairs", [1, 50, 1 << 20])
def test_matches_plain_protocol_on_random_frames(batch_pairs):
    rng = np.random.default_rng(1)
    frames = []
    for f in range(12):
        n_gt, n_pred = int(rng.integers(0, 7)), int(rng.integers(0, 9))
        gt = np.column_stack([rng.uniform(-8, 8, (n_gt, 2)), np.zeros(n_gt),
                              rng.uniform(1.5, 4.5, (n_gt, 2)), np.ones(n_gt),
                              rng.uniform(-3, 3, n_gt)]).reshape(-1, 7)
        pred = np.column_stack([rng.uniform(-8, 8, (n_pred, 2)), np.zeros(n_pred),
                                rng.uniform(1.5, 4.5, (n_pred, 2)), np.ones(n_pred),
                                rng.uniform(-3, 3, n_pred)]).reshape(-1, 7)
        if n_gt:  # half the predictions near a GT box so that all thresholds see TPs
            src = rng.integers(0, n_gt, n_pred // 2)
            pred[: len(src)] = gt[src] + np.concatenate([rng.normal(0, 0.3, (len(src), 2)),
                                                         np.zeros((len(src), 5))], axis=1)
        scores = rng.choice([0.2, 0.4, 0.6, 0.8], n_pred)  # many ties
        frames.append((pred, scores, gt))
    ious = [bev_iou(pred, gt) for pred, _, gt in frames]
    acc = APAccumulator(batch_pairs=batch_pairs)
    for frame in frames:
        acc.add(*frame)
    for global_sort in (True, False):
        res = acc.result(global_sort)
        for thr in (0.3, 0.5, 0.7):
            expect = _plain_ap(frames, ious, thr, global_sort)
            assert res.ap[thr] == pytest.approx(expect, abs=1e-12)
    assert 0 < res.ap[0.7] < res.ap[0.3]


def test_pr_envelope_by_hand_and_monotone():
    # TP FP TP FP with 3 GT at IoU 0.5 (test_single_frame_thresholds_and_duplicate): recall 1/3 1/3 2/3 2/3,
    # precision 1 1/2 2/3 1/2. Best precision at recall >= r: 1 up to 1/3, 2/3 up to 2/3, no points beyond.
    acc = APAccumulator()
    acc.add(boxes(FAR, 0, 10.5, 0), np.array([0.8, 0.9, 0.7, 0.6]), boxes(0, 10, 20))
    res = acc.result(True)
    c = pr_envelope(res, 0.5)
    assert c["recall"] == [round(k / 100, 4) for k in range(67)]  # the grid stops at the highest recall, 2/3
    assert c["precision"] == [1.0] * 34 + [0.6667] * 33
    c7 = pr_envelope(res, 0.7)
    assert c7["recall"][-1] == 0.33 and set(c7["precision"]) == {1.0}
    # on random frames: recall increasing, precision non-increasing, and the grid AP close to the exact one
    rng = np.random.default_rng(3)
    acc = APAccumulator()
    for _ in range(20):
        gt = boxes(*rng.uniform(-30, 30, 5))
        pred = np.concatenate([gt + np.c_[rng.normal(0, 0.4, (5, 1)), np.zeros((5, 6))], boxes(FAR, FAR + 10)])
        acc.add(pred, rng.uniform(0, 1, 7), gt)
    res = acc.result(True)
    for thr in res.thresholds:
        c = pr_envelope(res, thr)
        r, p = np.array(c["recall"]), np.array(c["precision"])
        assert len(r) > 10 and (np.diff(r) > 0).all() and (np.diff(p) <= 0).all() and ((p >= 0) & (p <= 1)).all()
        assert np.mean(np.r_[p, np.zeros(101 - len(p))]) == pytest.approx(res.ap[thr], abs=0.02)
    empty = APAccumulator()
    empty.add(np.zeros((0, 7)), np.zeros(0), boxes(0))
    assert pr_envelope(empty.result(True), 0.5) == {"recall": [], "precision": []}
