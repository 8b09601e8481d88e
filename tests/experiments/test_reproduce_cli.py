"""gencomm-reproduce's options (tools/reproduce.py from a checkout) reach experiments.reproduce.reproduce;
bad values fail before any step runs, with one line and exit status 2."""
import importlib.util
from pathlib import Path

import pytest

from experiments import reproduce, steps

ROOT = Path(__file__).resolve().parents[2]


def _cli():
    """tools/reproduce.py, the checkout's wrapper: its main is experiments.reproduce.main."""
    spec = importlib.util.spec_from_file_location("reproduce_cli", ROOT / "tools" / "reproduce.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main is reproduce.main
    return mod


def test_test_scenes_option_reaches_the_main_job(tmp_path, monkeypatch):
    seen = {}

    def fake(out, data, profile, seed, seeds, **kw):
        seen.update(kw, profile=profile)
        (out / "REPORT.md").parent.mkdir(parents=True, exist_ok=True)
        (out / "REPORT.md").write_text("report")
        return out / "REPORT.md"
    monkeypatch.setattr(reproduce, "reproduce", fake)
    assert _cli().main(["--out", str(tmp_path), "--test_scenes", "0", "--no_benchmark"]) == 0
    assert seen["test_scenes"] == 0 and seen["profile"] == "default" and seen["benchmark"] is False
    assert _cli().main(["--out", str(tmp_path)]) == 0 and seen["test_scenes"] is None  # the profile's


def test_negative_test_scenes_fail_before_anything_is_written(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(steps, "call", ran.append)
    with pytest.raises(ValueError, match="test_scenes must be >= 0"):
        reproduce.reproduce(tmp_path / "out", tmp_path / "data", test_scenes=-1)
    assert ran == [] and not (tmp_path / "out").exists()


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(steps, "call", ran.append)
    assert reproduce.main(["--out", str(tmp_path / "out"), "--test_scenes", "-1"]) == 2
    assert reproduce.main(["--out", str(tmp_path / "out"), "--configs", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: gencomm-reproduce: test_scenes must be >= 0, got -1",
                   f"error: gencomm-reproduce: --configs {tmp_path / 'none'}: no such folder"]
    assert ran == []


def test_out_and_data_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    seen = {}

    def fake(out, data, profile, seed, seeds, **kw):
        seen.update(out=out, data=data, configs=kw["configs"], command=kw["command"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "REPORT.md").write_text("report")
        return out / "REPORT.md"
    monkeypatch.setattr(reproduce, "reproduce", fake)
    monkeypatch.chdir(tmp_path)
    assert reproduce.main(["--quick", "--out", "o", "--data", "d", "--configs", "c"]) == 0
    assert seen["out"] == tmp_path / "o" and seen["data"] == tmp_path / "d" and seen["configs"] == Path("c")
    assert seen["command"] == "gencomm-reproduce --quick --out o --data d --configs c"


@pytest.mark.parametrize("seeds, message", [("x", "expected integers separated by commas"),
                                            ("0,0", "distinct integers >= 0"), ("1,-2", "distinct integers >= 0")])
def test_bad_seeds_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, seeds, message):
    monkeypatch.setattr(reproduce, "reproduce", lambda *a, **kw: pytest.fail("the main job must not start"))
    with pytest.raises(SystemExit) as exit_:
        _cli().main(["--out", str(tmp_path), "--seeds", seeds])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


def test_seeds_reach_the_main_job(tmp_path, monkeypatch):
    seen = {}

    def fake(out, data, profile, seed, seeds, **kw):
        seen["seeds"] = seeds
        (out / "REPORT.md").parent.mkdir(parents=True, exist_ok=True)
        (out / "REPORT.md").write_text("report")
        return out / "REPORT.md"
    monkeypatch.setattr(reproduce, "reproduce", fake)
    assert _cli().main(["--out", str(tmp_path), "--seeds", "0,1,2"]) == 0 and seen["seeds"] == [0, 1, 2]


def test_the_default_is_the_lidar_pair_and_benchmark_is_one_flag_away(tmp_path, monkeypatch):
    """Issue 51: the default main job is the LiDAR pair's main table; --benchmark (or naming an alliance)
    adds the onboarding study; --jobs reaches the job."""
    from experiments.profiles import PROFILES
    assert PROFILES["default"].benchmark is False and PROFILES["paper"].benchmark is True
    seen = {}

    def fake(out, data, profile, seed, seeds, **kw):
        seen.clear()
        seen.update(kw)
        out.mkdir(parents=True, exist_ok=True)
        (out / "REPORT.md").write_text("report")
        return out / "REPORT.md"
    monkeypatch.setattr(reproduce, "reproduce", fake)
    cli = _cli()
    assert cli.main(["--out", str(tmp_path)]) == 0 and seen["benchmark"] is None and seen["jobs"] is None
    assert cli.main(["--out", str(tmp_path), "--benchmark", "--jobs", "1"]) == 0
    assert seen["benchmark"] is True and seen["jobs"] == 1
    assert cli.main(["--out", str(tmp_path), "--benchmark_types", "m1,m3"]) == 0
    assert seen["benchmark"] is None and seen["benchmark_types"] == ["m1", "m3"]


def test_naming_an_alliance_turns_the_benchmark_on_unless_refused(tmp_path, monkeypatch):
    """What reproduce makes of benchmark / benchmark_types before anything runs: the profile one_seed gets."""
    import experiments.pipeline as pipeline
    got = []

    class Stop(Exception):
        pass

    def fake_seed(out, runs, data, profile, *a, **kw):
        got.append((profile.benchmark, profile.benchmark_types, kw["plan"]))
        raise Stop
    monkeypatch.setattr(reproduce, "simulate", lambda *a: None)  # no simulation
    monkeypatch.setattr(reproduce, "simulate_test_set", lambda *a: None)
    monkeypatch.setattr(reproduce, "one_seed", fake_seed)
    for kw in ({}, {"benchmark": True}, {"benchmark_types": ["m1", "m3"]},
               {"benchmark_types": ["m1", "m3"], "benchmark": False, "jobs": 1}):
        with pytest.raises(Stop):
            reproduce.reproduce(tmp_path / "out", tmp_path / "data", **kw)
    assert [(b, t) for b, t, _ in got] == [(False, ("m1", "m2", "m3", "m4")), (True, ("m1", "m2", "m3", "m4")),
                                         (True, ("m1", "m3")), (False, ("m1", "m3"))]
    assert got[-1][2].lanes == 1
    assert pipeline.one_seed is not fake_seed


def test_a_profile_simulating_the_defaults_data_shares_its_folder():
    """``full`` differs from ``default`` in budget only, so it reads data/sim rather than simulating again."""
    from pathlib import Path
    from experiments.profiles import default_data_dir
    assert default_data_dir("default") == default_data_dir("full") == Path("data/sim")
    assert default_data_dir("quick") == Path("data/sim_quick") and default_data_dir("paper") == Path("data/sim_paper")
