"""LiDAR and camera models on a tiny synthetic scene, specs, and the OPV2V camera rig."""
from pathlib import Path

import numpy as np
import pytest
import yaml

from opencood_ext.sim import meshes as M
from opencood_ext.sim.agent_types import AgentTypesConfig
from opencood_ext.sim.camera import CameraModel
from opencood_ext.sim.lidar import LidarModel
from opencood_ext.sim.scene import RayScene, SurfaceTable
from opencood_ext.sim.world import CameraSpec, LidarSpec, project_points
from opencood_ext.geometry import invert_transform, pose_to_matrix

FIXTURE = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "v2xset_real" / "validate" \
    / "2021_08_21_17_30_41" / "4279" / "000069.yaml"


def _scene(wall_x=10.0, own_box=True):
    """Ground plane z=0, a wall facing -x at ``wall_x``, and (object 7) a box around the sensor."""
    table = SurfaceTable()
    ground = table.add("ground", (0.3, 0.3, 0.3), 1.0)
    wall = table.add("building", (0.8, 0.2, 0.2), 1.0)
    quad = (np.array([[-200, -200, 0], [200, -200, 0], [200, 200, 0], [-200, 200, 0]], float),
            np.array([[0, 1, 2], [0, 2, 3]]))
    parts = [(quad, ground), (M.box([wall_x + 0.5, 0, 5], [1.0, 40.0, 10.0]), wall)]
    if own_box:
        parts.append((M.box([0.0, 0.0, 0.9], [4.6, 2.0, 1.2]), table.add("vehicle", (0, 0, 1), 0.9, object_id=7)))
    mesh = M.merge([m for m, _ in parts])
    surf = np.concatenate([np.full(len(m[1]), s) for m, s in parts])
    return RayScene(table, mesh, surf)


def test_default_lidar_is_opv2v_sweep():
    spec = LidarSpec()
    model = LidarModel(spec)
    assert model.rays == 64 * 1016   # 1.3M pts/s / 20 Hz over 64 channels
    assert spec.swept_degrees() == 360.0
    attrs = spec.carla_attributes()
    assert attrs["channels"] == "64" and attrs["upper_fov"] == "2.0" and attrs["dropoff_zero_intensity"] == "0.15"
    with pytest.raises(ValueError, match="keep_every"):
        LidarSpec(keep_every=3)
    with pytest.raises(ValueError, match="upper_fov"):
        LidarSpec(upper_fov=-30.0)


def test_lidar_ranges_intensity_dropoff_and_self_exclusion():
    scene = _scene()
    spec = LidarSpec(points_per_second=400_000)
    model = LidarModel(spec)
    T = pose_to_matrix([0, 0, 1.9, 0, 0, 0])
    scan = model.scan(scene, T, np.random.default_rng(0), exclude_ids=[7])
    assert scan.points.dtype == np.float32 and scan.points.shape[1] == 4
    assert not (scan.object_id == 7).any()
    inside_own = (np.abs(scan.points[:, 0]) < 2.3) & (np.abs(scan.points[:, 1]) < 1.0) & (scan.points[:, 2] > -1.9)
    assert not inside_own.any()
    # returns on the wall straight ahead: range = wall distance / cos, noise ~ 0.02 m
    p = scan.points
    head_on = (np.abs(p[:, 1]) < 0.5) & (p[:, 2] > -1.0) & (p[:, 0] > 5)
    assert head_on.sum() > 20
    d = np.linalg.norm(p[head_on, :3], axis=1)
    expected = 10.0 / (p[head_on, 0] / d)
    err = d - expected
    assert abs(err.mean()) < 0.01 and 0.01 < err.std() < 0.03
    # intensity: exp(-0.004 d) for a head-on hit with reflectivity 1, falls with range
    assert np.allclose(p[head_on, 3], np.exp(-0.004 * d), atol=0.03)
    ground = scan.surface_class == 0
    near = ground & (np.linalg.norm(p[:, :2], axis=1) < 8)
    far = ground & (np.linalg.norm(p[:, :2], axis=1) > 40)
    assert p[far, 3].mean() < p[near, 3].mean()
    assert (p[:, 3] >= 0).all() and (p[:, 3] <= 1).all()
    # general drop-off keeps ~90 % of the bright wall returns
    clean = LidarSpec(points_per_second=400_000, dropoff_general_rate=0.0, dropoff_intensity_limit=0.0,
                      noise_stddev=0.0)
    full = LidarModel(clean).scan(scene, T, np.random.default_rng(0), exclude_ids=[7])
    wall_full = (full.surface_class == 1).sum()
    assert 0.86 < (scan.surface_class == 1).sum() / wall_full < 0.94


