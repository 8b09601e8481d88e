"""The warp under ``protocol: reference`` is the reference's (issue 50 item 4), on HEAL's full
204.8 m x 102.4 m range, with flat and with tilted (roll, pitch) collaborators.

The reference, restated from its source (OpenCOOD / HEAL / GenComm ``transformation_utils.py``
``get_pairwise_transformation`` and ``normalize_pairwise_tfm``, ``torch_transformation_utils.py``
``warp_affine_simple``): ``pairwise_t_matrix[0, j] = solve(T_world_j, T_world_ego)`` in float64 (its
dataset's numpy matrices, collated as they are), the 2 x 3 BEV part taken as it is (roll and pitch
left in), ``[0, 1]`` times H / W, ``[1, 0]`` times W / H, the translation over W / 2 and H / 2
(a range centred on the agent), ``affine_grid`` on that float64 matrix, the grid cast to the
features' dtype, ``grid_sample`` (bilinear, zeros, ``align_corners`` False).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import test_reference_e2e as e2e
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.frame import AgentObs, Frame
from opencood_ext.geometry import invert_transform, pose_to_matrix, transform_points
from opencood_ext.models.warp import warp_rule, warp_to_ego
from test_reference_e2e import no_noise  # noqa: F401  (diffusion noise zero on both sides)

FULL = [-102.4, -51.2, -3.0, 102.4, 51.2, 1.0]  # HEAL's / GenComm's OPV2V range
# collaborators' poses in the ego's frame [x, y, z, roll, yaw, pitch] (m, degrees)
FLAT = ([8.0, 3.0, 0.0, 0.0, 20.0, 0.0], [-6.0, -2.5, 0.0, 0.0, -35.0, 0.0])
TILTED = ([8.0, 3.0, 0.6, 1.5, 20.0, -2.0], [-6.0, -2.5, -0.4, -2.0, -35.0, 1.0])


def reference_warp(x, T_world_from_agent, lidar_range):
    """normalize_pairwise_tfm + warp_affine_simple for the ego's row (module docstring)."""
    T = torch.as_tensor(T_world_from_agent, dtype=torch.float64)
    W, H = lidar_range[3] - lidar_range[0], lidar_range[4] - lidar_range[1]
    m = torch.linalg.solve(T, T[0].expand_as(T))[:, [0, 1]][:, :, [0, 1, 3]].clone()
    m[:, 0, 1] *= H / W
    m[:, 1, 0] *= W / H
    m[:, 0, 2] = m[:, 0, 2] / W * 2
    m[:, 1, 2] = m[:, 1, 2] / H * 2
    return F.grid_sample(x, F.affine_grid(m, list(x.shape), align_corners=False).to(x), align_corners=False)


def _poses(offsets):
    ego = pose_to_matrix([230.0, -41.0, 0.3, 0.4, 63.0, -0.7])  # a world pose with its own tilt
    return np.stack([ego] + [ego @ pose_to_matrix(o) for o in offsets])


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("cells", [(128, 256), (64, 128)], ids=["0.8m", "1.6m"])
@pytest.mark.parametrize("offsets", [FLAT, TILTED], ids=["flat", "tilted"])
def test_the_reference_rule_is_the_reference_warp(cells, offsets):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, *cells, generator=g)
    Tw = _poses(offsets)
    T_ego_from = np.stack([invert_transform(Tw[0]) @ T for T in Tw])
    want = reference_warp(x, Tw, FULL)
    ours = warp_to_ego(x, T_ego_from, FULL, rule="reference")
    assert _rel(ours, want) <= 1e-6
    with warp_rule("reference"):  # what the detector sets around its fusion under protocol reference
        assert torch.equal(warp_to_ego(x, T_ego_from, FULL), ours)
    native = warp_to_ego(x, T_ego_from, FULL)  # outside the block: the native rule (yaw only, float32 grid)
    assert _rel(native[1:], want[1:]) > (1e-2 if offsets is TILTED else 1e-6)


def test_a_bad_rule_is_refused():
    with pytest.raises(ValueError, match="warp rule must be 'native' or 'reference'"):
        warp_to_ego(torch.zeros(1, 1, 2, 2), np.eye(4)[None], FULL, rule="heal")
    with pytest.raises(ValueError, match="warp rule"), warp_rule("heal"):
        pass


def _frame(offsets):
    """The fixture's real scan (ego) and two collaborators seeing the same points from ``offsets``."""
    real = e2e._frame()
    ego = real.agents[0]
    world = transform_points(ego.T_world_from_lidar, ego.lidar[:, :3].astype(np.float64))
    agents = [ego]
    for k, offset in enumerate(offsets):
        T = ego.T_world_from_lidar @ pose_to_matrix(offset)
        local = transform_points(invert_transform(T), world)
        agents.append(AgentObs(9000 + k, "", T, np.c_[local, ego.lidar[:, 3]].astype(np.float32),
                               visible_ids=ego.visible_ids))
    return Frame(real.scenario, real.timestamp, agents, real.objects, split="validate")


def _batch(offsets):
    cfg = DataConfig(lidar_range=tuple(FULL), augment=AugmentConfig(enabled=False), modality="all:m1",
                     agent_types={"m1": AgentTypeData(lidar_beams=64)}, max_agents=3)
    ds = CooperativeDataset(e2e._Reader([_frame(offsets)]), cfg, {"m1": e2e.VOXEL}, train=False,
                            cooperation="all", protocol="reference")
    return collate_samples([ds[0]])


@pytest.mark.parametrize("gencomm_keys", [False, True], ids=["heal_att", "gencomm_stage1"])
@pytest.mark.parametrize("offsets", [FLAT, TILTED], ids=["flat", "tilted"])
def test_full_range_models_give_the_reference_maps(monkeypatch, no_noise, offsets, gencomm_keys):  # noqa: F811
    """HEAL's heter_model_baseline (attention) and GenComm stage 1, imported, on the full range:
    the head maps of the reference's forward (tests/helpers/reference_forward.py, its warp as above) to 1e-4
    of their magnitude (the issue measured HEAL's at 1.3e-4 with the native warp)."""
    monkeypatch.setattr(e2e, "RANGE", FULL)
    batch = _batch(offsets)
    assert batch.num_agents == 3
    link = e2e.GENCOMM_LINK if gencomm_keys else {"type": "full_feature", "wire_dtype": "float32"}
    model = e2e._model(["m1"], link)
    sd = e2e._checkpoint(e2e._shapes(["m1"], gencomm_keys), seed=6)
    e2e._load(model, sd)
    errors = e2e._compare(model, sd, batch, gencomm_keys)
    assert max(errors) < 1e-4, errors
