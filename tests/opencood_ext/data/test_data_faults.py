"""Data faults are named, never silent (issue 29 item 6): an agent file missing inside the
agent's recording span, a timestamp only some agents have (a renamed file) and NaN/inf points
each give a DataFaultWarning and a logged WARNING naming the file, or with the strict setting a
DataFaultError naming it; agents entering or leaving a scenario are not faults."""
import logging
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.data import faults as faults_mod
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.errors import DataFaultError, DataFaultWarning, DataFormatError, SkippedFrame
from opencood_ext.data.formats import DairV2XReader, OPV2VReader, V2XRealReader, read_pcd, write_pcd
from opencood_ext.data.formats.opv2v_writer import write_opv2v_frame
from opencood_ext.data.formats.v2xreal import read_bin
from opencood_ext.data.synthetic import make_frame
from test_dairv2x_reader import make_dair
from test_v2xreal_reader import SCEN as V2XREAL_SCEN
from test_v2xreal_reader import make_v2xreal

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import inspect_data  # noqa: E402

SCEN = "2021_08_21_17_30_41"
STAMPS = ("000068", "000070", "000072", "000074")
AGENTS = (10, 20, 30)  # make_frame's ids for three agents
RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)
VOXELS = {"m1": (0.8, 0.8, 4.0)}
LOGGERS = ("opencood_ext.data.faults",)


def write_scenario(root: Path, spans=None) -> Path:
    """One scenario, agents 10, 20, 30 at timestamps 68..74 (``spans``: {agent: stamps} to
    let an agent enter late or leave early)."""
    for ts in STAMPS:
        frame = make_frame(seed=int(ts), num_agents=3, num_objects=2, scenario=SCEN, timestamp=ts)
        frame.agents = [a for a in frame.agents if ts in (spans or {}).get(a.agent_id, STAMPS)]
        for a in frame.agents:
            a.lidar, a.lidar_beams = a.lidar[::8], {}
        write_opv2v_frame(root, "train", frame, write_cameras=False, bev_visibility=False)
    return root


def agent_file(root: Path, agent: int, ts: str, ext: str = "yaml") -> Path:
    return root / "train" / SCEN / str(agent) / f"{ts}.{ext}"


def reader(root, **kw):
    return OPV2VReader(root, "train", load_cameras=False, load_beams=False, **kw)


