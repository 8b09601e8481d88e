"""The pure-PyTorch voxeliser: hand-computed cases, backend choice, and exact equality with
spconv's CPU ``PointToVoxel`` (skipped only where spconv is not installed)."""
import importlib.util

import numpy as np
import pytest
import torch

from opencood_ext.data.voxelize import Voxelizer, voxelize_points
from opencood_ext.deps import MissingDependency

RANGE = [-4.0, -2.0, -3.0, 4.0, 2.0, 1.0]
HAS_SPCONV = importlib.util.find_spec("spconv") is not None
needs_spconv = pytest.mark.skipif(not HAS_SPCONV, reason="spconv is not installed: nothing to compare with")


def _pts(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_hand_computed_order_caps_and_padding():
    # 1 x 1 x 4 m voxels on RANGE: x col = floor(x + 4), y row = floor(y + 2), one z layer
    pts = _pts([[0.5, 0.5, 0, 1],    # voxel A (col 4, row 2): first seen
                [-3.5, -1.5, 0, 2],  # voxel B (col 0, row 0)
                [0.6, 0.6, 0, 3],    # A
                [0.7, 0.7, 0, 4],    # A: past the cap of 2, dropped
                [1.5, 0.5, 0, 5],    # voxel C: past max_voxels 2, dropped
                [-3.4, -1.4, 0, 6]])  # B again after the cap was reached: kept
    voxels, coords, num = voxelize_points(pts, [1.0, 1.0, 4.0], RANGE, 2, 2)
    assert coords.dtype == num.dtype == torch.int32 and voxels.dtype == torch.float32
    assert coords.tolist() == [[0, 2, 4], [0, 0, 0]]
    assert num.tolist() == [2, 2]
    assert torch.equal(voxels[0], pts[[0, 2]]) and torch.equal(voxels[1], pts[[1, 5]])
    voxels, coords, num = voxelize_points(pts[:2], [1.0, 1.0, 4.0], RANGE, 3, 5)
    assert voxels.shape == (2, 3, 4) and torch.all(voxels[:, 1:] == 0)  # zero padding


def test_hand_computed_boundaries_and_non_finite():
    pts = _pts([[-4.0, -2.0, -3.0, 1],   # on the range's min corner: voxel (0, 0, 0)
                [-3.0, -2.0, -3.0, 2],   # exactly on the first x boundary: column 1
                [4.0, 0.0, 0.0, 3],      # on xmax: out
                [-4.0001, 0.0, 0.0, 4],  # just below xmin: out
                [np.nan, 0.0, 0.0, 5], [0.0, np.inf, 0.0, 6], [0.0, 0.0, -np.inf, 7],
                [1e30, 0.0, 0.0, 8], [0.0, -1e30, 0.0, 9],
                [0.5, 0.5, 0.5, np.nan]])  # only intensity non-finite: kept by voxelize_points
    voxels, coords, num = voxelize_points(pts, [1.0, 1.0, 4.0], RANGE, 4, 100)
    assert coords.tolist() == [[0, 0, 0], [0, 0, 1], [0, 2, 4]]
    assert num.tolist() == [1, 1, 1] and torch.isnan(voxels[2, 0, 3])
    d = Voxelizer([1.0, 1.0, 4.0], RANGE, 4, 100, backend="torch")(pts.numpy())
    assert d.coords.tolist() == [[0, 0, 0], [0, 0, 1]]  # the Voxelizer drops any non-finite row


def test_empty_single_and_bad_input():
    voxels, coords, num = voxelize_points(torch.zeros(0, 4), [0.5, 0.5, 4.0], RANGE, 8, 10)
    assert voxels.shape == (0, 8, 4) and coords.shape == (0, 3) and num.shape == (0,)
    voxels, coords, num = voxelize_points(_pts([[0.1, 0.1, 0.1, 0.5]]), [0.5, 0.5, 4.0], RANGE, 8, 10)
    assert coords.tolist() == [[0, 4, 8]] and num.tolist() == [1] and voxels[0, 0, 3] == 0.5
    with pytest.raises(ValueError, match=r"\(N, C >= 3\)"):
        voxelize_points(torch.zeros(5, 2), [0.5, 0.5, 4.0], RANGE, 8, 10)
    with pytest.raises(ValueError, match="max_points_per_voxel"):
        voxelize_points(torch.zeros(5, 4), [0.5, 0.5, 4.0], RANGE, 0, 10)
    with pytest.raises(ValueError, match="backend must be one of auto, torch, spconv; got 'cuda'"):
        Voxelizer([0.5, 0.5, 4.0], RANGE, backend="cuda")


def test_row_width_without_a_matching_dtype_falls_back():
    """Three channels (12-byte rows) take the row-copy path; same result as four channels' first 3."""
    pts = torch.rand(500, 4) * 8 - torch.tensor([4.0, 2.0, 3.0, 0.0])
    a = voxelize_points(pts, [0.5, 0.5, 0.5], RANGE, 3, 40)
    b = voxelize_points(pts[:, :3], [0.5, 0.5, 0.5], RANGE, 3, 40)
    assert torch.equal(a[0][..., :3], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


def test_spconv_backend_missing_names_the_choice(monkeypatch):
    import opencood_ext.data.voxelize as vx

    def missing(submodule="spconv.pytorch"):
        raise MissingDependency(f"cannot import {submodule}; install spconv")

    monkeypatch.setattr(vx, "require_spconv", missing)
    with pytest.raises(MissingDependency, match="Voxelizer backend 'spconv'"):
        Voxelizer([0.5, 0.5, 4.0], RANGE, backend="spconv")
    assert Voxelizer([0.5, 0.5, 4.0], RANGE).backend == "torch"  # auto without spconv


def _cloud(n, seed, voxel_size, rng_=RANGE):
    """Random points over a box a bit larger than the range, a third of them snapped onto voxel
    boundaries, a few exactly on the range's faces, plus NaN / inf / huge rows."""
    g = np.random.default_rng(seed)
    lo, hi, v = np.array(rng_[:3]), np.array(rng_[3:]), np.array(voxel_size)
    xyz = g.uniform(lo - 0.3, hi + 0.3, (n, 3))
    snap = g.random(n) < 0.33
    xyz[snap] = lo + np.round((xyz[snap] - lo) / v) * v
    face, axis = g.integers(0, n, 12), g.integers(0, 3, 12)
    xyz[face, axis] = np.where(g.random(12) < 0.5, lo[axis], hi[axis])
    pts = np.column_stack([xyz, g.random(n)]).astype(np.float32)
    bad = g.integers(0, n, 8)
    pts[bad, g.integers(0, 3, 8)] = [np.nan, np.inf, -np.inf, 1e30, -1e30, np.nan, np.inf, 3e9]
    return torch.from_numpy(pts)


def _spconv(pts, voxel_size, per_voxel, max_voxels):
    from spconv.pytorch.utils import PointToVoxel
    gen = PointToVoxel(vsize_xyz=list(voxel_size), coors_range_xyz=RANGE, num_point_features=4,
                       max_num_voxels=max_voxels, max_num_points_per_voxel=per_voxel)
    return gen(pts)


@needs_spconv
@pytest.mark.parametrize("voxel_size,per_voxel,max_voxels,n", [
    ((0.4, 0.4, 4.0), 32, 32000, 6000),   # pillars, nothing capped
    ((0.4, 0.4, 4.0), 3, 32000, 6000),    # more points per pillar than the cap
    ((0.1, 0.1, 0.1), 5, 300, 6000),      # more voxels than the cap
    ((0.25, 0.5, 0.5), 2, 50, 40),        # few points, both caps
    ((0.5, 0.5, 4.0), 4, 10, 1),          # one point
])
def test_equals_spconv_point_to_voxel(voxel_size, per_voxel, max_voxels, n):
    for seed in range(3):
        pts = _cloud(n, seed, voxel_size)
        finite = pts[torch.isfinite(pts).all(dim=1)].contiguous()
        ref = _spconv(finite, voxel_size, per_voxel, max_voxels)
        got = voxelize_points(finite, voxel_size, RANGE, per_voxel, max_voxels)
        for name, a, b in zip(("voxels", "coords", "num_points"), got, ref):
            assert a.dtype == b.dtype and torch.equal(a, b), (name, seed)
        # through the Voxelizer (which drops non-finite rows), both backends, from the raw cloud
        d_t, d_s = (Voxelizer(voxel_size, RANGE, per_voxel, max_voxels, backend=b)(pts)
                    for b in ("torch", "spconv"))
        assert all(torch.equal(getattr(d_t, f), getattr(d_s, f)) for f in ("voxels", "coords", "num_points"))


@needs_spconv
def test_equals_spconv_on_empty_and_range_edges():
    ref = _spconv(torch.zeros(0, 4), (0.5, 0.5, 4.0), 4, 10)
    got = voxelize_points(torch.zeros(0, 4), (0.5, 0.5, 4.0), RANGE, 4, 10)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    # every grid line and face of the range, with neighbours one float32 step either side
    xs = np.arange(-4.0, 4.01, 0.4, dtype=np.float32)
    xs = np.concatenate([xs, np.nextafter(xs, np.float32(9)), np.nextafter(xs, np.float32(-9))])
    ys = np.float32([-2.0, -1.6, 0.0, 1.6, 2.0, np.nextafter(np.float32(2.0), np.float32(0))])
    zs = np.float32([-3.0, -1.0, 1.0, np.nextafter(np.float32(1.0), np.float32(0))])
    grid = np.stack(np.meshgrid(xs, ys, zs, indexing="ij"), -1).reshape(-1, 3)
    pts = torch.from_numpy(np.column_stack([grid, np.arange(len(grid), dtype=np.float32)]))
    pts = pts[torch.randperm(len(pts), generator=torch.Generator().manual_seed(0))]
    for size in ((0.4, 0.4, 4.0), (0.4, 0.4, 0.4)):
        ref = _spconv(pts, size, 3, 5000)
        got = voxelize_points(pts, size, RANGE, 3, 5000)
        assert all(torch.equal(a, b) for a, b in zip(got, ref)), size


@needs_spconv
def test_auto_backend_is_spconv_when_installed():
    assert Voxelizer([0.5, 0.5, 4.0], RANGE).backend == "spconv"
    assert Voxelizer([0.5, 0.5, 4.0], RANGE, backend="torch").backend == "torch"
