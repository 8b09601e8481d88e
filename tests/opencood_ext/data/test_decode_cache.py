"""The optional on-disk cache of decoded frames (data.cache_dir)."""
import datetime
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.data.dataset import DataConfig
from opencood_ext.data.formats import OPV2VReader, get_reader, write_opv2v_frame, write_pcd
from opencood_ext.data.formats.decode_cache import DecodeCache
from opencood_ext.data.formats.opv2v_io import dump_yaml, load_agent_yaml, load_yaml, parse_objects
from opencood_ext.data.formats.pcd import read_pcd
from opencood_ext.data.formats.v2xreal import read_bin
from opencood_ext.data.frame import AgentObs, Frame, ObjectLabel
from opencood_ext.experiment import reader_kwargs
from opencood_ext.geometry import pose_to_matrix

FIXTURE_DIR = (Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "v2xset_real" / "validate"
               / "2021_08_21_17_30_41" / "4279")


def _frame(seed=0, n=300):
    rng = np.random.default_rng(seed)
    objects = {oid: ObjectLabel(oid, location=rng.normal(0, 20, 3), center=[0.01, -0.02, 0.7],
                                angle=[0.1, rng.uniform(-180, 180), -0.2], extent=[2.2, 1.0, 0.75],
                                obj_type=t, speed=float(rng.uniform(0, 30)))
               for oid, t in ((10, "Car"), (11, "Truck"))}
    agents = []
    for aid in (0, 3):
        pts = np.empty((n, 4), np.float32)
        pts[:, :3] = rng.normal(0, 20, (n, 3))
        pts[:, 3] = rng.integers(0, 256, n) / np.float32(255)
        pose = np.array([*rng.normal(0, 30, 3), 0.5, rng.uniform(-180, 180), -0.3])
        agents.append(AgentObs(aid, "", pose_to_matrix(pose), pts, lidar_beams={16: pts[::4].copy()},
                               visible_ids=[10, 11], lidar_pose=pose,
                               meta={"ego_speed": 12.5, "RSU": False, "plan_trajectory": [[1.0, 2.0, 0]]}))
    return Frame("2021_01_01_00_00_00", "000007", agents, objects, split="train")


@pytest.fixture
def data_root(tmp_path):
    write_opv2v_frame(tmp_path / "data", "train", _frame(), pcd_data="ascii", write_cameras=False)
    return tmp_path / "data"


def _reader(root, cache_dir=None):
    return OPV2VReader(root, "train", modality="in_order", load_cameras=False, cache_dir=cache_dir)


def _assert_same(a: Frame, b: Frame):
    assert [x.agent_id for x in a.agents] == [x.agent_id for x in b.agents]
    assert list(a.objects) == list(b.objects)
    for oid, o in a.objects.items():
        p = b.objects[oid]
        assert all(np.array_equal(getattr(o, f), getattr(p, f)) for f in ("location", "center", "angle", "extent"))
        assert (o.obj_type, o.speed, o.object_id) == (p.obj_type, p.speed, p.object_id)
    for x, y in zip(a.agents, b.agents):
        assert np.array_equal(x.lidar.view(np.uint32), y.lidar.view(np.uint32))
        assert sorted(x.lidar_beams) == sorted(y.lidar_beams)
        for k in x.lidar_beams:
            assert np.array_equal(x.lidar_beams[k], y.lidar_beams[k])
        assert np.array_equal(x.T_world_from_lidar, y.T_world_from_lidar)
        assert np.array_equal(x.lidar_pose, y.lidar_pose)
        assert x.meta == y.meta and x.visible_ids == y.visible_ids and x.agent_type == y.agent_type


def test_cached_frames_equal_uncached_and_second_epoch_reads_no_source(data_root, tmp_path, monkeypatch):
    plain = _reader(data_root)[0]
    cached = _reader(data_root, tmp_path / "cache")
    _assert_same(cached[0], plain)  # first epoch: decode and store
    assert cached.cache.misses == 6 and cached.cache.hits == 0  # 2 agents x (pcd, beam pcd, yaml)
    import opencood_ext.data.formats.opv2v_io as io_mod
    import opencood_ext.data.formats.pcd as pcd_mod

    def no_text(*a, **k):
        raise AssertionError("a source file was parsed on a cache hit")

    monkeypatch.setattr(io_mod, "load_yaml", no_text)
    monkeypatch.setattr(pcd_mod, "parse_ascii_floats", no_text)
    again = _reader(data_root, tmp_path / "cache")
    _assert_same(again[0], plain)
    assert again.cache.hits == 6 and again.cache.misses == 0
    assert not list((tmp_path / "cache").rglob("*.tmp"))  # atomic writes leave no temporaries


def test_touch_or_rewrite_invalidates(data_root, tmp_path):
    cache = tmp_path / "cache"
    pcd = data_root / "train" / "2021_01_01_00_00_00" / "0" / "000007.pcd"
    first = _reader(data_root, cache)[0].agents[0].lidar
    st = pcd.stat()
    os.utime(pcd, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))  # touch: same bytes, new mtime
    r = _reader(data_root, cache)
    assert np.array_equal(r[0].agents[0].lidar, first) and r.cache.misses == 1 and r.cache.hits == 5
    assert len(list(cache.rglob("*.npz"))) == 6  # the stale sibling was replaced, not kept
    new = first[:50].copy()
    new[:, 0] += 1.0
    write_pcd(pcd, new, data="ascii")  # rewrite: new size and mtime
    os.utime(pcd, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10 ** 9))
    got = _reader(data_root, cache)[0].agents[0].lidar
    assert np.array_equal(got, read_pcd(pcd)) and len(got) == 50
    yaml_path = pcd.with_suffix(".yaml")
    d = load_yaml(yaml_path)
    d["vehicles"][10]["speed"] = 99.0
    dump_yaml(yaml_path, d)
    os.utime(yaml_path, ns=(st.st_atime_ns, st.st_mtime_ns + 3 * 10 ** 9))
    assert _reader(data_root, cache)[0].objects[10].speed == 99.0


