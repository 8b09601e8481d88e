"""Channel effects on datasets (issue 15): zero levels reproduce the plain evaluation, pose noise
lowers a trained model's AP, latency delivers the older frame's data and pose, losing every message
equals the collaborators-off evaluation for every fusion method, and training with message loss."""
import numpy as np
import pytest
import torch

from opencood_ext.comm.channel import ChannelConfig
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.eval.evaluate import evaluate
from opencood_ext.eval.robustness import EFFECTS
from opencood_ext.experiment import build_dataset, build_model, load_experiment
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.runs import load_run
from robust_runs import trained_late_run
from opencood_ext.data.synthetic import SyntheticReader
from tiny_runs import GENCOMM, PP

RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory, one_thread):
    return trained_late_run(tmp_path_factory)


def _dets(model, ds, channel=None):
    out = []
    for i in range(len(ds)):
        out.append(model.predict(collate_samples([ds[i]]), channel=channel, keys=lambda b, i=i: (i,)).detections[0])
    return out


def test_zero_levels_reproduce_the_plain_evaluation(run):
    cfg, model = load_run(run)
    ds = build_dataset(cfg, "test", train=False)
    plain = evaluate(model, ds, progress=False)
    assert plain.ap["global"][0.5] > 0.1 and plain.channel["sent"] > 0
    for effect in EFFECTS.values():
        channel, latency = effect.setting(0, seed=7)
        assert latency == 0 and channel.perfect
        res = evaluate(model, ds, progress=False, channel=channel)
        assert res.ap == plain.ap and res.num_pred == plain.num_pred
        assert res.bytes_per_message == plain.bytes_per_message and res.channel["lost"] == 0
    for a, b in zip(_dets(model, ds), _dets(model, ds, EFFECTS["noise"].setting(0, seed=7)[0])):
        assert torch.equal(a.boxes, b.boxes) and torch.equal(a.scores, b.scores)


def test_large_pose_noise_lowers_ap_and_every_method_meets_the_same_noise(run):
    cfg, model = load_run(run)
    ds = build_dataset(cfg, "test", train=False)
    plain = evaluate(model, ds, progress=False).ap["global"]
    noisy = evaluate(model, ds, progress=False, channel=EFFECTS["noise"].setting(3.0, seed=0)[0]).ap["global"]
    assert noisy[0.5] < plain[0.5] - 0.1 and noisy[0.3] < plain[0.3] - 0.1
    # the draws depend on (seed, frame, sender) only: late and early fusion get the same header poses
    channel = ChannelConfig(pose_noise_m=1.0, pose_noise_deg=5.0, seed=3)
    poses = {}
    for fusion in ("late", "early"):
        model.set_fusion(fusion)
        sample = build_dataset(cfg, "test", train=False, fusion=fusion)[2]
        delivery = model.predict(collate_samples([sample]), channel=channel, keys=lambda b: (2,)).delivery
        poses[fusion] = delivery.arrived.pose
        true = torch.from_numpy(np.stack([a.T_world_from_agent for a in sample.agents[1:]]))
        assert (poses[fusion][:, :2, 3] - true[:, :2, 3]).abs().max() > 0.05  # noise arrived ...
        torch.testing.assert_close(poses[fusion][:, 2], true[:, 2])  # ... on x, y and yaw only
    assert torch.equal(poses["late"], poses["early"])


def _index(ds, scenario, ts):
    return list(ds.reader.samples).index((scenario, ts))


def _same_input(a, b):
    assert a.agent_id == b.agent_id and a.timestamp == b.timestamp
    np.testing.assert_array_equal(a.T_world_from_agent, b.T_world_from_agent)
    assert torch.equal(a.voxels.coords, b.voxels.coords) and torch.equal(a.voxels.voxels, b.voxels.voxels)


def test_latency_delivers_the_older_frames_data_and_pose(run):
    cfg, model = load_run(run)
    now = build_dataset(cfg, "test", train=False)
    late = {k: build_dataset(cfg, "test", train=False, latency_frames=k) for k in (1, 3)}
    a68, a70, a72 = (_index(now, "tst_a", t) for t in ("000068", "000070", "000072"))
    b68, b70 = _index(now, "tst_b", "000068"), _index(now, "tst_b", "000070")
    s, cur, old = late[1][a72], now[a72], now[a70]
    _same_input(s.agents[0], cur.agents[0])  # the ego is current ...
    np.testing.assert_array_equal(s.T_ego_from_world, cur.T_ego_from_world)
    np.testing.assert_array_equal(s.gt_boxes, cur.gt_boxes)  # ... and so is the ground truth
    assert [a.agent_id for a in s.agents] == [10, 20, 30]
    for got, want in zip(s.agents[1:], old.agents[1:]):  # collaborators: frame t-1, their pose then
        _same_input(got, want)
        assert got.timestamp == 70.0
        assert not np.array_equal(got.T_world_from_agent, cur.agents[want.agent_id // 10 - 1].T_world_from_agent)
    for got, want in zip(late[3][a72].agents[1:], now[a68].agents[1:]):  # clamped at the scenario's start
        _same_input(got, want)
    for got, want in zip(late[1][a68].agents[1:], now[a68].agents[1:]):
        _same_input(got, want)
    # another scenario never reaches into tst_a; an agent absent from the earlier frame sends nothing
    assert [a.agent_id for a in late[1][b68].agents] == [10, 20]
    s = late[1][b70]
    assert [a.agent_id for a in s.agents] == [10, 20]
    _same_input(s.agents[1], now[b68].agents[1])
    # the messages carry the old pose and time in their headers; the receiver places them with it
    pred = model.predict(collate_samples([late[1][a72]]))
    sent = pred.delivery.sent
    np.testing.assert_array_equal(sent.pose.numpy(), np.stack([a.T_world_from_agent for a in old.agents[1:]]))
    assert sent.timestamp == [70.0, 70.0] and len(pred.delivery.arrived) == 2


def _synthetic(model, cooperation):
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()}, augment=AugmentConfig(enabled=False))
    return CooperativeDataset(SyntheticReader(3), cfg, model.voxel_sizes(), train=False, cooperation=cooperation)


