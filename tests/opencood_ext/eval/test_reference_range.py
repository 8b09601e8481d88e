"""gencomm-infer --range X,Y (the reference inference script's option): the detection area
x in [-X, X], y in [-Y, Y] with the config's z bounds, for the LiDAR crop, grid, anchors, ground
truth and predictions alike; the reference's default under protocol reference, nothing under native."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.data.formats import OPV2VReader
from opencood_ext.data.ground_truth import frame_ground_truth
from opencood_ext.eval.detection_range import (REFERENCE_DEFAULT_RANGE, evaluation_range, parse_range,
                                               range_override)
from opencood_ext.experiment import build_dataset, load_experiment
from opencood_ext.geometry import boxes_inside_range
from opencood_ext.runs import load_run
from tiny_runs import PP, tiny_config, tiny_dataset

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import inference  # noqa: E402
import train  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_parse_range():
    assert parse_range("102.4,51.2") == (102.4, 51.2) and parse_range(" 16, 8 ") == (16.0, 8.0)
    assert parse_range(None) is None
    for bad in ("102.4", "a,b", "-1,2", "0,5", "nan,1", "1,2,3"):
        with pytest.raises(ValueError, match="--range takes X,Y"):
            parse_range(bad)


def test_evaluation_range_defaults():
    r = (-51.2, -51.2, -3.5, 51.2, 51.2, 1.5)
    assert evaluation_range("native", "opv2v", r, None) is None  # native: the config's range
    assert evaluation_range("native", "opv2v", r, (16.0, 8.0)) == (-16.0, -8.0, -3.5, 16.0, 8.0, 1.5)
    for fmt in ("opv2v", "dairv2x", "v2xreal"):  # the reference scripts' default, z kept
        assert REFERENCE_DEFAULT_RANGE[fmt] == (102.4, 51.2)
        assert evaluation_range("reference", fmt, r, None) == (-102.4, -51.2, -3.5, 102.4, 51.2, 1.5)
    assert evaluation_range("reference", "opv2v", (-102.4, -51.2, -3, 102.4, 51.2, 1), None) is None
    assert evaluation_range("reference", "opv2v", r, (20.0, 10.0)) == (-20.0, -10.0, -3.5, 20.0, 10.0, 1.5)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("range")
    data = tiny_dataset(tmp / "data")
    cfg = tiny_config(tmp, data, "rng", {"m1": PP}, {"fusion": "intermediate", "link": {"type": "full_feature"}})
    out = tmp / "run"
    assert train.main(["-y", str(cfg), "--model_dir", str(out), "--set", "train.max_steps_per_epoch=1"]) == 0
    return data, out


def _gt_count(data, area):
    """Ground truth of the test frames inside ``area``, the ego being the first agent (the rule
    stated again: every agent's labels, all 8 corners inside)."""
    n = 0
    for frame in OPV2VReader(data, "test", load_cameras=False):
        gt = frame_ground_truth(frame, frame.agents[0].T_world_from_lidar)
        n += int(boxes_inside_range(gt.boxes, area).sum()) if len(gt) else 0
    return n


def test_range_filters_ground_truth_and_predictions(run, capsys):
    data, out = run
    area = (-16.0, -8.0, -3.0, 16.0, 8.0, 1.0)
    assert inference.main(["--model_dir", str(out), "--range", "16,8", "--label", "r16", "--plot_every", "0"]) == 0
    assert "detection range [-16.0, -8.0, -3.0, 16.0, 8.0, 1.0] (--range" in capsys.readouterr().out
    ranged = json.loads((out / "eval_r16.json").read_text())
    assert ranged["num_gt"] == _gt_count(data, area) > 0
    stamp = json.loads((out / "eval_r16.inputs.json").read_text())
    assert range_override(area) in json.dumps(stamp)  # the evaluation's stamp records the area
    assert inference.main(["--model_dir", str(out), "--label", "full", "--plot_every", "0"]) == 0
    full = json.loads((out / "eval_full.json").read_text())
    assert full["num_gt"] == _gt_count(data, (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)) > ranged["num_gt"]
    # what the command builds: the model on the smaller grid, every prediction inside the area
    # (a low score threshold, so the untrained model predicts boxes everywhere)
    inside, outside = _predictions(out, [range_override(area)], area), _predictions(out, [], area)
    assert inside[0] > 0 and inside[1] == 0 and outside[1] > 0


def _predictions(out, overrides, area):
    """-> (boxes inside ``area``, boxes outside it) the run predicts on its first test frame."""
    from opencood_ext.comm.channel import ChannelConfig
    from opencood_ext.data.batch import collate_samples
    cfg, model = load_run(out, [*overrides, "model.score_threshold=0.01"])
    batch = collate_samples([build_dataset(cfg, "test", train=False, fusion=model.fusion)[0]])
    boxes = model.predict(batch, channel=ChannelConfig(), keys=lambda b: (0,)).detections[0].boxes
    keep = boxes_inside_range(boxes, area)
    return int(keep.sum()), int((~keep).sum())


def test_native_run_keeps_its_range(run):
    _, out = run
    cfg = load_experiment(out / "config.yaml")
    assert evaluation_range(cfg.protocol, cfg.data.format, cfg.data.lidar_range, None) is None
    ref = load_experiment(out / "config.yaml", ["protocol=reference"])
    assert evaluation_range(ref.protocol, ref.data.format, ref.data.lidar_range, None) == \
        (-102.4, -51.2, -3.0, 102.4, 51.2, 1.0)
    np.testing.assert_allclose(
        load_experiment(out / "config.yaml", [range_override((-1.6, -2.4, -3.0, 1.6, 2.4, 1.0))]).data.lidar_range,
        (-1.6, -2.4, -3.0, 1.6, 2.4, 1.0))  # a whole number of the run's 0.8 m voxels (checked at load)


def test_reference_protocol_evaluates_at_the_reference_default(run, capsys):
    _, out = run
    assert inference.main(["--model_dir", str(out), "--set", "protocol=reference", "--label", "ref",
                           "--plot_every", "0", "--max_frames", "1"]) == 0
    assert "detection range [-102.4, -51.2, -3.0, 102.4, 51.2, 1.0] (protocol reference: the reference's default" \
        in capsys.readouterr().out
    stamp = json.loads((out / "eval_ref.inputs.json").read_text())
    assert range_override((-102.4, -51.2, -3.0, 102.4, 51.2, 1.0)) in json.dumps(stamp)


def test_build_dataset_follows_the_protocol(run):
    _, out = run
    assert build_dataset(load_experiment(out / "config.yaml"), "test", train=False).protocol == "native"
    ref = load_experiment(out / "config.yaml", ["protocol=reference"])
    assert build_dataset(ref, "test", train=False).protocol == "reference"


def test_the_robustness_sweep_evaluates_a_reference_run_at_the_reference_default(run, tmp_path):
    """gencomm-robustness applies the same default range as gencomm-infer, so under protocol reference
    its evaluations are the reference's (and their stamps record the area)."""
    from opencood_ext.cli import robustness
    _, out = run
    assert robustness.main(["--runs", f"ref={out}", "--sweep", "drop", "--drop", "0", "-o", str(tmp_path / "rob"),
                            "--max_frames", "1", "--no_progress", "--set", "protocol=reference"]) == 0
    stamps = sorted(out.glob("eval_*.inputs.json"))
    area = range_override((-102.4, -51.2, -3.0, 102.4, 51.2, 1.0))
    swept = [json.loads(p.read_text()) for p in stamps if "drop" in p.name or "none" in p.name]
    assert swept and all(area in json.dumps(s) for s in swept)


def test_eval_range_in_the_config_wins_over_the_reference_default(run, capsys):
    """``eval.range`` (the sim configs set their own area) keeps a reference-protocol evaluation on the
    config's area; --range still overrides it; a malformed value is refused naming the key."""
    _, out = run
    assert inference.main(["--model_dir", str(out), "--set", "protocol=reference", "--set", "eval.range=[32, 32]",
                           "--label", "own", "--plot_every", "0", "--max_frames", "1"]) == 0
    assert "detection range" not in capsys.readouterr().out  # [32, 32] is the run's own area: nothing changes
    assert "102.4" not in (out / "eval_own.inputs.json").read_text()  # not the reference script's default
    assert inference.main(["--model_dir", str(out), "--set", "protocol=reference", "--set", "eval.range=[16, 8]",
                           "--label", "cfg16", "--plot_every", "0", "--max_frames", "1"]) == 0
    assert "detection range [-16.0, -8.0, -3.0, 16.0, 8.0, 1.0] (eval.range" in capsys.readouterr().out
    for bad in ("[16]", "[0, 8]", "[-16, 8]"):
        with pytest.raises(ValueError, match="eval.range: expected \\[X, Y\\]"):
            load_experiment(out / "config.yaml", [f"eval.range={bad}"])
    sim = load_experiment(ROOT / "configs" / "sim" / "gencomm_stage1_m1.yaml", ["protocol=reference"])
    xy = sim.eval.range
    assert evaluation_range(sim.protocol, sim.data.format, sim.data.lidar_range, tuple(xy)) is None  # its own 80 m

