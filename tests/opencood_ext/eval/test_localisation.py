"""Box precision of found objects, by visibility group (the figures behind AP@0.7)."""
import numpy as np
import pytest

from opencood_ext.eval.localisation import LocalisationStats, format_localisation

GT = np.array([[0, 0, -1, 4, 2, 1.5, 0.0],
               [20, 0, -1, 4, 2, 1.5, 0.0],
               [-20, 5, -1, 4, 2, 1.5, 1.0]], dtype=np.float64)


def test_errors_are_measured_per_found_object_and_group():
    pred = np.array([[0.5, 0, -1, 4, 2, 1.5, 0.0],            # GT 0: 0.5 m off along its length
                     [20, 0, -1, 4, 2, 1.5, np.radians(10)],  # GT 1: 10 deg yaw error
                     [20, 0.1, -1, 4.5, 2, 1.5, np.pi]])      # a worse box of GT 1 (flipped heading)
    stats = LocalisationStats()
    stats.add(np.array([0, 1, 2]), pred, GT)
    s = stats.summary()
    assert (s["all"]["gt"], s["all"]["found"]) == (3, 2)         # GT 2 has no box near it
    assert s["ego"]["found"] == 1 and s["ego"]["median_centre_m"] == pytest.approx(0.5)
    assert s["ego"]["mean_iou"] == pytest.approx(3.5 / 4.5, abs=1e-3)  # 3.5 x 2 overlap / 4.5 x 2 union
    assert s["collaborators_only"]["median_yaw_deg"] == pytest.approx(10.0, abs=1e-3)
    assert s["collaborators_only"]["median_centre_m"] == pytest.approx(0.0)
    assert s["nobody"]["found"] == 0 and s["nobody"]["mean_iou"] is None
    assert s["all"]["share_iou_0.7"] == pytest.approx(1.0)        # 0.778 and 0.8: both above 0.7
    text = format_localisation(s)
    assert "ego: found 1 of 1" in text and "nobody" not in text


def test_heading_flip_is_not_a_yaw_error_and_without_groups_only_all_counts():
    stats = LocalisationStats()
    stats.add(None, GT[:1] + [0, 0, 0, 0, 0, 0, np.pi], GT[:1])
    s = stats.summary()
    assert s["all"]["found"] == 1 and s["all"]["median_yaw_deg"] == pytest.approx(0.0, abs=1e-6)
    assert s["all"]["mean_iou"] == pytest.approx(1.0, abs=1e-4)
    assert s["ego"]["gt"] == 0


def test_no_detections_and_bad_groups():
    stats = LocalisationStats()
    stats.add(np.array([0, 0, 1]), np.zeros((0, 7)), GT)
    assert stats.summary()["all"] == {"gt": 3, "found": 0, "mean_iou": None, "share_iou_0.7": None,
                                      "median_centre_m": None, "median_length_m": None,
                                      "median_width_m": None, "median_yaw_deg": None}
    with pytest.raises(ValueError, match="2 visibility groups for 3 GT boxes"):
        stats.add(np.array([0, 1]), GT, GT)