def quiet_reader(root, **kw):
    """The reader, failing the test on any DataFaultWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataFaultWarning)
        return reader(root, **kw)


@pytest.fixture()
def data(tmp_path):
    return write_scenario(tmp_path / "OPV2V")


def test_clean_data_and_agents_entering_or_leaving_give_no_fault(tmp_path):
    root = write_scenario(tmp_path / "d", spans={10: STAMPS[:3], 30: STAMPS[1:]})
    r = quiet_reader(root)
    assert r.faults == [] and len(r) == 4
    assert [r.agent_ids(i) for i in range(4)] == [(10, 20), (10, 20, 30), (10, 20, 30), (20, 30)]
    quiet_reader(root, strict=True)  # nothing to refuse
    assert len(quiet_reader(root, strict=True)[3].agents) == 2


def test_deleted_agent_yaml_is_named(data, caplog):
    gone = agent_file(data, 20, "000070")
    gone.unlink()  # its 000070.pcd stays
    with caplog.at_level(logging.WARNING, logger=LOGGERS[0]):
        with pytest.warns(DataFaultWarning, match=re.escape(str(gone))) as rec:
            r = reader(data)
    assert str(gone) in caplog.text and "000070.pcd" in caplog.text
    assert [f.kind for f in r.faults] == ["no_yaml"] and r.faults[0].path == gone
    named = [str(w.message) for w in rec if issubclass(w.category, DataFaultWarning)]
    assert len(named) == 1 and "without agent 20" in named[0]
    assert r.agent_ids(1) == (10, 30)  # read on without agent 20, as the warning says
    with pytest.raises(DataFaultError) as err:
        reader(data, strict=True)
    assert str(err.value).startswith(str(gone)) and isinstance(err.value, DataFormatError)


def test_deleted_ego_yaml_says_who_becomes_ego(data):
    gone = agent_file(data, 10, "000072")
    gone.unlink()
    with pytest.warns(DataFaultWarning, match="ego .* is agent 20 instead of agent 10") as rec:
        r = reader(data)
    assert str(gone) in str(rec[0].message)
    assert r[2].agents[0].agent_id == 20  # the substitution happens, but not silently


def test_agent_missing_inside_its_span_is_named(data, caplog):
    for ext in ("yaml", "pcd"):
        agent_file(data, 30, "000070", ext).unlink()
    expected = agent_file(data, 30, "000070")
    with caplog.at_level(logging.WARNING, logger=LOGGERS[0]):
        with pytest.warns(DataFaultWarning, match=re.escape(f"{expected}: agent 30 has no file at timestamp 000070")):
            r = reader(data)
    assert [(f.kind, f.path) for f in r.faults] == [("missing", expected)]
    assert str(expected) in caplog.text and "000068..000074" in caplog.text
    with pytest.raises(DataFaultError, match=re.escape(str(expected))):
        reader(data, strict=True)


def test_agent_leaving_early_or_entering_late_is_not_a_fault(data):
    for ext in ("yaml", "pcd"):
        agent_file(data, 30, "000074", ext).unlink()  # left after 72
        agent_file(data, 10, "000068", ext).unlink()  # arrived at 70
    r = quiet_reader(data, strict=True)
    assert r.faults == [] and r.agent_ids(0) == (20, 30) and r.agent_ids(3) == (10, 20)


def test_renamed_timestamp_names_the_lone_file(data, caplog):
    for ext in ("yaml", "pcd"):
        agent_file(data, 20, "000070", ext).rename(agent_file(data, 20, "000071", ext))
    lone = agent_file(data, 20, "000071")
    with caplog.at_level(logging.WARNING, logger=LOGGERS[0]):
        with pytest.warns(DataFaultWarning) as rec:
            r = reader(data)
    texts = [str(w.message) for w in rec if issubclass(w.category, DataFaultWarning)]
    stray = [t for t in texts if t.startswith(f"{lone}: timestamp 000071 exists only for agent(s) [20]")]
    assert len(stray) == 1 and "[10, 30]" in stray[0], texts
    assert any(t.startswith(str(agent_file(data, 20, "000070"))) for t in texts)  # and the hole it left
    assert sorted(f.kind for f in r.faults) == ["missing", "stray"]
    assert str(lone) in caplog.text
    # a renamed timestamp adds no frame: the frames are the intact recording's (agent 20 left out at 70)
    assert r.samples == [(SCEN, t) for t in STAMPS] and r.agent_ids(1) == (10, 30)
    assert "no frame" in stray[0] and "is indexed" in stray[0]
    with pytest.raises(DataFaultError) as err:
        reader(data, strict=True)
    assert str(lone) in str(err.value) and "2 data faults" in str(err.value)


def test_two_agents_renamed_timestamp_is_a_mismatch_naming_both_sides(tmp_path):
    root = write_scenario(tmp_path / "d", spans={30: ()})
    for ext in ("yaml", "pcd"):
        agent_file(root, 20, "000070", ext).rename(agent_file(root, 20, "000071", ext))
    with pytest.warns(DataFaultWarning) as rec:
        r = reader(root)
    msg = next(str(w.message) for w in rec if "000071 exists for" in str(w.message))
    assert msg.startswith(str(agent_file(root, 20, "000071"))) and str(agent_file(root, 10, "000071")) in msg
    assert sorted(f.kind for f in r.faults) == ["mismatch", "mismatch"]
    # a tie cannot tell the renamed file from a lost one: neither side is a frame, no frame is added
    assert r.samples == [(SCEN, t) for t in STAMPS if t != "000070"]


def test_yaml_without_point_cloud_is_named_at_index_time(data):
    gone = agent_file(data, 20, "000072", "pcd")
    gone.unlink()
    with pytest.warns(DataFaultWarning, match=re.escape(f"{gone}: missing")):
        r = reader(data)
    with pytest.raises(DataFormatError, match=re.escape(str(gone))):
        r[2]  # loading still fails by name, as before


def test_strict_with_skip_bad_skips_the_faulty_frame_once(data, caplog):
    agent_file(data, 20, "000070").unlink()
    with caplog.at_level(logging.WARNING):
        r = quiet_reader(data, strict=True, skip_bad=True)  # left to the frame: no warning now
        frames = list(r)
        with pytest.raises(SkippedFrame, match="000070.yaml"):
            r[1]
    assert [f.timestamp for f in frames] == ["000068", "000072", "000074"] and r.skipped == 1
    assert caplog.text.count("skipping bad frame 1") == 1


def test_nan_points_are_warned_with_file_and_count(data, caplog):
    path = agent_file(data, 20, "000070", "pcd")
    pts = read_pcd(path)
    pts[[1, 4, 9], 0] = np.nan
    pts[6, 2] = np.inf
    write_pcd(path, pts)
    r = quiet_reader(data)
    with caplog.at_level(logging.WARNING, logger=LOGGERS[0]):
        with pytest.warns(DataFaultWarning, match=re.escape(f"{path}: dropped 4 of {len(pts)} points with NaN/inf")):
            frame = r[1]
    assert len(frame.agents[1].lidar) == len(pts) - 4 and np.isfinite(frame.agents[1].lidar).all()
    assert f"{path}: dropped 4 of {len(pts)}" in caplog.text
    with pytest.raises(DataFaultError, match=re.escape(f"{path}: 4 of {len(pts)} points have a non-finite")):
        reader(data, strict=True)[1]
    assert len(reader(data, strict=True, skip_bad=True)) == 4 and \
        [f.timestamp for f in reader(data, strict=True, skip_bad=True)] == ["000068", "000072", "000074"]


def test_nan_points_are_warned_on_every_read_through_the_cache(data, tmp_path):
    path = agent_file(data, 10, "000068", "pcd")
    pts = read_pcd(path)
    pts[0, 1] = np.nan
    write_pcd(path, pts)
    for _ in range(2):  # a miss, then a hit: the cache keeps the rows, the reader drops them after
        r = reader(data, cache_dir=tmp_path / "cache")
        with pytest.warns(DataFaultWarning, match=re.escape(f"{path}: dropped 1 of")):
            r[0]
    assert r.cache.hits > 0
    with pytest.raises(DataFaultError, match=re.escape(str(path))):
        reader(data, cache_dir=tmp_path / "cache", strict=True)[0]


def test_dair_and_v2xreal_nan_points_are_the_same_fault(tmp_path):
    dair = make_dair(tmp_path / "dair")  # one NaN row in every scan
    pcd = dair / "vehicle-side" / "velodyne" / "000010.pcd"
    with pytest.warns(DataFaultWarning, match=re.escape(f"{pcd}: dropped 1 of 50 points")):
        DairV2XReader(dair)[0]
    with pytest.raises(DataFaultError, match=re.escape(f"{pcd}: 1 of 50 points")):
        DairV2XReader(dair, strict=True)[0]
    v2x = make_v2xreal(tmp_path / "v2x", agents=(1,))  # one NaN row per .bin
    binf = v2x / "train" / V2XREAL_SCEN / "1" / "000000.bin"
    with pytest.warns(DataFaultWarning, match=re.escape(f"{binf}: dropped 1 of 64 points")):
        assert V2XRealReader(v2x, "train")[0].agents[0].lidar.shape == (63, 4)
    with pytest.raises(DataFaultError, match=re.escape(f"{binf}: 1 of 64 points")):
        V2XRealReader(v2x, "train", strict=True)[0]
    with pytest.raises(DataFaultError, match=re.escape(str(binf))):
        read_bin(binf, strict=True)
    with warnings.catch_warnings():  # NaN intensity is no fault where the intensity is zeroed anyway
        warnings.simplefilter("error", DataFaultWarning)
        pts = np.fromfile(binf, dtype="<f4").reshape(-1, 4)
        pts[5], pts[7, 3] = 1.0, np.nan
        pts.tofile(binf)
        assert read_bin(binf).shape == (64, 4)
    with pytest.warns(DataFaultWarning, match="dropped 1 of 64"):
        read_bin(binf, intensity="raw")


def test_v2xreal_layout_faults_use_bin_files(tmp_path):
    root = make_v2xreal(tmp_path / "v2x", stamps=("000000", "000001", "000002"))
    gone = root / "train" / V2XREAL_SCEN / "2" / "000001.bin"
    gone.unlink()
    with pytest.warns(DataFaultWarning, match=re.escape(f"{gone}: missing")):
        r = V2XRealReader(root, "train")
    assert [f.kind for f in r.faults] == ["no_lidar"]
    (root / "train" / V2XREAL_SCEN / "2" / "000001.yaml").unlink()
    with pytest.raises(DataFaultError, match="agent 2 has no file at timestamp 000001"):
        V2XRealReader(root, "train", strict=True)


def _dataset(reader_, strict, skip):
    cfg = DataConfig(root="unused", modality="all:m1", lidar_range=RANGE, strict=strict, skip_bad_frames=skip,
                     agent_types={"m1": AgentTypeData()})
    return CooperativeDataset(reader_, cfg, VOXELS, train=False)


def test_data_strict_in_the_config(data):
    agent_file(data, 30, "000072").unlink()
    with pytest.warns(DataFaultWarning):
        r = reader(data)
    assert _dataset(r, strict=False, skip=False)[2] is not None  # default: read on, warned
    with pytest.raises(DataFaultError, match=re.escape(str(agent_file(data, 30, "000072")))):
        _dataset(r, strict=True, skip=False)
    with pytest.warns(DataFaultWarning):
        r = reader(data, skip_bad=True)
    ds = _dataset(r, strict=True, skip=True)
    assert ds[2] is None and ds[1] is not None and ds.skipped == {2}


def test_inspect_data_lists_the_faults(data, capsys):
    gone = agent_file(data, 20, "000070")
    gone.unlink()
    assert inspect_data.main([str(data), "--format", "opv2v", "--split", "train"]) == 0
    out = capsys.readouterr().out
    assert "data faults (1)" in out and str(gone) in out
    assert inspect_data.main([str(data), "--format", "opv2v", "--split", "train", "--strict"]) == 2
    assert str(gone) in capsys.readouterr().err


def test_many_faults_are_counted_not_all_warned(tmp_path, monkeypatch):
    root = write_scenario(tmp_path / "d")
    gone = []
    for a in AGENTS:
        for ts in STAMPS:
            gone.append(agent_file(root, a, ts))
            gone[-1].unlink()
    agent_file(root, 10, "000068").write_text("lidar_pose: [0, 0, 0, 0, 0, 0]\nvehicles: {}\n")
    with pytest.warns(DataFaultWarning) as rec:
        r = reader(root)
    assert len(r.faults) == 11 and len(r) == 1
    assert len(rec) == 11 <= faults_mod.MAX_REPORTED
    monkeypatch.setattr(faults_mod, "MAX_REPORTED", 4)
    with pytest.warns(DataFaultWarning) as rec:
        reader(root)
    assert len(rec) == 5 and "7 more data faults not shown (11 in all" in str(rec[-1].message)


def test_fault_error_survives_dataloader_workers():
    """A worker's DataFaultError reaches the main process pickled, or re-raised by torch with the
    worker's traceback as its one argument: either way it keeps its type and names the file."""
    import pickle

    err = DataFaultError("/d/train/s/20/000070.pcd", "3 of 9 points have a non-finite (NaN/inf) value")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is DataFaultError and str(back) == str(err) and back.path == err.path
    tb = f"Caught DataFaultError in DataLoader worker process 0.\nTraceback ...\n" \
         f"opencood_ext.data.errors.DataFaultError: {err}"
    again = DataFaultError(tb)
    assert again.path == "/d/train/s/20/000070.pcd" and str(again) == str(err)