def test_corrupt_entry_is_decoded_again_with_a_warning(data_root, tmp_path, caplog):
    cache = tmp_path / "cache"
    plain = _reader(data_root)[0]
    _reader(data_root, cache)[0]
    entries = sorted(cache.rglob("*.npz"))
    for k, p in enumerate(entries):
        p.write_bytes(b"not a zip" if k % 2 else p.read_bytes()[:100])  # garbage and truncation
    with caplog.at_level(logging.WARNING):
        r = _reader(data_root, cache)
        _assert_same(r[0], plain)
    assert r.cache.misses == 6 and "unreadable" in caplog.text
    _assert_same(_reader(data_root, cache)[0], plain)  # and it was rewritten


def test_unwritable_cache_warns_and_reads(data_root, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING):
        r = _reader(data_root, blocker / "cache")
        _assert_same(r[0], _reader(data_root)[0])
    assert "cannot write the decode cache" in caplog.text and r.cache.read_only


def test_real_fixture_yaml_and_pcd_round_trip(tmp_path):
    if not FIXTURE_DIR.exists():
        pytest.skip("../shared/fixtures is not present (a user's clone)")
    cache = DecodeCache(tmp_path / "cache")
    y = FIXTURE_DIR / "000069.yaml"
    first, second = load_agent_yaml(y, cache), load_agent_yaml(y, cache)
    assert cache.hits == 1 and first == load_yaml(y)
    assert {k: v for k, v in second.items() if k != "vehicles"} == \
        {k: v for k, v in first.items() if k != "vehicles"}
    a, b = parse_objects(first, y), parse_objects(second, y)
    assert list(a) == list(b) and len(a) == 21
    for oid in a:
        assert a[oid].obj_type == b[oid].obj_type and a[oid].speed == b[oid].speed
        assert all(np.array_equal(getattr(a[oid], f), getattr(b[oid], f))
                   for f in ("location", "center", "angle", "extent"))
    p = FIXTURE_DIR / "000069.pcd"
    pts = cache.points(p, read_pcd)
    assert np.array_equal(cache.points(p, read_pcd), pts) and cache.hits == 2


def test_yaml_that_json_cannot_carry_is_not_cached(tmp_path):
    y = tmp_path / "000001.yaml"
    y.write_text("lidar_pose: [0, 0, 0, 0, 0, 0]\nvehicles: {}\nwhen: 2021-08-21\n")
    cache = DecodeCache(tmp_path / "cache")
    for _ in range(2):
        assert load_agent_yaml(y, cache)["when"] == datetime.date(2021, 8, 21)
    assert cache.hits == 0 and not list((tmp_path / "cache").rglob("*.npz"))


def test_options_are_part_of_the_key(tmp_path):
    raw = np.array([[1, 2, 3, 100], [4, 5, 6, 200]], "<f4")
    path = tmp_path / "a.bin"
    raw.tofile(path)
    cache = DecodeCache(tmp_path / "cache")
    assert cache.points(path, read_bin, intensity="raw")[1, 3] == np.float32(200)
    assert cache.points(path, read_bin, intensity="zero")[1, 3] == np.float32(0)
    assert cache.points(path, read_bin, intensity="raw")[1, 3] == np.float32(200)
    assert cache.misses == 2


def test_config_switch_reaches_the_reader(data_root, tmp_path):
    cfg = DataConfig(root=str(data_root), agent_types={})
    assert "cache_dir" not in reader_kwargs(cfg)
    cfg = DataConfig(root=str(data_root), agent_types={}, cache_dir=str(tmp_path / "c"))
    reader = get_reader("opv2v", data_root, "train", **reader_kwargs(cfg))
    assert reader.cache is not None and reader.cache.root == tmp_path / "c"
    reader[0]
    assert len(list((tmp_path / "c").rglob("*.npz"))) == 4  # no beams asked for: 2 x (pcd, yaml)
    assert _reader(data_root).cache is None


@pytest.mark.parametrize("fmt", ["dairv2x", "v2xreal"])
def test_other_readers_use_the_cache(fmt, tmp_path):
    from test_dairv2x_reader import make_dair
    from test_v2xreal_reader import make_v2xreal

    root = make_dair(tmp_path / "d") if fmt == "dairv2x" else make_v2xreal(tmp_path / "d")
    split = None if fmt == "dairv2x" else "train"
    plain = get_reader(fmt, root, split)[1]
    for epoch in (0, 1):
        r = get_reader(fmt, root, split, cache_dir=tmp_path / "cache")
        frame = r[1]
        filled, empty = (r.cache.hits, r.cache.misses) if epoch else (r.cache.misses, r.cache.hits)
        assert filled >= 2 and empty == 0
        for x, y in zip(frame.agents, plain.agents):
            assert np.array_equal(x.lidar.view(np.uint32), y.lidar.view(np.uint32))
        assert sorted(frame.objects) == sorted(plain.objects)
