"""The receiver side on its own: driven by encoded bytes and its own pose alone, and never
crashed by a message it cannot use (it rejects, counts, and keeps detecting)."""
import struct
import zlib

import numpy as np
import pytest
import torch

from opencood_ext.comm import ChannelEffects, Message, encode
from opencood_ext.comm.messages import Acceptance, Messages, from_wire, receive_packet, transmit
from opencood_ext.comm import wire
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.experiment import ExperimentConfig
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.sim.live import LiveCooperation
from opencood_ext.data.synthetic import SyntheticReader, make_frame

torch.set_num_threads(1)
RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)
PP = {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [8]},
      "backbone": {"layer_nums": [1], "layer_strides": [2], "num_filters": [8], "upsample_strides": [1],
                   "num_upsample_filters": [8]}, "shrink_channels": 8}
LINKS = {"gencomm": {"type": "gencomm", "generator": {"base_channels": 8}}, "full_feature": {"type": "full_feature"}}


def _model(link="gencomm", fusion="intermediate"):
    torch.manual_seed(0)
    return CooperativeDetector({"m1": PP}, RANGE, fusion=fusion, link=LINKS.get(link), score_threshold=0.01,
                               fusion_op="max").eval()


def _dataset(cooperation):
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()})
    return CooperativeDataset(SyntheticReader(1), cfg, {"m1": (0.8, 0.8, 4.0)}, train=False, cooperation=cooperation)


def _same(a, b):
    assert len(a.boxes) == len(b.boxes) and len(a.boxes) > 0
    torch.testing.assert_close(a.boxes, b.boxes)
    torch.testing.assert_close(a.scores, b.scores)


@pytest.mark.parametrize("link, fusion", [("gencomm", "intermediate"), ("full_feature", "intermediate"),
                                          (None, "late"), (None, "early")])
def test_receiver_runs_from_encoded_bytes_and_its_own_pose_alone(link, fusion):
    """The senders' packets are the only thing the receiver gets from them: its batch holds just the ego
    (its own input and pose), and its detections equal the cooperative prediction."""
    model = _model(link, fusion)
    coop = model.method.dataset_agents(train=False)
    full = collate_samples([_dataset(coop)[0]])
    with torch.no_grad():
        torch.manual_seed(1)  # GenComm's receiver draws diffusion noise: the same draws on both paths
        want = model.predict(full)
        feats = model.encode(full).feats
        sent = model.method.send(model, full, feats)
        packets = [encode(sent.to_wire(i), model.method.wire_dtype(model)) for i in range(len(sent))]
    assert len(packets) == 2 and packets == [encode(want.delivery.sent.to_wire(i), model.method.wire_dtype(model))
                                             for i in range(2)]
    # the receiver's own world: the ego's input and pose only ("early" keeps its raw points)
    ego_only = _dataset("early" if fusion == "early" else "ego_only")[0]
    ego_only.agents = ego_only.agents[:1]
    own = collate_samples([ego_only])
    got = [receive_packet(p, model.method.accept(model)) for p in packets]
    assert all(isinstance(m, Message) for m in got)
    arrived = from_wire(got, [0] * len(got), [-1] * len(got))
    with torch.no_grad():
        own_feats = model.encode(own).feats
        torch.manual_seed(1)
        dets = model.method.detect(model, own, own_feats, arrived)
    _same(dets[0], want.detections[0])


def _sent():
    """A GenComm model, a cooperative batch, its features and what its collaborators send."""
    model = _model()
    full = collate_samples([_dataset("all")[0]])
    with torch.no_grad():
        feats = model.encode(full).feats
        sent = model.method.send(model, full, feats)
    return model, full, feats, sent


def _bad_packets(model, good: bytes):
    """Packets a receiver must refuse, each with the reason it should give."""
    m = wire.decode(good)
    H, W = model.grid.shape
    out = {}
    out["shape"] = encode(Message(m.sender_id, m.agent_type, m.timestamp, m.pose, torch.zeros(2, H, W - 4)), "float32")
    out["type"] = encode(Message(m.sender_id, "m9", m.timestamp, m.pose, m.payload), "float32")
    out["magnitude"] = encode(Message(m.sender_id, m.agent_type, m.timestamp, m.pose,
                                      torch.full(tuple(m.payload.shape), 3e38)), "float32")
    out["kind"] = encode(Message(m.sender_id, m.agent_type, m.timestamp, m.pose,
                                 torch.zeros(1, 3, 9), kind="boxes"), "float32")
    scaled = bytearray(encode(m, "int8"))
    f = list(wire.HEADER.unpack(bytes(scaled[:wire.HEADER.size])))
    f[26] = 3.5e38  # an int8 scale whose decoded values overflow float32
    head = wire.HEADER.pack(*f)
    out["int8 scale"] = head + struct.pack("<I", zlib.crc32(head)) + bytes(scaled[wire.HEADER_SIZE:])
    out["truncated"] = good[:-7]
    return out


