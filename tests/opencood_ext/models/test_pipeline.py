"""Dataset -> Batch -> detector for every fusion method, on synthetic frames."""
import numpy as np
import pytest
import torch

from opencood_ext.models.links import Arrival
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.geometry import points_in_boxes, transform_points

from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.models.fusion_methods import transform_boxes
from opencood_ext.data.synthetic import SyntheticReader

torch.set_num_threads(1)
RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)
BACKBONE = {"layer_nums": [1, 1], "layer_strides": [2, 2], "num_filters": [16, 32],
            "upsample_strides": [1, 2], "num_upsample_filters": [16, 16]}
PP = {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [16]},
      "backbone": BACKBONE, "shrink_channels": 16}


def _T(sample, k):
    """T_ego_from_agent of agent k of a sample, as a receiver computes it: its own pose and the header's."""
    return sample.T_ego_from_world @ sample.agents[k].T_world_from_agent


def _dataset(model, cooperation, train=False, types=("m1", "m1", "m1"), augment=False, alliance=None, **data):
    cfg = DataConfig(lidar_range=RANGE, agent_types={t: AgentTypeData() for t in (alliance or set(types))},
                     augment=AugmentConfig(enabled=augment), **data)
    return CooperativeDataset(SyntheticReader(2, types=types), cfg, model.voxel_sizes(), train=train,
                              cooperation=cooperation)


def test_sample_layout_and_ground_truth_in_ego_frame():
    model = CooperativeDetector({"m1": PP}, RANGE)
    ds = _dataset(model, "all")
    s = ds[0]
    assert [a.agent_id for a in s.agents] == [10, 20, 30]  # ego first, sorted ids
    np.testing.assert_allclose(_T(s, 0), np.eye(4), atol=1e-6)
    frame = ds.reader[0]
    ego = frame.agents[0]
    inside = points_in_boxes(ego.lidar, s.gt_boxes).sum(axis=0)
    assert (inside >= 5).sum() >= len(s.gt_boxes) - 1, inside
    # a collaborator's points moved by T_ego_from_agent land in the ego's GT boxes too
    other = frame.agents[1]
    moved = transform_points(_T(s, 1), other.lidar)
    assert (points_in_boxes(moved, s.gt_boxes).sum(axis=0) >= 5).sum() >= len(s.gt_boxes) - 1


def test_augmentation_keeps_points_and_labels_together():
    model = CooperativeDetector({"m1": PP}, RANGE)
    ds = _dataset(model, "all", train=True, augment=True)
    torch.manual_seed(3)
    s = ds[0]
    assert not np.allclose(s.gt_boxes, _dataset(model, "all")[0].gt_boxes)  # something rotated
    frame = ds.reader[0]
    other = frame.agents[2]
    moved = transform_points(_T(s, 2), other.lidar)
    assert (points_in_boxes(moved, s.gt_boxes).sum(axis=0) >= 5).sum() >= len(s.gt_boxes) - 1
    # the ego's own voxels were rotated into the augmented frame: its pose is identity
    np.testing.assert_allclose(_T(s, 0), np.eye(4), atol=1e-6)