def test_data_strict_reaches_the_reader_through_the_experiment(data, tmp_path):
    """build_dataset with data.strict: the reader itself raises the fault (naming the file), with no
    DataFaultWarning before it; without strict the same data warns and reads on."""
    from opencood_ext.experiment import build_dataset, load_experiment
    from tiny_runs import PP, tiny_config
    agent_file(data, 30, "000072").unlink()
    path = tiny_config(tmp_path, data, "strict_exp", {"m1": PP}, {"fusion": "late"})
    cfg = load_experiment(path, ["data.strict=true"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataFaultWarning)
        with pytest.raises(DataFaultError, match=re.escape(str(agent_file(data, 30, "000072")))):
            build_dataset(cfg, "train", train=False)
    with pytest.warns(DataFaultWarning):
        assert len(build_dataset(load_experiment(path), "train", train=False)) == len(STAMPS)


def test_a_renamed_timestamp_does_not_change_the_frames_an_evaluation_scores(data, tmp_path):
    """The evaluation's dataset (build_dataset, train=False) of data with one agent's file renamed holds
    the intact recording's frames, warned about; data.strict refuses the split, naming the lone file."""
    from opencood_ext.experiment import build_dataset, load_experiment
    from tiny_runs import PP, tiny_config
    path = tiny_config(tmp_path, data, "renamed_exp", {"m1": PP}, {"fusion": "late"})
    intact = build_dataset(load_experiment(path), "train", train=False).reader.samples
    for ext in ("yaml", "pcd"):
        agent_file(data, 20, "000070", ext).rename(agent_file(data, 20, "000071", ext))
    with pytest.warns(DataFaultWarning, match="no frame .*000071 is indexed"):
        ds = build_dataset(load_experiment(path), "train", train=False)
    assert ds.reader.samples == intact and len(ds) == len(STAMPS)
    with pytest.raises(DataFaultError, match=re.escape(str(agent_file(data, 20, "000071")))):
        build_dataset(load_experiment(path, ["data.strict=true"]), "train", train=False)
