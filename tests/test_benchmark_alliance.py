"""The heterogeneous benchmark on a chosen alliance (``tools/reproduce.py --benchmark_types``):
every method has a stage-2 config per alliance built from the same method fragment, a missing
alliance fails before anything trains, and the report names the alliance that ran."""
import dataclasses

import pytest

import gencomm  # noqa: F401  (registers GenComm's link and onboarding)
from gencomm.benchmark import METHODS, run_benchmark, stage2_config
from opencood_ext.experiment import load_experiment

ALLIANCES = [("m1", "m3"), ("m1", "m2", "m3", "m4")]


@pytest.mark.parametrize("method", [m for _, m in METHODS])
@pytest.mark.parametrize("types", ALLIANCES)
def test_every_method_has_a_config_per_alliance(method, types):
    cfg = load_experiment(stage2_config("sim", method, types))
    assert set(cfg.model["agent_types"]) == set(types)
    assert list(cfg.stage.new_types) == list(types[1:]) and cfg.stage.method == method
    assert cfg.data.modality == "cycle:" + ",".join(types)
    if method == "mpda":
        assert cfg.model["link"]["adapted_types"] == list(types[1:])


@pytest.mark.parametrize("method", [m for _, m in METHODS])
def test_alliances_share_the_method_part(method):
    """Schedule and link come from one fragment (configs/sim/stage2/methods/), not per-alliance copies."""
    small, full = (load_experiment(stage2_config("sim", method, t)) for t in ALLIANCES)
    assert dataclasses.asdict(small.train) == dataclasses.asdict(full.train)
    strip = lambda link: {k: v for k, v in (link or {}).items() if k != "adapted_types"}  # noqa: E731
    assert strip(small.model.get("link")) == strip(full.model.get("link"))
    assert small.model.get("fusion") == full.model.get("fusion")


def test_main_table_onboarding_is_the_benchmark_gencomm_run_on_the_lidar_pair():
    from gencomm.reproduce import STAGE2
    assert STAGE2 == stage2_config("sim", "gencomm", ("m1", "m3"))


def test_missing_alliance_fails_before_any_command(tmp_path):
    ran = []
    with pytest.raises(FileNotFoundError, match=r"gencomm_m1_m2\.yaml.*m1, m2"):
        run_benchmark(tmp_path, {"m1": tmp_path, "m2": tmp_path}, "sim", ran.append, "python", [],
                      types=("m1", "m2"))
    assert ran == []


def test_report_names_the_alliance_that_ran(tmp_path):
    from gencomm.report_hetero import hetero_section
    ev = {"ap": {"global": {"0.3": 0.8, "0.5": 0.7, "0.7": 0.3}, "per_frame": {"0.3": 0.8, "0.5": 0.7, "0.7": 0.3}},
          "bytes_per_message": 100.0}
    rows = [{"method": name, "table": "heterogeneous", "eval": ev, "trainable_params": p, "train_wall_s": 1.0,
             "dynamic": [dict(ev, types=["m1"]), dict(ev, types=["m1", "m3"], onboard_params=p, onboard_gflops=1.0)]}
            for name, p in (("GenComm (m3 onboarded)", 100), ("STAMP (m3 onboarded)", 1000))]
    text = "\n".join(hetero_section(rows, tmp_path))
    assert "## Heterogeneous benchmark: m3 joins m1's alliance" in text
    assert "m1 PointPillars 64-beam, m3 SECOND 32-beam (the first is the ego)" in text
    assert "| method | {m1} | +m3 |" in text and "m2" not in text
