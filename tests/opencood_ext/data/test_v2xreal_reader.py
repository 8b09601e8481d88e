"""V2X-Real reader on a tiny dataset written in its layout."""
import logging

import numpy as np
import pytest
import yaml

from opencood_ext.data.errors import DataFormatError, SkippedFrame
from opencood_ext.data.formats import V2XREAL_SUPERCLASS, V2XRealReader, get_reader, superclass
from opencood_ext.data.formats.v2xreal import read_bin
from opencood_ext.data.ground_truth import frame_ground_truth
from opencood_ext.geometry import pose_to_matrix

SCEN = "2023-03-17-15-53-02_1_0"
OBJECTS = {1: "Car", 2: "Pedestrian", 3: "MotorcyleRider", 4: "ConcreteTruck", 5: "PoliceCar"}


def _obj(k, t):
    return {"location": [10.0 * k, 2.0, 0.0], "center": [0.0, 0.0, 0.8], "angle": [0.0, 15.0 * k, 0.0],
            "extent": [2.0, 0.9, 0.8], "speed": 1.0, "obj_type": t}


def make_v2xreal(root, stamps=("000000", "000001"), agents=(1, 2, -1, -2), raw_intensity=True):
    rng = np.random.default_rng(0)
    for aid in agents:
        d = root / "train" / SCEN / str(aid)
        d.mkdir(parents=True)
        for ts in stamps:
            pts = rng.normal(0, 10, (64, 4)).astype(np.float32)
            pts[:, 3] = rng.integers(0, 256, 64) if raw_intensity else rng.uniform(0, 1, 64)
            pts[5] = np.nan
            pts.tofile(d / f"{ts}.bin")
            visible = [1, 2, 3] if aid > 0 else [3, 4, 5]
            (d / f"{ts}.yaml").write_text(yaml.safe_dump({
                "lidar_pose": [float(aid), 2.0 * aid, 1.9, 0.0, 30.0 * aid, 0.0],
                "vehicles": {k: _obj(k, OBJECTS[k]) for k in visible}}))
    return root


def test_superclass_mapping():
    assert superclass("Car") == "vehicle" and superclass("LongVehicle") == "vehicle"
    assert superclass("MotorcyleRider") == "pedestrian" and superclass("motorcyclerider") == "pedestrian"
    assert superclass("TrashCan") == "truck" and superclass("Van") == "truck"
    assert set(V2XREAL_SUPERCLASS.values()) == {"vehicle", "pedestrian", "truck"}
    with pytest.raises(ValueError, match="unknown V2X-Real class 'Tram'"):
        superclass("Tram")
    assert superclass("Tram", default=None) is None


def test_frames_points_and_classes(tmp_path):
    reader = V2XRealReader(make_v2xreal(tmp_path), "train")
    assert len(reader) == 2 and reader.scenarios == [SCEN]
    frame = reader[1]
    assert [a.agent_id for a in frame.agents] == [1, 2, -1, -2]
    a = frame.agents[0]
    assert a.lidar.shape == (63, 4) and a.lidar.dtype == np.float32
    assert not a.lidar[:, 3].any()  # the official loader's intensity: zero
    np.testing.assert_allclose(a.T_world_from_lidar, pose_to_matrix([1, 2, 1.9, 0, 30, 0]))
    assert {k: o.obj_type for k, o in frame.objects.items()} == OBJECTS
    assert frame.agent(-1).visible_ids == [3, 4, 5]
    gt = frame_ground_truth(frame, a.T_world_from_lidar)
    assert [superclass(t) for t in gt.types] == ["vehicle", "pedestrian", "pedestrian", "truck", "vehicle"]


@pytest.mark.parametrize("mode, order", [("vc", [1, 2, -1, -2]), ("ic", [-1, -2, 1, 2]),
                                         ("v2v", [1, 2]), ("i2i", [-1, -2])])
