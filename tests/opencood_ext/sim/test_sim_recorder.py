"""Agent-type config, the recorder and tools/simulate.py: OPV2V-H layout read back
by OPV2VReader, byte-identical reruns, skipping finished scenarios."""
import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.sim.agent_types import DEFAULT_PATH, AgentTypesConfig, load_agent_types
from opencood_ext.sim.recorder import MARKER_DIR, MODALITY_JSON, scenario_seed, split_plan
from opencood_ext.config import ConfigError
from opencood_ext.data.formats import OPV2VReader

REPO = Path(__file__).resolve().parents[3]
TINY = ["--scenarios", "2", "--frames", "2", "--seed", "11", "--camera_size", "64x48", "--vehicles", "20", "21",
        "--points_per_second", "260000", "--raster_res", "0.5", "--split_ratio", "1", "1", "0", "--quiet"]


def _simulate():
    spec = importlib.util.spec_from_file_location("simulate_tool", REPO / "tools" / "simulate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hashes(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_agent_types_yaml_matches_schema_defaults_and_rejects_bad_input(tmp_path):
    assert load_agent_types(DEFAULT_PATH) == AgentTypesConfig()
    cfg = AgentTypesConfig()
    assert cfg.variant_keep() == {32: 2, 16: 4}
    assert cfg.assign([9, -1, 3, 5, 12], np.random.default_rng(0)) == {3: "m1", 5: "m2", 9: "m3", 12: "m4", -1: "m1"}
    bad = tmp_path / "types.yaml"
    bad.write_text("lidar: {chanels: 32}\n")
    with pytest.raises(ConfigError, match="lidar.chanels.*did you mean 'channels'") as err:
        load_agent_types(bad)
    assert str(bad) in str(err.value)
    bad.write_text("types: {m3: {sensor: lidar, beams: 24}}\n")
    with pytest.raises(ConfigError, match="beams=24"):
        load_agent_types(bad)
    bad.write_text("types: {m2: {sensor: radar}}\n")
    with pytest.raises(ConfigError, match="must be one of"):
        load_agent_types(bad)


def test_split_plan_and_scenario_seeds():
    assert split_plan(1, (0.6, 0.2, 0.2)) == ["train"]
    assert split_plan(5, (0.6, 0.2, 0.2)) == ["train"] * 3 + ["validate", "test"]
    assert split_plan(3, (0.6, 0.2, 0.2)) == ["train", "train", "validate"]
    with pytest.raises(ValueError, match="split_ratio"):
        split_plan(3, (1.0, -1.0, 0.0))
    seeds = {scenario_seed(0, k) for k in range(50)}
    assert len(seeds) == 50 and scenario_seed(0, 3) == scenario_seed(0, 3) != scenario_seed(1, 3)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    a, b = root / "a", root / "b"
    tool = _simulate()
    assert tool.main(["-o", str(a)] + TINY) == 0
    assert tool.main(["-o", str(b)] + TINY) == 0
    return a, b, tool


def test_same_seed_gives_byte_identical_dataset(recorded):
    a, b, _ = recorded
    ha, hb = _hashes(a), _hashes(b)
    assert ha == hb and len(ha) > 100
    names = set(ha)
    assert any(n.endswith("_32.pcd") for n in names) and any(n.endswith("_16.pcd") for n in names)
    assert any(n.endswith("_camera3.png") for n in names) and any(n.endswith("_depth0.png") for n in names)
    assert any(n.endswith("data_protocol.yaml") for n in names) and MODALITY_JSON in names


def test_dataset_reads_back_through_opv2v_reader(recorded):
    a, _, _ = recorded
    table = json.loads((a / MODALITY_JSON).read_text())
    assert len(table) == 2
    for split in ("train", "validate"):
        reader = OPV2VReader(a, split, modality=a / MODALITY_JSON)
        assert len(reader) == 2
        f = reader[0]
        assert 2 <= len(f.agents) <= 6 and f.objects
        for ag in f.agents:
            assert ag.agent_type == table[f.scenario][str(ag.agent_id)]
            assert set(ag.lidar_beams) == {32, 16} and len(ag.lidar_beams[16]) < len(ag.lidar_beams[32]) < len(ag.lidar)
            assert len(ag.cameras) == 4 and ag.cameras[2].image.shape == (48, 64, 3)
            assert ag.cameras[0].depth.shape == (48, 64) and ag.cameras[0].K[0, 0] == pytest.approx(64 / 800 * 335.64,
                                                                                                    abs=0.01)
            # intensity: CARLA's exp(-0.004 d), mildly modulated by incidence and material
            carla = np.exp(-0.004 * np.linalg.norm(ag.lidar[:, :3], axis=1))
            assert (ag.lidar[:, 3] <= carla + 1.5 / 255).all()
            assert np.median(ag.lidar[:, 3] / carla) > 0.75
    assert not (a / "test").exists()


def test_rerun_skips_finished_and_redoes_interrupted_scenarios(recorded, capsys):
    a, _, tool = recorded
    before = _hashes(a)
    mtimes = {p: p.stat().st_mtime_ns for p in a.rglob("*.pcd")}
    assert tool.main(["-o", str(a)] + TINY) == 0
    out = capsys.readouterr().out
    assert "recorded 0 scenario(s), skipped 2" in out
    assert out.rstrip().endswith("train 1, validate 1 scenarios")  # counts, not every scenario's name
    assert all(p.stat().st_mtime_ns == t for p, t in mtimes.items())
    # an interrupted scenario: marker missing, a stray file left behind
    (a / MARKER_DIR / "scenario_0001.json").unlink()
    scen = next((a / "validate").iterdir())
    (scen / "stray.txt").write_text("half-written")
    assert tool.main(["-o", str(a)] + TINY) == 0
    assert "recorded 1 scenario(s), skipped 1" in capsys.readouterr().out
    assert _hashes(a) == before


def test_inspect_data_plots_the_simulated_dataset(recorded, tmp_path):
    a, _, _ = recorded
    tool = REPO / "tools" / "inspect_data.py"
    if not tool.exists():
        pytest.fail("tools/inspect_data.py is missing")
    out = tmp_path / "bev.png"
    res = subprocess.run([sys.executable, str(tool), str(a), "--format", "opv2v", "--split", "train",
                          "--plot", str(out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert out.stat().st_size > 10000 and "ground truth" in res.stdout


def test_backend_neutral_entry_points(tmp_path):
    """What other backends and tools use: per-type rigs as a mapping, keyword
    overrides of the world config, record_world into one split."""
    from opencood_ext.sim.builtin import BuiltinWorld
    from opencood_ext.sim.recorder import record_world

    from sim_common import small_config

    types = AgentTypesConfig()
    rigs = dict(types)
    assert list(rigs) == ["m1", "m2", "m3", "m4"] and rigs["m3"].beams == 32 and rigs["m2"].sensor == "camera"
    assert rigs["m1"].lidar.channels == 64 and rigs["m1"].lidar_variants == {32: 2, 16: 4}
    assert [c.name for c in rigs["m4"].cameras] == ["camera0", "camera1", "camera2", "camera3"]
    with pytest.raises(KeyError, match="unknown agent type 'm9'"):
        types["m9"]
    world = BuiltinWorld(small_config(rsu_probability=0.0), agent_types=types, num_agents=3, cameras=False)
    assert world.cfg.agents.count == (3, 3) and not world.cfg.cameras
    paths = record_world(world, tmp_path, split="test", frames=2, scenarios=1, seed=1, progress=False)
    assert len(paths) == 2 and all(p.exists() and "/test/" in str(p) for p in paths)
    assert len(world.agents) == 3
    with pytest.raises(ValueError, match="split must be one of"):
        record_world(world, tmp_path, split="val")


def test_camera_type_sample_builds_from_the_simulated_dataset_without_warnings(recorded):
    """An m2 (LSS camera) training sample from the simulator's images: normalised image tensors of the
    type's size, and no torch warning about read-only decoded images (it printed on every camera run)."""
    import warnings
    from opencood_ext.experiment import build_dataset, load_experiment
    a, _, _ = recorded
    cfg = load_experiment(REPO / "configs" / "sim" / "gencomm_stage1_m2.yaml", [f"data.root={a}"])
    ds = build_dataset(cfg, "train", train=False, fusion="intermediate")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sample = ds[0]
    agent = sample.agents[0]
    assert agent.agent_type == "m2"
    assert agent.images.shape == (4, 3, 192, 256) and agent.images.dtype == np.float32
    assert np.isfinite(agent.images).all() and agent.depth.shape == (4, 192, 256)


CAMERA_FILES = ("_camera", "_depth")


def _lidar_view(root: Path) -> dict:
    """What a LiDAR-only run reads of a dataset: every scan's digest and every frame yaml without
    its camera entries (the yaml's ``camera<i>`` keys, the camera images and the camera agents'
    visibility masks are all that a recording with cameras adds)."""
    import yaml
    view = {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.pcd"))}
    for p in sorted(root.rglob("*.yaml")):
        if p.name != "data_protocol.yaml":
            view[str(p.relative_to(root))] = {k: v for k, v in yaml.safe_load(p.read_text()).items()
                                              if not k.startswith("camera")}
    return view


def test_a_recording_with_cameras_serves_a_run_without_them_and_gains_them_back(recorded, tmp_path, capsys):
    """Several runs share a dataset folder (every protocol of the main job shares its test set, and a
    LiDAR-only run asks for no cameras): a LiDAR-only rerun must keep the camera images, and adding
    cameras to a LiDAR-only folder must leave its LiDAR files as they were."""
    import shutil
    a, _, tool = recorded
    shared = tmp_path / "shared"
    shutil.copytree(a, shared)
    before = _hashes(shared)
    capsys.readouterr()
    assert tool.main(["-o", str(shared), "--no_cameras"] + TINY) == 0
    assert "recorded 0 scenario(s), skipped 2" in capsys.readouterr().out
    assert _hashes(shared) == before   # nothing rewritten, the cameras kept

    lidar_only = tmp_path / "lidar_only"
    assert tool.main(["-o", str(lidar_only), "--no_cameras"] + TINY) == 0
    assert not any(c in k for k in _hashes(lidar_only) for c in CAMERA_FILES)
    assert _lidar_view(lidar_only) == _lidar_view(shared)   # the LiDAR and labels do not depend on the cameras
    capsys.readouterr()
    assert tool.main(["-o", str(lidar_only)] + TINY) == 0
    assert "recorded 2 scenario(s), skipped 0" in capsys.readouterr().out
    assert _hashes(lidar_only) == before   # now the same as recorded with cameras


def test_a_folder_recorded_with_other_settings_is_refused_unless_overwrite(recorded, tmp_path, capsys):
    import shutil
    a, _, tool = recorded
    shared = tmp_path / "shared"
    shutil.copytree(a, shared)
    before = _hashes(shared)
    other_seed = [x if x != "11" else "12" for x in TINY]
    capsys.readouterr()
    assert tool.main(["-o", str(shared)] + other_seed) == 2
    err = capsys.readouterr().err
    assert "2 finished scenario(s) were recorded with other settings" in err
    assert f"{MARKER_DIR}/scenario_0000.json" in err and "--overwrite" in err
    assert _hashes(shared) == before   # refused before anything was written
    other_family = TINY + ["--family", "road"]
    assert tool.main(["-o", str(shared)] + other_family) == 2
    assert "layout: recorded 'junction', asked 'road'" in capsys.readouterr().err
    assert _hashes(shared) == before
    assert tool.main(["-o", str(shared), "--overwrite"] + other_family) == 0
    assert "recorded 2 scenario(s), skipped 0" in capsys.readouterr().out
    assert _hashes(shared) != before
    assert tool.main(["-o", str(shared)] + other_family) == 0   # and that recording is now the finished one
    assert "recorded 0 scenario(s), skipped 2" in capsys.readouterr().out


def test_a_second_recorder_of_a_folder_waits_for_the_first(recorded, tmp_path, capsys):
    """Two jobs sharing a dataset start the simulator at the same time: the second waits on the
    folder's lock (saying who holds it), then finds the scenarios finished."""
    import shutil
    import threading
    import time
    from opencood_ext.sim.recorder import _folder_lock
    a, _, tool = recorded
    shared = tmp_path / "shared"
    shutil.copytree(a, shared)
    rc = []
    with _folder_lock(shared):
        assert (shared / MARKER_DIR / "lock").read_text().startswith("pid ")
        second = threading.Thread(target=lambda: rc.append(tool.main(["-o", str(shared)] + TINY)))
        second.start()
        for _ in range(600):   # until the second recorder says it waits (or 60 s)
            if "is recording into this folder; waiting" in capsys.readouterr().out:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the second recorder did not report waiting for the lock")
        assert second.is_alive() and rc == []   # it cannot go on while the lock is held
    second.join(timeout=300)
    assert rc == [0] and "recorded 0 scenario(s), skipped 2" in capsys.readouterr().out


def test_an_interrupted_rerecording_is_not_taken_for_the_earlier_recording(recorded, tmp_path, monkeypatch, capsys):
    """--overwrite (or cameras added) deletes a finished scenario's files before writing new ones; if
    that run dies half-way, the old marker must be gone too, so the next run records it again."""
    import shutil
    from opencood_ext.sim import recorder
    a, _, tool = recorded
    shared = tmp_path / "shared"
    shutil.copytree(a, shared)
    before = _hashes(shared)
    real_write = recorder.write_opv2v_frame
    calls = []

    def dies_on_second_frame(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return real_write(*args, **kw)

    monkeypatch.setattr(recorder, "write_opv2v_frame", dies_on_second_frame)
    with pytest.raises(RuntimeError, match="killed"):
        tool.main(["-o", str(shared), "--overwrite", "--no_shadows", "--workers", "1"] + TINY)
    assert not (shared / MARKER_DIR / "scenario_0000.json").exists()
    monkeypatch.setattr(recorder, "write_opv2v_frame", real_write)
    capsys.readouterr()
    assert tool.main(["-o", str(shared), "--workers", "1"] + TINY) == 0
    assert "recorded 1 scenario(s), skipped 1" in capsys.readouterr().out
    assert _hashes(shared) == before


def test_a_run_asking_fewer_scenarios_keeps_the_others_in_the_modality_table(recorded, tmp_path, capsys):
    """A run for fewer scenarios than the folder holds (e.g. a smaller --test_scenes into a shared test
    set) skips those it asks for; the others stay on disk and so stay in modality_assignment.json."""
    import shutil
    a, _, tool = recorded
    shared = tmp_path / "shared"
    shutil.copytree(a, shared)
    before = _hashes(shared)
    table = json.loads((shared / MODALITY_JSON).read_text())
    fewer = [x if x != "2" or i != 1 else "1" for i, x in enumerate(TINY)]
    assert fewer[:2] == ["--scenarios", "1"]
    capsys.readouterr()
    assert tool.main(["-o", str(shared)] + fewer) == 0
    assert "recorded 0 scenario(s), skipped 1" in capsys.readouterr().out
    assert json.loads((shared / MODALITY_JSON).read_text()) == table and len(table) == 2
    assert _hashes(shared) == before
    gone = next((shared / "validate").iterdir())
    shutil.rmtree(gone)   # a scenario whose folder was deleted leaves the table
    assert tool.main(["-o", str(shared)] + fewer) == 0
    assert set(json.loads((shared / MODALITY_JSON).read_text())) == set(table) - {gone.name}
    (shared / MODALITY_JSON).write_text("{not json")
    assert tool.main(["-o", str(shared)] + fewer) == 2
    assert f"{shared / MODALITY_JSON}: not valid JSON" in capsys.readouterr().err


def test_frame_interval_spaces_the_saved_frames_and_is_part_of_the_recording(recorded, tmp_path, capsys):
    """--frame_interval 1.0 saves a frame every 20 physics ticks (0.05 s each), where the default saves
    one every 2; the interval is in each marker and data_protocol.yaml, so a folder recorded at another
    interval is refused rather than mixed; a default recording's markers do not name it (recordings made
    before the option stay reusable); an interval that is not a multiple of the tick is refused."""
    import yaml
    a, _, tool = recorded
    spaced = tmp_path / "spaced"
    assert tool.main(["-o", str(spaced), "--frame_interval", "1.0"] + TINY) == 0

    def stamps(root):
        out = {}
        for scen in sorted((root / "train").iterdir()):
            ego = sorted((p for p in scen.iterdir() if p.is_dir()), key=lambda p: int(p.name))[0]
            out[scen.name] = sorted(int(p.stem) for p in ego.glob("*.yaml"))
        return out

    for ticks in stamps(spaced).values():
        assert np.diff(ticks).tolist() == [20]
    for ticks in stamps(a).values():
        assert np.diff(ticks).tolist() == [2]
    assert stamps(spaced).keys() == stamps(a).keys()   # the same scenarios, only the spacing differs
    marker = json.loads((spaced / MARKER_DIR / "scenario_0000.json").read_text())
    assert marker["run"]["frame_interval"] == 1.0
    assert "frame_interval" not in json.loads((a / MARKER_DIR / "scenario_0000.json").read_text())["run"]
    protocol = yaml.safe_load(next(spaced.glob("train/*/data_protocol.yaml")).read_text())
    assert protocol["world"]["ticks_per_saved_frame"] == 20
    capsys.readouterr()
    assert tool.main(["-o", str(spaced)] + TINY) == 2   # the default interval asked of a 1 s recording
    assert "frame_interval: recorded 1.0, asked None" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.main(["-o", str(tmp_path / "bad"), "--frame_interval", "0.12"] + TINY)
    assert "--frame_interval must be a positive multiple of 0.05 s, got '0.12'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_the_summary_counts_scenarios_per_split():
    from opencood_ext.cli.simulate import split_counts
    splits = {f"s{k:03d}": ("train" if k < 340 else "validate" if k < 360 else "test") for k in range(400)}
    assert split_counts(splits) == "train 340, validate 20, test 40 scenarios"
    assert split_counts({"a": "test", "b": "extra"}) == "test 1, extra 1 scenarios"
    assert split_counts({}) == "no scenarios"
