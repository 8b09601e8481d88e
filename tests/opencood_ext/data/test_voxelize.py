"""Voxelisation: grid arithmetic, coords [z, y, x], caps, collation, input dataclasses."""
import numpy as np
import pytest
import torch

from opencood_ext.data.voxelize import VoxelData, Voxelizer, collate_voxels, grid_shape
from opencood_ext.data.inputs import CameraInput, LidarInput

RANGE = [-4.0, -2.0, -3.0, 4.0, 2.0, 1.0]


def test_grid_shape_and_errors():
    assert grid_shape(RANGE, [0.5, 0.25, 4.0]) == (1, 16, 16)
    assert grid_shape([-102.4, -102.4, -3, 102.4, 102.4, 1], [0.1, 0.1, 0.1]) == (40, 2048, 2048)
    with pytest.raises(ValueError, match="whole number of voxels"):
        grid_shape(RANGE, [0.3, 0.25, 4.0])
    with pytest.raises(ValueError, match="6 values"):
        grid_shape(RANGE[:5], [0.5, 0.5, 4.0])


def test_points_land_in_expected_voxels():
    vox = Voxelizer([0.5, 0.5, 1.0], RANGE, max_points_per_voxel=4)
    pts = np.array([
        [0.1, 0.1, -2.5, 0.3],     # x col 8, y row 4, z layer 0
        [0.2, 0.4, -2.1, 0.7],     # same voxel
        [-3.9, 1.9, 0.5, 1.0],     # col 0, row 7, layer 3
        [5.0, 0.0, 0.0, 0.5],      # outside x
        [0.0, 0.0, 1.5, 0.5],      # outside z
        [np.nan, 0.0, 0.0, 0.5],   # dropped
    ], dtype=np.float32)
    d = vox(pts)
    assert isinstance(d, VoxelData)
    got = {tuple(c.tolist()): int(n) for c, n in zip(d.coords, d.num_points)}
    assert got == {(0, 4, 8): 2, (3, 7, 0): 1}
    i = [tuple(c.tolist()) for c in d.coords].index((0, 4, 8))
    np.testing.assert_allclose(d.voxels[i, :2].numpy(), pts[:2], rtol=0, atol=1e-6)
    assert torch.all(d.voxels[i, 2:] == 0)  # padding slots are zero


def test_caps_and_results_survive_next_call():
    vox = Voxelizer([1.0, 1.0, 4.0], RANGE, max_points_per_voxel=3, max_voxels=2)
    pts = np.array([[0.5, 0.5, 0, 1]] * 5 + [[1.5, 0.5, 0, 1], [2.5, 0.5, 0, 1]], dtype=np.float32)
    d = vox(pts)
    assert d.voxels.shape == (2, 3, 4)
    assert sorted(d.num_points.tolist()) == [1, 3]
    first = d.coords.clone()
    vox(np.array([[-3.5, -1.5, 0, 1]], dtype=np.float32))  # reuses spconv's buffers
    assert torch.equal(d.coords, first)


def test_empty_and_bad_input():
    vox = Voxelizer([0.5, 0.5, 4.0], RANGE)
    d = vox(np.zeros((0, 4), np.float32))
    assert d.voxels.shape[0] == 0 and d.coords.shape == (0, 3)
    with pytest.raises(ValueError, match=r"\(N, 4\)"):
        vox(np.zeros((3, 3), np.float32))


def test_collate_and_lidar_input():
    vox = Voxelizer([0.5, 0.5, 4.0], RANGE)
    a = vox(np.array([[0.1, 0.1, 0, 1]], np.float32))
    b = vox(np.array([[1.1, 0.1, 0, 1], [-1.1, 0.1, 0, 1]], np.float32))
    batch = collate_voxels([a, b, vox(np.zeros((0, 4), np.float32))])
    assert batch.coords.shape == (3, 4)
    assert batch.coords[:, 0].tolist() == [0, 1, 1]
    assert torch.equal(batch.coords[1:, 1:], b.coords)
    li = LidarInput.from_batch(batch, num_agents=3)
    assert li.num_agents == 3 and li.voxels.shape[0] == 3
    with pytest.raises(ValueError, match="num_agents"):
        LidarInput.from_batch(batch, num_agents=1)


def test_camera_input_validation():
    imgs = torch.zeros(2, 4, 3, 8, 16)
    K = torch.eye(3).expand(2, 4, 3, 3)
    T = torch.eye(4).expand(2, 4, 4, 4)
    assert CameraInput(imgs, K, T, torch.zeros(2, 4, 8, 16)).num_agents == 2
    with pytest.raises(ValueError, match="K must be"):
        CameraInput(imgs, torch.eye(3).expand(2, 3, 3, 3), T)
    with pytest.raises(ValueError, match="depth must be"):
        CameraInput(imgs, K, T, torch.zeros(2, 4, 8, 8))