def _untrained(fusion, link=None, **kw):
    torch.manual_seed(0)
    model = CooperativeDetector({"m1": PP}, RANGE, fusion=fusion, link=link, anchors={"z_center": -1.0},
                                voxel_caps={"m1": (32, 32000)}, **kw)
    return model.eval()


def _drop_all_equals_off(model, ds, off_ds, exact):
    fusion = model.fusion
    lost = evaluate(model, ds, progress=False, channel=ChannelConfig(drop=1.0, seed=4))
    got = _dets(model, ds, ChannelConfig(drop=1.0, seed=4))
    assert lost.channel["lost"] == lost.channel["sent"] > 0 and lost.num_pred > 0
    model.set_fusion("none")
    off = evaluate(model, off_ds, progress=False)
    want = _dets(model, off_ds)
    model.set_fusion(fusion)
    assert lost.ap == off.ap and lost.num_pred == off.num_pred
    for a, b in zip(got, want):
        if exact:
            assert torch.equal(a.boxes, b.boxes) and torch.equal(a.scores, b.scores)
        else:  # the encoder ran batched with the collaborators' inputs: float rounding (1e-7) only
            torch.testing.assert_close(a.boxes, b.boxes, atol=1e-4, rtol=0)
            torch.testing.assert_close(a.scores, b.scores, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fusion, link", [
    ("late", None), ("early", None), ("intermediate", {"type": "full_feature"}), ("intermediate", GENCOMM)],
    ids=["late", "early", "full_feature", "gencomm"])
def test_drop_one_equals_collaborators_off(fusion, link, one_thread):
    """Every message lost: the ego detects from its own input alone, exactly as fusion "none" on the
    same weights. Score threshold 0 keeps hundreds of boxes, so post-processing order matters (late
    fusion once cut the ego's boxes to max_boxes before dropping those out of range)."""
    model = _untrained(fusion, link, score_threshold=0.0)
    ds = _synthetic(model, model.method.dataset_agents(False))
    _drop_all_equals_off(model, ds, _synthetic(model, "ego_only"), exact=fusion == "early")


def test_drop_one_equals_collaborators_off_trained_late(run):
    cfg, model = load_run(run)
    _drop_all_equals_off(model, build_dataset(cfg, "test", train=False),
                         build_dataset(cfg, "test", train=False, fusion="none"), exact=False)


@pytest.mark.parametrize("fusion, link", [("late", None), ("early", None), ("intermediate", GENCOMM)],
                         ids=["late", "early", "gencomm"])
def test_batches_with_every_or_some_messages_lost_run(fusion, link, one_thread):
    model = _untrained(fusion, link)
    ds = _synthetic(model, model.method.dataset_agents(False))
    batch = collate_samples([ds[0], ds[1]])
    for drop, seed in ((1.0, 0), (0.5, 0), (0.5, 1), (0.5, 2)):
        pred = model.predict(batch, channel=ChannelConfig(drop=drop, seed=seed), keys=lambda b: (b,))
        assert len(pred.detections) == 2 and len(pred.delivery.sent) == 4
        assert len(pred.delivery.lost) + len(pred.delivery.arrived) == 4
        if drop == 1.0:
            assert len(pred.delivery.arrived) == 0


@pytest.mark.parametrize("fusion, link", [("early", None), ("intermediate", {"type": "full_feature"}),
                                          ("intermediate", GENCOMM)], ids=["early", "full_feature", "gencomm"])
def test_training_with_every_message_lost_sends_nothing_and_trains_the_ego(fusion, link, one_thread):
    deliveries = []

    def step(drop):
        model = _untrained(fusion, link, train_message_drop=drop).train()
        real = model.deliver
        model.deliver = lambda *a, **k: deliveries.append(real(*a, **k)) or deliveries[-1]
        ds = _synthetic(model, model.method.dataset_agents(True))
        batch = collate_samples([ds[0], ds[1]])
        loss = model.loss(model(batch), batch)
        loss.total.backward()
        return model, loss

    model, loss = step(1.0)
    d = deliveries[-1]
    assert len(d.sent) == 4 and len(d.arrived) == 0 and d.lost == [0, 1, 2, 3]
    assert torch.isfinite(loss.total) and "generation" not in loss.parts
    enc = model.encoders["m1"]
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())
    assert model.head.cls.weight.grad.abs().sum() > 0
    if link is GENCOMM:  # nothing the senders made reached the loss
        assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.link.dme.parameters())
        model, loss = step(0.0)
        assert len(deliveries[-1].arrived) == 4 and "generation" in loss.parts
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.link.dme.parameters())


def test_message_drop_config_example():
    from pathlib import Path
    path = Path(__file__).resolve().parents[3] / "configs" / "sim" / "m1m3_intermediate_msgdrop.yaml"
    cfg = load_experiment(path)
    assert cfg.model["train_message_drop"] == 0.25 and build_model(cfg).train_message_drop == 0.25
    with pytest.raises(ValueError, match="train_message_drop"):
        CooperativeDetector({"m1": PP}, RANGE, train_message_drop=1.5)