def test_collate_groups_by_type():
    pp2 = dict(PP, encoder=dict(PP["encoder"]))
    model = CooperativeDetector({"m1": PP, "m3": pp2}, RANGE)
    ds = _dataset(model, "all", types=("m1", "m3", "m1"))
    b = collate_samples([ds[0], ds[1]])
    assert b.agent_types == ["m1", "m3", "m1"] * 2
    assert b.type_index["m1"].tolist() == [0, 2, 3, 5] and b.type_index["m3"].tolist() == [1, 4]
    assert b.inputs["m1"].num_agents == 4 and b.ego_index.tolist() == [0, 3]
    assert b.sample_index.tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("fusion, link, cooperation", [
    ("none", None, "ego_only"), ("early", None, "early"), ("late", None, "ego_only"),
    ("intermediate", {"type": "full_feature"}, "all"),
    ("intermediate", {"type": "gencomm", "generator": {"base_channels": 8}}, "all"),
])
def test_fusion_methods_train_step_and_predict(fusion, link, cooperation):
    torch.manual_seed(0)
    model = CooperativeDetector({"m1": PP}, RANGE, fusion=fusion, link=link)
    b = collate_samples([_dataset(model, cooperation, train=True)[i] for i in range(2)])
    out = model(b)
    loss = model.loss(out, b)
    loss.total.backward()
    assert torch.isfinite(loss.total)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    if link and link["type"] == "gencomm":
        assert "generation" in loss.parts and model.link.dme["m1"].head.weight.grad.abs().sum() > 0
    model.eval()
    eval_coop = "all" if fusion == "late" else cooperation
    b = collate_samples([_dataset(model, eval_coop)[0]])
    pred = model.predict(b)
    dets, nbytes = pred.detections, pred.delivery.bytes_sent
    assert len(dets) == 1 and dets[0].boxes.shape[1] == 7
    if fusion == "none":
        assert nbytes == []
    else:  # every collaborator sent one encoded packet; the ego sends nothing
        assert pred.delivery.sent.source_row == [1, 2] and all(n >= 204 for n in nbytes)  # header: 204 B
        assert len(pred.delivery.arrived) == 2 and not pred.delivery.rejected
    if fusion == "intermediate" and link["type"] == "gencomm":  # float16 2-channel message vs float32 feature
        assert nbytes[0] < 16 * 40 * 40 * 4 / 8


def test_gencomm_ego_keeps_real_feature_and_warp_switch():
    """The fused map of a sample whose messages all fail to arrive is the ego's own feature's; what
    arrives changes it; the reference order (generate, then warp) is a switch on the link."""
    from opencood_ext.models.fusion_methods import ego_features
    torch.manual_seed(0)
    model = CooperativeDetector({"m1": PP}, RANGE, link={"type": "gencomm", "generator": {"base_channels": 8}},
                                fusion_op="max")
    model.eval()
    b = collate_samples([_dataset(model, "all")[0]])
    feats = model.encode(b).feats
    own = ego_features(model, b, feats)
    torch.testing.assert_close(own[0], feats[0])  # no augmentation: the ego's feature is not resampled
    sent = model.method.send(model, b, feats)
    seen = []
    model.post_fusion.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
    with torch.no_grad():
        model.method.receive(model, b, feats, sent.select([]))
        model.method.receive(model, b, feats, sent)
    torch.testing.assert_close(seen[0], own)
    assert not torch.allclose(seen[1], own)
    assert (seen[1] >= own - 1e-6).all()  # max fusion never goes below the ego's own cells
    model.link.warp_before_generation = False
    with torch.no_grad():
        model.method.receive(model, b, feats, sent)
    assert not torch.allclose(seen[2], seen[1])


def test_transform_boxes_matches_corner_transform():
    from opencood_ext.geometry import boxes_to_corners, corners_to_boxes, pose_to_matrix
    boxes = torch.tensor([[3.0, -2.0, 0.5, 4.0, 1.8, 1.5, 0.3], [-8.0, 5.0, 0.2, 4.5, 2.0, 1.6, -2.0]])
    T = torch.as_tensor(pose_to_matrix([4.0, -3.0, 0.0, 0.0, 37.0, 0.0]), dtype=torch.float32)
    want = corners_to_boxes(boxes_to_corners(boxes.numpy()) @ T[:3, :3].numpy().T + T[:3, 3].numpy())
    got = transform_boxes(boxes, T).numpy()
    np.testing.assert_allclose(got[:, :6], want[:, :6], atol=1e-4)
    np.testing.assert_allclose(np.cos(got[:, 6] - want[:, 6]), 1.0, atol=1e-5)


def test_alliance_filter_and_clear_errors():
    model = CooperativeDetector({"m1": PP}, RANGE)
    ds = _dataset(model, "all", types=("m1", "m2", "m1"), alliance=["m1"])
    s = ds[0]
    assert [a.agent_type for a in s.agents] == ["m1", "m1"]
    ds.cfg.agent_types = {"m9": AgentTypeData()}
    with pytest.raises(ValueError, match="no agent of the alliance types"):
        ds[0]


