"""BEV visibility masks (HEAL's ``_bev_visibility.png``) on hand-built scenes whose
visible area is known."""
import numpy as np
import pytest

from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.formats.bev_visibility import (CENTRE, SIZE, VISIBLE, cell_centres, cell_of,
                                                      read_visibility_png, visibility_mask, write_visibility_png)
from opencood_ext.data.frame import AgentObs, CameraObs


def _visible(mask, x, y) -> bool:
    """HEAL's lookup (box_is_visible): row 127 - int(x / 0.39), column 127 + int(y / 0.39)."""
    r, c = cell_of(x, y)
    return bool(mask[r, c] > 0)


def test_cell_rule_orientation_and_centres():
    x, y = cell_centres()
    rows, cols = cell_of(x, y)
    np.testing.assert_array_equal(rows, np.arange(SIZE)[:, None].repeat(SIZE, 1))
    np.testing.assert_array_equal(cols, np.arange(SIZE)[None, :].repeat(SIZE, 0))
    assert cell_of(10.0, 0.0)[0] < CENTRE and cell_of(0.0, 10.0)[1] > CENTRE   # heading up, y (right) to the right
    assert cell_of(0.38, -0.38) == (CENTRE, CENTRE) and cell_of(-0.38, 0.38) == (CENTRE, CENTRE)
    assert np.abs(x).max() == pytest.approx(128.5 * 0.39) == np.abs(y).max()   # about +-50 m


def _camera_agent(depth, K, T_lidar_from_camera=np.eye(4)):
    cam = CameraObs("camera0", None, K, T_lidar_from_camera, depth=depth)
    return AgentObs(1, "m2", np.eye(4), np.zeros((0, 4), np.float32), cameras=[cam])


def test_camera_mask_is_the_unoccluded_field_of_view():
    """A forward camera (90 deg FOV) facing a wall 10 m away, sky above the horizon."""
    H, W = 100, 200
    K = np.array([[100.0, 0, 100], [0, 100.0, 50], [0, 0, 1]])
    depth = np.full((H, W), 10.0, np.float32)
    depth[:50] = 1000.0   # sky: the rays go up, and see nothing on the ground
    mask = visibility_mask(_camera_agent(depth, K))
    assert mask.dtype == np.uint8 and set(np.unique(mask)) == {0, VISIBLE}
    assert _visible(mask, 5, 0) and _visible(mask, 12, 0) and _visible(mask, 5, 4)
    assert not _visible(mask, 13.5, 0)     # behind the wall (10 m + 2.5 m margin)
    assert not _visible(mask, -5, 0)       # behind the camera
    assert not _visible(mask, 5, 6)        # 50 deg off axis: outside the 90 deg field of view
    # the camera's position in the LiDAR frame is the rays' origin
    T = np.eye(4)
    T[:3, 3] = [-20.0, 0.0, 0.0]
    shifted = visibility_mask(_camera_agent(depth, K, T))
    assert _visible(shifted, -15, 0) and not _visible(shifted, 5, 0)


def test_lidar_mask_stops_at_obstacles_and_ignores_rising_rays():
    """No cameras: the LiDAR scan. Ground all round at 20 m, a wall 8 m ahead, roofs above."""
    az = np.radians(np.arange(0.0, 360.0, 0.2))
    ground = np.c_[20 * np.cos(az), 20 * np.sin(az), np.full_like(az, -1.9)]
    ahead = np.abs(np.arctan2(ground[:, 1], ground[:, 0])) < np.arctan2(2.0, 8.0)
    wy = np.linspace(-2, 2, 200)
    wall = np.c_[np.full_like(wy, 8.0), wy, np.full_like(wy, -1.0)]
    roofs = np.c_[40 * np.cos(az), 40 * np.sin(az), np.full_like(az, 5.0)]   # above the sensor
    pts = np.concatenate([ground[~ahead], wall, roofs])
    agent = AgentObs(2, "m1", np.eye(4), np.c_[pts, np.zeros(len(pts))].astype(np.float32))
    mask = visibility_mask(agent)
    assert _visible(mask, 5, 0) and not _visible(mask, 15, 0)        # the wall hides what is behind it
    assert _visible(mask, -15, 0) and _visible(mask, 0, 15) and _visible(mask, 0, -21)
    assert not _visible(mask, -30, 0)   # roofs at 40 m do not make the ground below their rays visible
    # a sparse scan (every 2 deg) leaves no stripes: empty azimuth bins take their neighbours' reach
    sparse = AgentObs(2, "m1", np.eye(4), np.c_[ground[::10], np.zeros(len(ground[::10]))].astype(np.float32))
    m = visibility_mask(sparse)
    angles = np.radians(np.arange(0.0, 360.0, 0.25))
    assert all(_visible(m, 18 * np.cos(a), 18 * np.sin(a)) for a in angles)


def test_agent_without_sensor_data_sees_nothing_and_png_round_trip(tmp_path):
    blind = AgentObs(3, "m1", np.eye(4), np.zeros((0, 4), np.float32))
    assert not visibility_mask(blind).any()
    mask = np.zeros((SIZE, SIZE), np.uint8)
    mask[10:20, 30:40] = VISIBLE
    path = write_visibility_png(tmp_path / "000001_bev_visibility.png", mask)
    np.testing.assert_array_equal(read_visibility_png(path), mask > 0)
    with pytest.raises(ValueError, match="256x256"):
        write_visibility_png(tmp_path / "bad.png", mask[:10])
    from PIL import Image
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "small.png")
    with pytest.raises(DataFormatError, match="small.png.*256x256"):
        read_visibility_png(tmp_path / "small.png")
