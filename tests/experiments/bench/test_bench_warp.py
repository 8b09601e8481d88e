"""experiments/bench/warp_sensitivity.py: the virtual sensor sees the ego's own scan, nothing else."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.models.warp import warp_to_ego
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.data.synthetic import SyntheticReader

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from experiments.bench.warp_sensitivity import parse_poses, pose_matrix, virtual_input  # noqa: E402

RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)
PP = {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [8]},
      "backbone": {"layer_nums": [1], "layer_strides": [1], "num_filters": [8],
                   "upsample_strides": [1], "num_upsample_filters": [8]}, "shrink_channels": 8}


def _dataset():
    model = CooperativeDetector({"m1": PP}, RANGE, fusion="none")
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()}, augment=AugmentConfig(enabled=False))
    return model, CooperativeDataset(SyntheticReader(1), cfg, model.voxel_sizes(), train=False, cooperation="ego_only")


def test_parse_poses_and_pose_matrix():
    assert parse_poses("0,0,0;0.5,-1,90") == [(0.0, 0.0, 0.0), (0.5, -1.0, 90.0)]
    with pytest.raises(ValueError, match="dx,dy,yaw_deg"):
        parse_poses("1,2")
    M = pose_matrix(1.0, 2.0, 90.0)
    np.testing.assert_allclose(M[:2, :2], [[0, -1], [1, 0]], atol=1e-12)
    np.testing.assert_allclose(M[:2, 3], [1.0, 2.0])


def test_identity_pose_is_the_plain_ego_input():
    _, ds = _dataset()
    frame = ds.read_frame(0)
    sample = ds[0]
    plain, virt = sample.agents[0], virtual_input(ds, frame, np.eye(4), np.linalg.inv(sample.T_ego_from_world))
    np.testing.assert_allclose(sample.T_ego_from_world @ virt.T_world_from_agent, np.eye(4), atol=1e-9)
    assert torch.equal(virt.voxels.coords, plain.voxels.coords)
    assert torch.equal(virt.voxels.voxels, plain.voxels.voxels)


def test_virtual_pose_sees_the_same_points_and_warps_back():
    _, ds = _dataset()
    frame = ds.read_frame(0)
    M = pose_matrix(3.2, -1.6, 90.0)  # whole voxels and a quarter turn: the warp is exact
    T_ego_from_world = ds[0].T_ego_from_world
    virt = virtual_input(ds, frame, M, np.linalg.inv(T_ego_from_world))
    np.testing.assert_allclose(T_ego_from_world @ virt.T_world_from_agent, M, atol=1e-6)
    # occupancy of the virtual voxels, warped back with T = M, equals the ego's own occupancy
    def occupancy(vox):
        g = torch.zeros(1, 1, 80, 80, dtype=torch.float64)
        c = vox.coords.long()
        g[0, 0, c[:, 1], c[:, 2]] = 1.0
        return g
    back = warp_to_ego(occupancy(virt.voxels), M[None], RANGE)
    plain = occupancy(ds[0].agents[0].voxels)
    inner = slice(8, 72)  # the virtual map is shifted by 4 / 2 cells: compare where both cover
    torch.testing.assert_close(back[..., inner, inner], plain[..., inner, inner], atol=1e-9, rtol=0)
    ego_pts = ds.lidar_points(frame.agents[0], 64)
    assert virt.num_points == len(ego_pts)


def test_bench_runs_on_a_trained_run_folder(tmp_path):
    """tools/bench.py warp end to end on a one-epoch tiny run: identity pose = plain detection."""
    from tiny_runs import tiny_config, tiny_dataset
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
    import train
    from experiments.bench.warp_sensitivity import main
    torch.set_num_threads(1)
    root = tiny_dataset(tmp_path / "data")
    cfg = tiny_config(tmp_path, root, "tiny_warp", {"m1": PP}, {"fusion": "intermediate",
                                                                 "link": {"type": "full_feature"}})
    run = tmp_path / "run"
    assert train.main(["-y", str(cfg), "--model_dir", str(run), "--set", "model.score_threshold=0.0"]) == 0
    res = main(["--model_dir", str(run), "--poses", "0,0,0;0,0,30", "--max_frames", "2"])
    assert res["frames"] == 2 and res["fusion_op"] == "AttFusion"
    # identity: the copy IS the ego's input, so alone and fused read the same
    assert res["alone_dx0_dy0_yaw0"] == res["fused_dx0_dy0_yaw0"]
    assert "AP " in res["alone_dx0_dy0_yaw30"]
    with pytest.raises(ValueError, match="readings"):
        main(["--model_dir", str(run), "--readings", "both"])
