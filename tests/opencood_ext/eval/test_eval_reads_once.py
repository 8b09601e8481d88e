"""evaluate() reads each test frame once (the sample, who sees each object and the BEV image all
come from that read, in a DataLoader worker too) and its numbers are those of the reading path it
replaced: the visibility split, AP and box precision recomputed here frame by frame from
``visibility_groups(dataset, i, gt)`` (which reads the frame itself) and the AP accumulator."""
import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from opencood_ext.comm.messages import Delivery, Messages
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.synthetic import make_frame
from opencood_ext.eval.ap import APAccumulator
from opencood_ext.eval.evaluate import _collate_item, _EvalFrames, evaluate
from opencood_ext.eval.localisation import LocalisationStats
from opencood_ext.eval.visibility import GROUPS, MIN_POINTS, VisibilityRecall, visibility_groups
from opencood_ext.geometry import points_per_box
from opencood_ext.geometry import points_in_boxes, transform_points
from opencood_ext.models.detector import Prediction
from opencood_ext.postprocess import Detections

RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)


class CountingReader(list):
    """A list of frames that counts how often each is read."""

    def __init__(self, frames):
        super().__init__(frames)
        self.reads = [0] * len(frames)

    def __getitem__(self, i):
        self.reads[i] += 1
        return super().__getitem__(i)


def detections(gt: np.ndarray):
    """Every third GT box missed, every other one shifted 0.6 m (a worse IoU), one false positive."""
    gt = np.asarray(gt, np.float32)
    keep = [k for k in range(len(gt)) if k % 3 != 2]
    boxes = gt[keep].copy()
    boxes[1::2, 0] += 0.6
    boxes = np.concatenate([boxes, [[25.0, 25.0, -1.0, 4.0, 2.0, 1.5, 0.3]]]).astype(np.float32)
    scores = np.linspace(0.9, 0.2, len(boxes)).astype(np.float32)
    return boxes, scores


class Known(nn.Module):
    fusion = "intermediate"

    def __init__(self):
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))  # evaluate() reads the device from a parameter

    def predict(self, batch, channel=None, keys=None):
        boxes, scores = detections(batch.gt_boxes[0].numpy())
        nothing = Messages.empty("bev")
        return Prediction([Detections(boxes=torch.from_numpy(boxes), scores=torch.from_numpy(scores),
                                      labels=torch.zeros(len(boxes), dtype=torch.long))],
                          Delivery(nothing, nothing, []))


def _frames():
    """Four frames of three m1 agents; in each, the ego's points are deleted on two objects (one the
    second agent still sees, one nobody does), so all three visibility groups occur."""
    frames = []
    for s in range(4):
        f = make_frame(seed=s, num_agents=3, num_objects=8, scenario=f"scene{s // 2}", timestamp=f"{s:06d}")
        for k, obj_id in enumerate(sorted(f.objects)[:2]):
            o = f.objects[obj_id]
            box = np.r_[o.location + o.center, 2 * o.extent, np.radians(o.angle[1])][None]
            for a in f.agents[: 1 if k == 0 else 3]:
                T = np.linalg.inv(a.T_world_from_lidar)
                local = transform_points(T, box[:, :3])
                yaw = box[0, 6] + np.arctan2(T[1, 0], T[0, 0])
                inside = points_in_boxes(a.lidar[:, :3], np.c_[local, box[:, 3:6] * 1.2, [yaw]]).any(axis=1)
                a.lidar, a.lidar_beams = a.lidar[~inside], {}
        frames.append(f)
    return frames


def _dataset(reader, cooperation="all", beams=64):
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData(lidar_beams=beams)},
                     augment=AugmentConfig(enabled=False), comm_range=70.0)
    return CooperativeDataset(reader, cfg, {"m1": (0.8, 0.8, 4.0)}, train=False, cooperation=cooperation)


def brute_force_groups(ds, i, gt):
    """The split restated with the (N, M) point-in-box test: an agent sees a box with >= 5 of its
    points in it, or when it is the agent's own car; ego -> 0, only collaborators -> 1, else 2."""
    agents = ds.select_agents(ds.read_frame(i), np.random.default_rng(0), with_collaborators=True)
    T_ego = np.linalg.inv(agents[0].T_world_from_lidar)
    seen = []
    for a in agents:
        T = T_ego @ a.T_world_from_lidar
        pts = transform_points(T, a.lidar[:, :3])
        own = points_in_boxes(T[None, :2, 3], gt, bev_only=True)[0]
        seen.append((points_in_boxes(pts, gt).sum(axis=0) >= MIN_POINTS) | own)
    return np.where(seen[0], 0, np.where(np.any(seen[1:], axis=0), 1, 2))


