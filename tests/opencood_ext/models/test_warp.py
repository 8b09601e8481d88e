"""warp_to_ego / warp_mask: geometry of hot cells under known rigid motions."""
import math

import numpy as np
import pytest
import torch

from opencood_ext.geometry.transforms import pose_to_matrix, relative_transform, transform_points
from opencood_ext.models.warp import warp_mask, warp_to_ego

# 8 x 8 cells of 1 m, centred on the agent: cell centres at +-0.5, +-1.5, ...
RANGE = (-4.0, -4.0, -3.0, 4.0, 4.0, 1.0)


def _hot(h, w, row, col, c=2):
    f = torch.zeros(1, c, h, w, dtype=torch.float64)
    f[0, :, row, col] = 1.0
    return f


def _cell_centre(row, col, rng, h, w):
    dx, dy = (rng[3] - rng[0]) / w, (rng[4] - rng[1]) / h
    return rng[0] + (col + 0.5) * dx, rng[1] + (row + 0.5) * dy


def _yaw_T(yaw_deg, tx, ty):
    a = math.radians(yaw_deg)
    T = np.eye(4)
    T[:2, :2] = [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]
    T[:2, 3] = [tx, ty]
    return T[None]


def test_identity_is_exact():
    f = torch.randn(2, 3, 8, 8)
    out = warp_to_ego(f, np.repeat(np.eye(4)[None], 2, 0), RANGE)
    assert torch.equal(out, f)
    assert torch.equal(warp_mask(np.repeat(np.eye(4)[None], 2, 0), RANGE, (8, 8)), torch.ones(2, 1, 8, 8))


def test_pose_times_its_inverse_passes_through_unresampled():
    # An ego placed in its own frame: T_ego_from_world @ T_world_from_ego, far from the world origin,
    # is ~1e-14 off the identity; its feature must come back bit for bit, not bilinearly resampled.
    P = pose_to_matrix([412.37, -1283.9, 0.7, 0.3, 37.13, -0.2])
    T = np.linalg.inv(P) @ P
    assert not np.array_equal(T, np.eye(4))  # the case the exact comparison missed
    f = torch.randn(1, 3, 8, 8, dtype=torch.float64)
    assert torch.equal(warp_to_ego(f, T[None], RANGE), f)
    assert torch.equal(warp_mask(T[None], RANGE, (8, 8)), torch.ones(1, 1, 8, 8))
    # ... while a real sub-cell move (1 mm) still resamples.
    T[0, 3] += 1e-3
    assert not torch.equal(warp_to_ego(f, T[None], RANGE), f)


def test_translation_moves_hot_cell_by_whole_cells():
    # The agent is 2 m ahead (x) and 1 m left/right (y) of the ego: agent cell (row 3, col 4) -> ego (4, 6).
    out = warp_to_ego(_hot(8, 8, 3, 4), _yaw_T(0, 2.0, 1.0), RANGE)
    assert out[0, 0, 4, 6].item() == pytest.approx(1.0, abs=1e-9)
    assert out.sum().item() == pytest.approx(2.0, abs=1e-9)  # 2 channels, nothing else lit


def test_rotation_90_degrees():
    # Agent cell centre (x=1.5, y=-0.5) rotated +90 deg about z -> (0.5, 1.5): ego row 5, col 4.
    x, y = _cell_centre(3, 5, RANGE, 8, 8)
    assert (x, y) == (1.5, -0.5)
    out = warp_to_ego(_hot(8, 8, 3, 5), _yaw_T(90, 0, 0), RANGE)
    assert out[0, 1, 5, 4].item() == pytest.approx(1.0, abs=1e-9)
    assert out[0, 1].sum().item() == pytest.approx(1.0, abs=1e-9)


def test_half_cell_translation_splits_the_value():
    out = warp_to_ego(_hot(8, 8, 2, 2, c=1), _yaw_T(0, 0.5, 0.0), RANGE)
    assert out[0, 0, 2, 2].item() == pytest.approx(0.5)
    assert out[0, 0, 2, 3].item() == pytest.approx(0.5)


def test_general_pose_lands_where_geometry_says():
    """Non-square cells, arbitrary yaw, poses through pose_to_matrix: the warped mass sits at T p."""
    rng = (-8.0, -4.0, -3.0, 8.0, 4.0, 1.0)  # 32 x 16 cells of 0.5 m
    h, w = 16, 32
    T = relative_transform(pose_to_matrix([10, 5, 0, 0, 20, 0]), pose_to_matrix([11.2, 6.1, 0, 0, 47, 0]))
    row, col = 9, 12
    p_agent = np.array([[*_cell_centre(row, col, rng, h, w), 0.0]])
    want = transform_points(T, p_agent)[0, :2]
    out = warp_to_ego(_hot(h, w, row, col, c=1), T[None], rng)[0, 0].numpy()
    ys, xs = np.mgrid[0:h, 0:w]
    cx = rng[0] + (xs + 0.5) * (rng[3] - rng[0]) / w
    cy = rng[1] + (ys + 0.5) * (rng[4] - rng[1]) / h
    mass = out.sum()
    assert mass > 0.5
    got = np.array([(out * cx).sum() / mass, (out * cy).sum() / mass])
    assert np.linalg.norm(got - want) < 0.25 * 0.5  # within a quarter cell
    # Same through nearest sampling: the brightest cell is the one containing T p.
    near = warp_to_ego(_hot(h, w, row, col, c=1).float(), torch.tensor(T[None]), rng, mode="nearest")[0, 0]
    r, c = divmod(int(near.argmax()), w)
    assert abs(cx[r, c] - want[0]) <= 0.5 and abs(cy[r, c] - want[1]) <= 0.5


def test_mask_marks_covered_cells():
    m = warp_mask(_yaw_T(0, 2.0, 0.0), RANGE, (8, 8))
    assert m.shape == (1, 1, 8, 8)
    # The agent map covers ego x in [-2, 6]: columns 2..7 are inside.
    assert m[0, 0, :, 2:].eq(1).all() and m[0, 0, :, :2].eq(0).all()


def test_bad_inputs():
    with pytest.raises(ValueError, match="T_ego_from_agent"):
        warp_to_ego(torch.zeros(2, 1, 4, 4), np.eye(4)[None], RANGE)
    with pytest.raises(ValueError, match="lidar_range"):
        warp_to_ego(torch.zeros(1, 1, 4, 4), np.eye(4)[None], (0, 0, 0, 0, 1, 1))
    with pytest.raises(ValueError, match="mode"):
        warp_to_ego(torch.zeros(1, 1, 4, 4), np.eye(4)[None], RANGE, mode="cubic")


def test_gradient_flows_to_features():
    f = torch.randn(1, 2, 8, 8, requires_grad=True)
    warp_to_ego(f, _yaw_T(30, 1.0, 0.3), RANGE).sum().backward()
    assert f.grad.abs().sum() > 0