def test_beam_reductions_keep_every_nth_ring():
    scene = _scene(wall_x=6.0, own_box=False)
    spec = LidarSpec(points_per_second=260_000, dropoff_general_rate=0.0)
    scan = LidarModel(spec).scan(scene, pose_to_matrix([0, 0, 1.9, 0, 0, 0]), np.random.default_rng(1))
    ring_angles = np.linspace(spec.upper_fov, spec.lower_fov, spec.channels)
    for keep, beams in ((1, 64), (2, 32), (4, 16)):
        pts = scan.keep_rings(keep).points
        elev = np.degrees(np.arctan2(pts[:, 2], np.hypot(pts[:, 0], pts[:, 1])))
        nearest = np.abs(elev[:, None] - ring_angles[None]).argmin(axis=1)
        assert np.abs(elev - ring_angles[nearest]).max() < 0.01      # noise runs along the ray
        assert set(np.unique(nearest)) == set(range(0, 64, keep)) and len(np.unique(nearest)) == beams


def test_camera_intrinsics_scale_and_pixel_rays_project_back():
    K = CameraSpec(width=800, height=600, fov=100.0).K
    assert K[0, 0] == pytest.approx(335.64, abs=0.01) and K[1, 1] == K[0, 0]
    assert (K[0, 2], K[1, 2]) == (400.0, 300.0)
    small = CameraSpec(width=400, height=300).K
    assert small[0, 0] == pytest.approx(K[0, 0] / 2) and small[1, 2] == 150.0
    model = CameraModel(CameraSpec(width=64, height=48))
    rows, cols = np.meshgrid(np.arange(48), np.arange(64), indexing="ij")
    uv, front = project_points(model.spec.K, model.directions * 7.0)
    assert front.all()
    assert np.array_equal(np.floor(uv[:, 0]).astype(int), cols.ravel())
    assert np.array_equal(np.floor(uv[:, 1]).astype(int), rows.ravel())


def test_camera_render_colours_depth_and_see_through_own_vehicle():
    scene = _scene(wall_x=10.0)
    model = CameraModel(CameraSpec(width=80, height=60))
    T = pose_to_matrix([2.5, 0.0, 1.0, 0, 0, 0])     # front camera looking at the wall
    r = model.render(scene, T, np.array([0.0, 0.0, 1.0]), shadows=True, exclude_ids=[7])
    assert r.image.shape == (60, 80, 3) and r.image.dtype == np.uint8
    centre = r.depth[30, 40]
    assert centre == pytest.approx(7.5, abs=0.05)                      # planar depth to the wall
    assert r.image[30, 40, 0] > r.image[30, 40, 2]                     # red wall
    back = model.render(scene, pose_to_matrix([0.0, 0.0, 1.0, 0, 180, 0]), np.array([0.0, 0.0, 1.0]),
                        exclude_ids=[7])
    assert not (back.object_id == 7).any()                             # inside its own car: see-through
    assert (back.depth[-10:] < 100).all()                              # but the ground below is seen


def test_rig_reproduces_fixture_camera_extrinsics():
    if not FIXTURE.exists():
        pytest.skip("../shared/fixtures is not present (a user's clone)")
    d = yaml.safe_load(FIXTURE.read_text())
    rig = AgentTypesConfig()
    T_v_l = pose_to_matrix(rig.lidar.mount)
    for spec in rig.cameras.specs():
        cam = d[spec.name]
        T_l_c = invert_transform(T_v_l) @ pose_to_matrix(spec.mount)
        # OPV2V's yaml 'extrinsic' is T_camera_from_lidar (checked against 'cords')
        assert np.allclose(invert_transform(T_l_c), np.array(cam["extrinsic"]), atol=1e-3), spec.name
        assert np.allclose(spec.K, np.array(cam["intrinsic"]), atol=1e-3)