def test_points_per_box_counts_what_points_in_boxes_counts():
    rng = np.random.default_rng(3)
    boxes = np.c_[rng.uniform(-30, 30, (40, 2)), rng.uniform(-2, 0, 40), rng.uniform(0.5, 12, (40, 3)),
                  rng.uniform(-4, 4, 40)]
    boxes[:5, 6] = [0.0, np.pi / 2, np.pi / 4, 0.0, np.pi / 2]
    boxes[3, 4] = boxes[4, 3] = 0.01  # slivers: their corners are at the edge of a box's reach along x
    # points spread everywhere, piled into boxes, and on each box's corners and face centres (ties)
    corners = np.array([[sx, sy, sz] for sx in (-.5, 0, .5) for sy in (-.5, 0, .5) for sz in (-.5, .5)])
    ties = []
    for b in boxes:
        c, s = np.cos(b[6]), np.sin(b[6])
        local = corners * b[3:6]
        ties.append(np.c_[local[:, 0] * c - local[:, 1] * s, local[:, 0] * s + local[:, 1] * c, local[:, 2]] + b[:3])
    piles = np.repeat(boxes[:, :3], 30, 0) + rng.normal(0, 2, (1200, 3))
    pts = np.concatenate([rng.uniform(-40, 40, (20000, 3)), piles, *ties]).astype(np.float32)
    expected = points_in_boxes(pts, boxes).sum(axis=0)
    assert expected.min() < MIN_POINTS <= expected.max()
    assert np.array_equal(points_per_box(pts, boxes), expected)
    assert points_per_box(pts[:0], boxes).tolist() == [0] * 40 and points_per_box(pts, boxes[:0]).shape == (0,)


def test_each_frame_is_read_once_and_the_numbers_are_the_reading_paths(tmp_path):
    reader = CountingReader(_frames())
    ds = _dataset(reader)
    res = evaluate(Known(), ds, out_dir=tmp_path, plot_every=2, label="once", progress=False, resamples=50)
    assert reader.reads == [1, 1, 1, 1]  # sample, visibility split and BEV images from one read
    assert len(res.images) == 2 and all(p.endswith(".png") for p in res.images)

    acc, vis, loc = APAccumulator(), VisibilityRecall(0.5), LocalisationStats()
    for i in range(len(ds)):
        gt = ds[i].gt_boxes
        boxes, scores = detections(gt)
        groups = visibility_groups(ds, i, gt)  # reads the frame again: the path evaluate() no longer takes
        assert np.array_equal(groups, brute_force_groups(ds, i, gt))
        acc.add(boxes, scores, gt)
        vis.add(groups, boxes, scores, gt)
        loc.add(groups, boxes, gt)
    expected = acc.results()
    split = vis.summary()
    assert all(split[g]["gt"] > 0 for g in GROUPS), split  # the split is not trivial
    assert res.recall_by_visibility == split
    assert res.ap == {o: dict(expected[o].ap) for o in ("global", "per_frame")}
    assert res.localisation == loc.summary()
    stored = json.loads((tmp_path / "eval_once.json").read_text())
    assert stored["recall_by_visibility"] == json.loads(json.dumps(split))


def test_a_dataloader_worker_makes_the_same_items():
    ds = _dataset(_frames())
    here = [_EvalFrames(ds, 4, 2)[i] for i in range(4)]
    loader = DataLoader(_EvalFrames(ds, 4, 2), batch_size=1, num_workers=1, collate_fn=_collate_item)
    for k, (batch, item) in enumerate(loader):
        assert np.array_equal(item.visibility, here[k].visibility)
        assert np.array_equal(batch.gt_boxes[0].numpy(), here[k].sample.gt_boxes)
        assert (item.plot_agents is None) == (k % 2 == 1)
        if item.plot_agents is not None:
            assert [a.agent_id for a in item.plot_agents] == [a.agent_id for a in here[k].plot_agents]
            assert all(not a.cameras and not a.lidar_beams for a in item.plot_agents)


def test_a_collaborator_scan_missing_for_the_split_still_raises():
    frames = [make_frame(seed=5, num_agents=2, num_objects=4)]
    frames[0].agents[1].lidar_beams = {}  # the 32-beam type's collaborator has no reduced scan
    ds = _dataset(frames, cooperation="ego_only", beams=32)
    assert ds[0] is not None  # the ego-only sample needs only the ego's scan
    with pytest.raises(DataFormatError, match="32-beam"):
        evaluate(Known(), ds, progress=False, resamples=10)