def test_modality_overrides():
    from opencood_ext.data.data_config import type_override
    assert type_override("all:m3") == ["m3"] and type_override("cycle:m1, m3") == ["m1", "m3"]
    assert type_override("in_order") is None
    with pytest.raises(ValueError, match="all:<type>"):
        type_override("all:m1,m2")
    pp3 = dict(PP)
    model = CooperativeDetector({"m1": PP, "m3": pp3}, RANGE)
    ds = _dataset(model, "all", alliance=["m1", "m3"], modality="cycle:m1,m3")
    assert [a.agent_type for a in ds[0].agents] == ["m1", "m3", "m1"]


def test_generation_follows_a_shifted_message():
    """Warp-then-generate: a message sent from a sender frame shifted by a known
    transform generates the same ego-frame feature as the unshifted message."""
    from opencood_ext.models.warp import warp_to_ego
    torch.manual_seed(0)
    model = CooperativeDetector({"m1": PP}, RANGE, link={"type": "gencomm", "generator": {"base_channels": 8}})
    model.eval()
    link = model.link
    H, W = model.grid.shape
    msg = torch.zeros(1, link.payload_channels, H, W)
    ones = torch.ones(1, 1, H, W)

    def arrival(T):
        return Arrival(T, ["m1"], ego, ["m1"], ones)
    msg[0, :, 10:14, 12:20] = 2.0  # a blob in the ego frame
    ego = torch.randn(1, model.channels, H, W)
    shift = 4 * model.grid.cell[0]  # exactly 4 cells along x
    T = torch.eye(4)[None].clone()
    T[0, 0, 3] = shift  # sender frame = ego frame moved back by 4 cells: T_ego_from_sender
    T_inv = torch.eye(4)[None].clone()
    T_inv[0, 0, 3] = -shift
    msg_sender = warp_to_ego(msg, T_inv, model.lidar_range)  # what that sender would transmit
    with torch.no_grad():
        torch.manual_seed(1)
        ref = link.receive(msg, arrival(torch.eye(4)[None]))
        torch.manual_seed(1)
        got = link.receive(msg_sender, arrival(T))
    torch.testing.assert_close(got[..., :, 8:-8], ref[..., :, 8:-8], atol=1e-4, rtol=1e-4)
    # moving the blob itself moves the generated feature where the message differs
    torch.manual_seed(1)
    with torch.no_grad():
        moved = link.receive(torch.roll(msg, 6, dims=-1), arrival(torch.eye(4)[None]))
    assert not torch.allclose(moved, ref)
    # the reference order (generate in the sender frame, then warp) does not have this property
    link.warp_before_generation = False
    with torch.no_grad():
        torch.manual_seed(1)
        ref_order = link.receive(msg_sender, arrival(T))
    assert (ref_order[..., :, 8:-8] - ref[..., :, 8:-8]).abs().max() > 1e-3


def test_random_ego_is_a_vehicle():
    model = CooperativeDetector({"m1": PP}, RANGE)
    ds = _dataset(model, "all", train=True, random_ego=True)
    frame = ds.reader[0]
    frame.agents[1].agent_id = -1  # make the middle agent a roadside unit
    egos = {ds.select_agents(frame, np.random.default_rng(k))[0].agent_id for k in range(40)}
    assert egos == {10, 30}


def test_roadside_unit_points_use_a_virtual_lidar_at_ego_height():
    """An RSU's points are voxelised in a frame moved down to the ego LiDAR's height;
    with its pose adjusted, every point still lands where it is in the ego frame."""
    from opencood_ext.geometry import pose_to_matrix
    model = CooperativeDetector({"m1": PP}, RANGE)
    ds = _dataset(model, "all")
    frame = ds.reader[1]
    rsu = frame.agents[2]
    rsu.agent_id = -1
    world_pts = transform_points(rsu.T_world_from_lidar, rsu.lidar)
    rsu.T_world_from_lidar = pose_to_matrix([20.0, 3.0, 6.0, 0.0, 30.0, 0.0])  # a pole-mounted LiDAR, 6 m up
    rsu.lidar = transform_points(np.linalg.inv(rsu.T_world_from_lidar), world_pts).astype(np.float32)
    ego = frame.agents[0]
    T = ego.T_world_from_lidar
    pts, T_world_from_virtual = ds._virtual_lidar(rsu.lidar, rsu, ego)
    T_virtual = np.linalg.inv(T) @ T_world_from_virtual
    np.testing.assert_allclose(transform_points(T_virtual, pts)[:, :3],
                               transform_points(np.linalg.inv(T), world_pts)[:, :3], atol=1e-3)
    # ground points (world z ~ 0) now sit about the ego's LiDAR height below the virtual sensor
    ground = world_pts[:, 2] < 0.05
    assert abs(np.median(pts[ground, 2]) + T[2, 3]) < 0.2


