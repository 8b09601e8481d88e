"""The ego's own feature in training: its points are already in the augmented ego frame, so the
receiver must hand its feature through untouched (not resample it by a pose ~1e-14 off identity)."""
import numpy as np
import torch

from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.models.fusion_methods import ego_features
from opencood_ext.data.synthetic import SyntheticReader
from tiny_runs import PP

RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)


def test_augmented_lidar_ego_feature_is_not_resampled():
    torch.manual_seed(0)
    model = CooperativeDetector({"m1": PP}, RANGE)
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()},
                     augment=AugmentConfig(enabled=True, rotation_deg=45.0))
    ds = CooperativeDataset(SyntheticReader(2), cfg, model.voxel_sizes(), train=True, cooperation="all")
    batch = collate_samples([ds[0], ds[1]])
    ego = batch.ego_index
    T = (batch.T_ego_from_world @ batch.T_world_from_agent[ego]).numpy()
    plain = CooperativeDataset(SyntheticReader(2), cfg, model.voxel_sizes(), train=False, cooperation="all")
    assert not np.allclose(batch.T_ego_from_world[0].numpy(), plain[0].T_ego_from_world)  # augmented
    assert np.abs(T - np.eye(4)).max() < 1e-9
    feats = torch.randn(batch.num_agents, 4, 16, 16)
    assert torch.equal(ego_features(model, batch, feats), feats[ego])