def test_every_bad_message_is_rejected_with_a_reason_and_the_ego_keeps_detecting():
    model, full, feats, sent = _sent()
    good = encode(sent.to_wire(0), "float16")
    accept = model.method.accept(model)
    reasons = {"shape": "payload shape", "type": "unknown agent type", "magnitude": "magnitude",
               "kind": "payload kind", "int8 scale": "int8 scale", "truncated": "truncated"}
    for name, packet in _bad_packets(model, good).items():
        got = receive_packet(packet, accept)
        assert isinstance(got, str) and reasons[name] in got, (name, got)
    stale = Acceptance(kind="bev", shape=accept.shape, max_age=0.5, tick_s=0.05)  # max_age in seconds
    assert "stale" in receive_packet(good, stale, now=float(wire.decode(good).timestamp) + 11)  # 0.55 s old
    assert not isinstance(receive_packet(good, stale, now=float(wire.decode(good).timestamp) + 10), str)
    # with only bad messages arriving, the ego detects exactly as with none
    with torch.no_grad():
        alone = model.method.detect(model, full, feats, sent.select([]))[0]
    cfg = ExperimentConfig(name="t", data=DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()}),
                           model={"agent_types": {"m1": PP}, "fusion": "intermediate", "link": LINKS["gencomm"]})

    class Hostile(ChannelEffects):
        """Delivers only broken packets instead of what was sent."""

        def step(self, packets):
            super().step(packets)
            return list(_bad_packets(model, good).values())

    live = LiveCooperation(cfg, model, Hostile())
    tick = live.step(make_frame(seed=0))
    assert tick.received == 0 and len(tick.rejected) == 6 and live.total_rejected == 6
    assert len(tick.boxes) == len(alone.boxes)


def test_transmit_counts_rejections_and_bytes():
    model, full, feats, sent = _sent()
    strict = Acceptance(kind="bev", shape=model.method.accept(model).shape, agent_types={"m7"})
    d = transmit(sent, wire=True, dtype="float16", accept=strict)
    assert len(d.arrived) == 0 and [i for i, _ in d.rejected] == [0, 1]
    assert d.bytes_sent == [wire.message_nbytes((2, *model.grid.shape), "float16")] * 2
    ok = transmit(sent, wire=True, dtype="float16", accept=model.method.accept(model))
    assert len(ok.arrived) == 2 and not ok.rejected
    np.testing.assert_array_equal(ok.arrived.pose.numpy(), sent.pose.numpy())


def test_gencomm_runs_under_bf16_autocast():
    """Under torch.autocast the link's modules compute in bf16 (or fp16 on a GPU) while the buffers
    they fill are float32: the link casts what it writes, so mixed precision runs and trains."""
    model = _model("gencomm").train()
    batch = collate_samples([_dataset(model.method.dataset_agents(train=True))[0]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch)
        loss = model.loss(out, batch).total
    loss.backward()
    assert torch.isfinite(loss) and "generation" in out.losses
    assert all(p.grad is not None for p in model.link.dme["m1"].parameters())


@pytest.mark.parametrize("link", ["gencomm", "full_feature"])
def test_blank_messages_zero_the_named_types_payloads_only(link):
    """The --blank_messages diagnostic: senders of the named types still take part, with all-zero maps."""
    model = _model(link)
    batch = collate_samples([_dataset(model.method.dataset_agents(train=False))[0]])
    with torch.no_grad():
        torch.manual_seed(1)
        normal = model.predict(batch)
        model.blank_message_types = {"m1"}
        torch.manual_seed(1)
        blank = model.predict(batch)
    assert len(normal.delivery.sent) == len(blank.delivery.sent) == 2
    assert all(p.abs().sum() > 0 for p in normal.delivery.sent.payload)
    assert all(torch.count_nonzero(p) == 0 for p in blank.delivery.sent.payload)
    assert len(blank.delivery.arrived) == 2  # delivered and used, not dropped


def test_only_feature_maps_can_be_blanked():
    codes = Messages("codes", [0], [1], [1], ["m2"], [0.0], torch.eye(4, dtype=torch.float64)[None],
                     [torch.ones(2, 3, dtype=torch.int64)])
    with pytest.raises(ValueError, match="kind 'bev'.*'codes'"):
        codes.blanked({"m2"})
    bev = Messages("bev", [0, 0], [1, 2], [1, 2], ["m2", "m3"], [0.0, 0.0],
                   torch.eye(4, dtype=torch.float64).repeat(2, 1, 1), [torch.ones(2, 3), torch.ones(2, 3)])
    out = bev.blanked({"m2"})
    assert torch.equal(out.payload[0], torch.zeros(2, 3)) and torch.equal(out.payload[1], torch.ones(2, 3))
    assert torch.equal(bev.payload[0], torch.ones(2, 3))  # the original is untouched