def test_early_fusion_model_runs_ego_only_with_a_collaborator_type_it_has_no_encoder_for():
    """An early-fusion model (only the ego type's encoder) evaluated with its collaborators off."""
    model = CooperativeDetector({"m1": PP}, RANGE, fusion="early")
    with pytest.raises(ValueError, match="no LiDAR encoder"):
        _dataset(model, "all", types=("m1", "m3", "m1"))
    ds = _dataset(model, "ego_only", types=("m1", "m3", "m1"))
    s = ds[0]
    assert [a.agent_type for a in s.agents] == ["m1"]
    # a random ego that lands on the type without an encoder says so
    bad = _dataset(model, "ego_only", types=("m3", "m1", "m1"))
    with pytest.raises(ValueError, match="type m3, for which the model has no LiDAR encoder"):
        bad[0]


def test_collaborator_frame_ego_encodes_on_the_ego_grid(tmp_path):
    """collaborator_frame "ego": a collaborator's voxels are its points moved into the (augmented)
    ego frame and its pose is identity, so nothing gets warped; "own" keeps its sensor frame."""
    model = CooperativeDetector({"m1": PP}, RANGE)
    own = _dataset(model, "all", train=True, augment=True)
    ego = _dataset(model, "all", train=True, augment=True, collaborator_frame="ego")
    torch.manual_seed(5)
    s_own = own[0]
    torch.manual_seed(5)
    s_ego = ego[0]
    np.testing.assert_allclose(s_own.gt_boxes, s_ego.gt_boxes)  # same augmentation draw
    frame = own.reader[0]
    for k in (1, 2):
        assert not np.allclose(_T(s_own, k), np.eye(4), atol=1e-3)
        np.testing.assert_allclose(_T(s_ego, k), np.eye(4), atol=1e-6)
        moved = transform_points(_T(s_own, k), frame.agents[k].lidar)
        want = own.voxelizers["m1"](moved.astype(np.float32))
        got = s_ego.agents[k].voxels
        assert {tuple(c) for c in got.coords.tolist()} == {tuple(c) for c in want.coords.tolist()}
        assert len(got.coords) > 50
    bad = tmp_path / "data.yaml"
    bad.write_text("collaborator_frame: sender\n")
    from opencood_ext.config import load_config
    with pytest.raises(ValueError, match="collaborator_frame"):
        load_config(bad, DataConfig)


@pytest.mark.parametrize("fusion, cooperation", [("none", "ego_only"), ("late", "all"), ("intermediate", "all")])
def test_post_fusion_layers_sit_before_the_head_for_every_method(fusion, cooperation):
    torch.manual_seed(0)
    plain = CooperativeDetector({"m1": PP}, RANGE, fusion=fusion)
    assert not [k for k in plain.state_dict() if k.startswith("post_fusion")]  # old checkpoints still load
    model = CooperativeDetector({"m1": PP}, RANGE, fusion=fusion, post_fusion_layers=2)
    assert sum(isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3) for m in model.post_fusion.modules()) == 2
    seen = []
    model.post_fusion.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    b = collate_samples([_dataset(model, "ego_only" if fusion == "late" else cooperation, train=True)[0]])
    model.loss(model(b), b).total.backward()
    assert seen == [(1, 16, 40, 40)]
    assert model.post_fusion[0][0].weight.grad.abs().sum() > 0
    model.eval()
    seen.clear()
    model.predict(collate_samples([_dataset(model, cooperation)[0]]))
    # late: the collaborators' maps (sender side), then the ego's own
    assert seen == ([(2, 16, 40, 40), (1, 16, 40, 40)] if fusion == "late" else [(1, 16, 40, 40)])
    with pytest.raises(ValueError, match="post_fusion_layers"):
        CooperativeDetector({"m1": PP}, RANGE, post_fusion_layers=-1)
