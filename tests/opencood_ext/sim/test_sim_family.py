"""Scene families of the built-in simulator (issue 31 item 5): the road family's geometry, mixed
datasets, the family recorded per scenario and read back, bad names refused in one line, and the
main job passing its profile's family to gencomm-sim. The junction default's bytes are held by
tests/opencood_ext/sim/test_sim_speed_identity.py."""
import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.cli.simulate import main as simulate_main
from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.formats import OPV2VReader
from opencood_ext.sim.builtin import AgentParams, BuiltinWorld
from opencood_ext.sim.families import scenario_families, scenario_family, scenario_layouts
from opencood_ext.sim.recorder import MODALITY_JSON

from sim_common import small_config

SAME_STREET = 4 * 3.5     # m: the farthest lane of the ego's street from the ego's lane (road_layout)


def _world(layout: str, warmup: int = 10, **agents) -> BuiltinWorld:
    cfg = small_config()
    return BuiltinWorld(replace(cfg, warmup_ticks=warmup, agents=replace(cfg.agents, layout=layout, **agents)))


def _heading_off(yaw_deg: float, ego_deg: float) -> float:
    """Degrees between a heading and the ego's heading or its reverse, whichever is nearer (0..90)."""
    d = abs((yaw_deg - ego_deg + 180.0) % 360.0 - 180.0)
    return min(d, 180.0 - d)


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Do two BEV rectangles (4, 2) intersect? (separating axes: the edge normals of both)"""
    for poly in (a, b):
        for k in range(4):
            edge = poly[(k + 1) % 4] - poly[k]
            n = np.array([-edge[1], edge[0]])
            pa, pb = a @ n, b @ n
            if pa.max() <= pb.min() or pb.max() <= pa.min():
                return False
    return True


def _no_overlaps(world: BuiltinWorld) -> bool:
    fp = world.traffic.footprints()
    return not any(_overlap(fp[i], fp[j]) for i in range(len(fp)) for j in range(i + 1, len(fp)))


def test_overlap_check_is_not_vacuous():
    square = np.array([[0, 0], [4, 0], [4, 2], [0, 2]], float)
    assert _overlap(square, square + [3.0, 1.0]) and not _overlap(square, square + [4.5, 0.0])


def test_road_family_collaborators_share_the_ego_street():
    """In the first saved frame every collaborator heads within 30 deg of the ego's heading or its
    reverse, sits on the ego's street within the communication range, and no vehicles overlap;
    over a few scenarios some drive the ego's way and some come the other way. The same check
    fails for the junction family (collaborators crossing the ego's path)."""
    world = _world("road")
    same = oncoming = 0
    for seed in range(4):
        world.reset(seed)
        frame = world.tick()
        assert world.protocol()["scenario"]["layout"] == "road"
        cavs = [a for a in frame.agents if not a.is_rsu]
        assert len(cavs) >= 2
        ego = cavs[0].lidar_pose
        u = np.array([np.cos(np.radians(ego[4])), np.sin(np.radians(ego[4]))])
        for a in cavs[1:]:
            rel = np.asarray(a.lidar_pose[:2]) - ego[:2]
            assert _heading_off(a.lidar_pose[4], ego[4]) <= 30.0, (seed, a.agent_id)
            assert abs(u[0] * rel[1] - u[1] * rel[0]) <= SAME_STREET + 1.0       # across the street, m
            assert np.hypot(*rel) <= world.cfg.agents.comm_range
            reverse = abs((a.lidar_pose[4] - ego[4] + 180.0) % 360.0 - 180.0) > 90.0
            oncoming += reverse
            same += not reverse
        assert _no_overlaps(world)
    assert same and oncoming
    junction = _world("junction")
    offs = []
    for seed in range(3):
        junction.reset(seed)
        cavs = [a for a in junction.tick().agents if not a.is_rsu]
        offs += [_heading_off(a.lidar_pose[4], cavs[0].lidar_pose[4]) for a in cavs[1:]]
    assert max(offs) > 30.0
    world.close()
    junction.close()


def _along_and_lateral(ego, v):
    u = np.array([np.cos(ego.yaw), np.sin(ego.yaw)])
    rel = np.array([v.x - ego.x, v.y - ego.y])
    return float(rel @ u), float(u[0] * rel[1] - u[1] * rel[0])


@pytest.mark.parametrize("seed", [0, 1])
def test_road_family_platoon_and_oncoming_roles(seed):
    """platoon_probability 1 with one collaborator: it follows or leads the ego in the ego's lane,
    bumper to bumper within platoon_gap. oncoming_probability 1 (no platoon): every collaborator
    drives the other way, at an along-street distance within road_gap."""
    world = _world("road", warmup=0, count=(2, 2), platoon_probability=1.0)
    world.reset(seed)
    ego, mate = (a.vehicle for a in world._agents if a.vehicle is not None)
    along, lateral = _along_and_lateral(ego, mate)
    gap = abs(along) - (ego.size[0] + mate.size[0]) / 2
    lo, hi = world.cfg.agents.platoon_gap
    assert abs(lateral) < 0.1 and _heading_off(np.degrees(mate.yaw), np.degrees(ego.yaw)) < 1.0
    assert abs(np.cos(mate.yaw - ego.yaw) - 1.0) < 1e-6 and lo - 1e-6 <= gap <= hi + 1e-6
    world = _world("road", warmup=0, count=(4, 4), platoon_probability=0.0, oncoming_probability=1.0)
    world.reset(seed)
    cavs = [a.vehicle for a in world._agents if a.vehicle is not None]
    lo, hi = world.cfg.agents.road_gap
    for v in cavs[1:]:
        along, lateral = _along_and_lateral(cavs[0], v)
        assert np.cos(v.yaw - cavs[0].yaw) < -0.999 and lo - 1e-6 <= abs(along) <= hi + 1e-6
    assert _no_overlaps(world)


def test_mixed_dataset_holds_both_families_and_reads_back(tmp_path):
    """gencomm-sim --family mixed: junction and road scenarios in turn, each family in its
    data_protocol.yaml, read back per scenario; the files stay a valid OPV2V-H dataset (our reader,
    with camera images for the road scenario too)."""
    root = tmp_path / "mixed"
    args = ["-o", str(root), "--family", "mixed", "--scenarios", "2", "--frames", "1", "--seed", "5",
            "--camera_size", "32x24", "--vehicles", "20", "21", "--points_per_second", "130000",
            "--raster_res", "0.5", "--split_ratio", "0", "0", "1", "--workers", "1", "--quiet"]
    assert simulate_main(args) == 0
    markers = sorted((root / ".gencomm_sim").glob("scenario_*.json"))
    names = [json.loads(m.read_text())["scenario"] for m in markers]
    assert [scenario_family(root, n) for n in names] == ["junction", "road"] == scenario_layouts("mixed", 2)
    assert scenario_families(root, names + names[:1]) == dict(zip(names, ["junction", "road"]))
    reader = OPV2VReader(root, "test", modality=root / MODALITY_JSON)
    assert len(reader) == 2
    for k in range(2):
        frame = reader[k]
        assert len(frame.agents) >= 2 and frame.objects
        assert all(len(a.cameras) == 4 and a.cameras[0].image.shape == (24, 32, 3) for a in frame.agents)
    assert simulate_main(args) == 0                      # a rerun trusts the markers of the same plan
    assert scenario_families(root, names) == dict(zip(names, ["junction", "road"]))


def test_single_family_has_no_plan_and_bad_names_fail_in_one_line(tmp_path, capsys):
    assert scenario_layouts("road", 3) is None and scenario_layouts("junction", 1) is None
    assert simulate_main(["-o", str(tmp_path / "x"), "--family", "ring", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--family" in err and "'ring'" in err and not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="--family must be one of"):
        scenario_layouts("highway", 2)
    with pytest.raises(ValueError, match="agents.layout must be one of"):
        AgentParams(layout="mixed")          # mixed is a dataset's plan, not one scenario's layout
    with pytest.raises(ValueError, match="agents.road_gap"):
        AgentParams(road_gap=(10.0, 80.0))   # beyond the 70 m communication range
    with pytest.raises(ValueError, match="layout must be one of"):
        BuiltinWorld(small_config()).reset(0, layout="ring")


def test_scenario_family_names_the_file_and_key(tmp_path):
    scen = tmp_path / "validate" / "2024_01_01_00_00_00"
    scen.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="2024_01_01_00_00_00/data_protocol.yaml"):
        scenario_family(tmp_path, "2024_01_01_00_00_00")
    (scen / "data_protocol.yaml").write_text("world: {seed: 1}\n")
    with pytest.raises(DataFormatError, match=r"data_protocol.yaml.*scenario\.layout"):
        scenario_family(tmp_path, "2024_01_01_00_00_00")
    (scen / "data_protocol.yaml").write_text("scenario: {layout: ring}\n")
    with pytest.raises(DataFormatError, match="unknown scene family 'ring'"):
        scenario_family(tmp_path, "2024_01_01_00_00_00")
    (scen / "data_protocol.yaml").write_text("scenario: {layout: road}\n")
    assert scenario_family(tmp_path, "2024_01_01_00_00_00") == "road"


def test_main_job_passes_the_profile_family_to_the_simulator(tmp_path, monkeypatch):
    from experiments import pipeline
    from experiments.profiles import PROFILES
    ran = []
    monkeypatch.setattr(pipeline, "call", ran.append)
    profile = PROFILES["default"]
    assert {p.scene_family for p in PROFILES.values()} == {"mixed"}  # every profile tests on both families
    assert PROFILES["quick"].test_scenes >= 2  # mixed alternates by scenario index: 2 scenes hold both
    pipeline.simulate(tmp_path / "sim", profile, seed=0)
    pipeline.simulate_test_set(tmp_path / "sim", profile, seed=0)
    assert [c.value("--family") for c in ran] == ["mixed", "mixed"]
    junction = dataclasses.replace(profile, scene_family="junction")
    pipeline.simulate(tmp_path / "sim", junction, seed=0)
    pipeline.simulate_test_set(tmp_path / "sim", junction, seed=0)
    assert [c.value("--family") for c in ran[2:]] == ["junction", "junction"]
    assert all(c.program == "gencomm-sim" for c in ran) and Path(ran[-1].value("-o")).name == "sim_test"
    # the dataset's frames 1 s apart (issue 49 item 2), the separate test set's one frame per scene
    assert ran[0].value("--frame_interval") == "1.0" and "--frame_interval" not in ran[1]
    # camera images only for a benchmark with a camera type (the default main table alone: no; --benchmark's
    # four types: yes; the LiDAR pair's benchmark: no)
    assert "--no_cameras" in ran[0] and "--camera_size" not in ran[0]
    pipeline.simulate(tmp_path / "sim", dataclasses.replace(profile, benchmark=True), seed=0)
    assert ran[-1].value("--camera_size") == "400x300" and "--no_cameras" not in ran[-1]
    pipeline.simulate(tmp_path / "sim", dataclasses.replace(profile, benchmark=True, benchmark_types=("m1", "m3")),
                      seed=0)
    assert "--no_cameras" in ran[-1] and "--camera_size" not in ran[-1]