def test_modes(tmp_path, mode, order):
    reader = get_reader("v2xreal", make_v2xreal(tmp_path), "train", mode=mode)
    assert [a.agent_id for a in reader[0].agents] == order


def test_mode_without_ego_kind(tmp_path):
    root = make_v2xreal(tmp_path, agents=(1, 2))
    assert len(V2XRealReader(root, "train", mode="v2v")) == 2
    with pytest.raises(DataFormatError, match="no frame has an agent usable as ego in mode 'ic'"):
        V2XRealReader(root, "train", mode="ic")
    with pytest.raises(ValueError, match="mode must be one of"):
        V2XRealReader(root, "train", mode="x2y")


def _raw_points(root, agent="1", ts="000000"):
    return np.fromfile(root / "train" / SCEN / agent / f"{ts}.bin", np.float32).reshape(-1, 4)


@pytest.mark.parametrize("raw_intensity", [True, False])
def test_intensity_zero_like_the_official_loader(tmp_path, raw_intensity):
    """Default: x, y, z as stored (NaN rows dropped), intensity 0 for every point, whatever the
    file's intensity range (0..255 or 0..1): nothing is rescaled by a guess."""
    frame = V2XRealReader(make_v2xreal(tmp_path, raw_intensity=raw_intensity), "train")[0]
    raw = _raw_points(tmp_path)
    raw = raw[~np.isnan(raw).any(axis=1)]
    np.testing.assert_array_equal(frame.agents[0].lidar[:, :3], raw[:, :3])
    assert raw[:, 3].max() > 0.5 and not frame.agents[0].lidar[:, 3].any()


@pytest.mark.parametrize("raw_intensity", [True, False])
def test_intensity_raw_is_kept_unscaled(tmp_path, raw_intensity):
    reader = get_reader("v2xreal", make_v2xreal(tmp_path, raw_intensity=raw_intensity), "train", intensity="raw")
    raw = _raw_points(tmp_path)
    np.testing.assert_array_equal(reader[0].agents[0].lidar, raw[~np.isnan(raw).any(axis=1)])
    assert reader[0].agents[0].lidar[:, 3].max() > (100 if raw_intensity else 0.5)


def test_intensity_nan_and_bad_option(tmp_path):
    """A point with finite x, y, z and a NaN intensity: the official loader keeps it (its intensity
    is zeroed anyway); raw mode drops it. An unknown mode is refused by name."""
    root = make_v2xreal(tmp_path, agents=(1,))
    path = root / "train" / SCEN / "1" / "000000.bin"
    pts = _raw_points(root)
    pts[7, 3] = np.nan
    pts.tofile(path)
    assert V2XRealReader(root, "train")[0].agents[0].lidar.shape == (63, 4)
    assert V2XRealReader(root, "train", intensity="raw")[0].agents[0].lidar.shape == (62, 4)
    with pytest.raises(ValueError, match="intensity must be one of"):
        V2XRealReader(root, "train", intensity="scaled")
    with pytest.raises(ValueError, match="intensity must be one of"):
        read_bin(path, intensity="255")


def test_bad_bin_and_skip(tmp_path, caplog):
    root = make_v2xreal(tmp_path)
    bad = root / "train" / SCEN / "2" / "000000.bin"
    bad.write_bytes(bad.read_bytes()[:-6])
    with pytest.raises(DataFormatError) as ei:
        V2XRealReader(root, "train")[0]
    assert str(bad) in str(ei.value) and "16-byte" in str(ei.value)
    reader = V2XRealReader(root, "train", skip_bad=True)
    with caplog.at_level(logging.WARNING):
        with pytest.raises(SkippedFrame, match="000000.bin"):
            reader[0]
        assert reader[1].timestamp == "000001"
    assert reader.skipped == 1 and "000000.bin" in caplog.text
    with pytest.raises(DataFormatError, match="split 'test' not found"):
        V2XRealReader(root, "test")
