"""Recall split by who sees each GT object (ego / only a collaborator / nobody)."""
import numpy as np
import torch

from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.eval.visibility import VisibilityRecall, matched_gt, visibility_groups
from opencood_ext.geometry import points_in_boxes, transform_points

from opencood_ext.data.synthetic import make_frame

RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)


def _dataset(frame, cooperation="ego_only"):
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()}, augment=AugmentConfig(enabled=False))
    return CooperativeDataset([frame], cfg, {"m1": (0.8, 0.8, 4.0)}, train=False, cooperation=cooperation)


def _hide(agent, T_ego_from_agent, boxes):
    """Delete the agent's points inside ``boxes`` (ego frame)."""
    inside = points_in_boxes(transform_points(T_ego_from_agent, agent.lidar[:, :3]), boxes).any(axis=1)
    agent.lidar = agent.lidar[~inside]
    agent.lidar_beams = {}


def test_groups_follow_each_agents_points_even_for_an_ego_only_dataset():
    frame = make_frame(seed=1, num_agents=2, num_objects=6)
    ds = _dataset(frame)
    gt = ds[0].gt_boxes
    assert len(gt) >= 4
    ego, other = frame.agents
    T_ego_from_other = np.linalg.inv(ego.T_world_from_lidar) @ other.T_world_from_lidar
    _hide(ego, np.eye(4), gt[:2])              # box 0: only the collaborator sees it
    _hide(other, T_ego_from_other, gt[1:2])    # box 1: nobody sees it
    groups = visibility_groups(ds, 0, gt)
    assert groups.tolist() == [1, 2] + [0] * (len(gt) - 2)
    # an agent sees its own vehicle even without a point on it
    own = np.array([[0.3, -0.2, -1.2, 4.0, 2.0, 1.5, 0.4]])
    assert visibility_groups(ds, 0, np.concatenate([gt, own]))[-1] == 0
    far = own + [[0, 3.0, 0, 0, 0, 0, 0]]
    assert visibility_groups(ds, 0, np.concatenate([gt, far]))[-1] == 2
    # the ego-only dataset still feeds the model just the ego
    assert len(ds[0].agents) == 1


def test_matched_gt_is_greedy_by_score():
    gt = np.array([[0, 0, 0, 4, 2, 1.5, 0], [10, 0, 0, 4, 2, 1.5, 0]], dtype=np.float64)
    pred = np.array([[0.2, 0, 0, 4, 2, 1.5, 0],     # good match of GT 0, low score
                     [0.5, 0, 0, 4, 2, 1.5, 0],     # worse match of GT 0, high score: takes it
                     [13, 0, 0, 4, 2, 1.5, 0]])     # IoU 0.14 with GT 1: no match at 0.5
    hit = matched_gt(pred, np.array([0.3, 0.9, 0.8]), gt, 0.5)
    assert hit.tolist() == [True, False]
    assert matched_gt(pred, np.array([0.3, 0.9, 0.8]), gt, 0.1).tolist() == [True, True]
    assert matched_gt(np.zeros((0, 7)), np.zeros(0), gt, 0.5).tolist() == [False, False]


def test_recall_accumulates_per_group():
    rec = VisibilityRecall(0.5)
    gt = np.array([[0, 0, 0, 4, 2, 1.5, 0], [10, 0, 0, 4, 2, 1.5, 0], [20, 0, 0, 4, 2, 1.5, 0]])
    rec.add(np.array([0, 1, 1]), gt[1:2], np.array([0.9]), gt)
    rec.add(np.array([0]), np.zeros((0, 7)), np.zeros(0), gt[:1])
    s = rec.summary()
    assert s["ego"] == {"gt": 2, "recall": 0.0}
    assert s["collaborators_only"] == {"gt": 2, "recall": 0.5}
    assert s["nobody"] == {"gt": 0, "recall": None}


def test_evaluate_reports_the_split(tmp_path):
    from opencood_ext.eval.evaluate import evaluate
    from opencood_ext.models.detector import CooperativeDetector
    torch.manual_seed(0)
    pp = {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [16]},
          "backbone": {"layer_nums": [1], "layer_strides": [2], "num_filters": [16], "upsample_strides": [1],
                       "num_upsample_filters": [16]}, "shrink_channels": 16}
    model = CooperativeDetector({"m1": pp}, RANGE, fusion="none")
    frame = make_frame(seed=2, num_agents=2, num_objects=5)
    res = evaluate(model, _dataset(frame), progress=False)
    split = res.recall_by_visibility
    assert sum(v["gt"] for v in split.values()) == res.num_gt
    assert "recall@0.5 by who sees the object" in res.table()
    loc = res.localisation  # box precision, split the same way
    assert loc["all"]["gt"] == res.num_gt == sum(loc[g]["gt"] for g in split)
    assert res.to_json()["localisation"] == loc
