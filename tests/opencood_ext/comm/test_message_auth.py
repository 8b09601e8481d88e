"""Authenticated messages (issue 29): with an alliance key every packet carries an HMAC-SHA256
signature over its header and payload, checked before the payload is read; unsigned and wrongly
signed packets are refused and counted, in dataset evaluation and in the live demo, while the ego
keeps detecting. Also: the rejection counts of every receiver rule reach the results."""
import dataclasses
import json
import struct
import zlib

import numpy as np
import pytest
import torch

from opencood_ext.comm import ChannelConfig, ChannelEffects, Message, decode, encode, wire
from opencood_ext.comm import messages as messages_module
from opencood_ext.comm.channel import apply_channel
from opencood_ext.comm.messages import Acceptance, receive_packet
from opencood_ext.comm.receiver import ReceiverConfig
from opencood_ext.config import ConfigError
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.eval.evaluate import evaluate
from opencood_ext.experiment import ExperimentConfig, build_model
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.sim.live import LiveCooperation
from opencood_ext.data.synthetic import SyntheticReader, make_frame

torch.set_num_threads(1)
KEY = b"alliance-key-0123456789abcdef!!"
OTHER = b"another-alliance-key-9876543210"
RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)
PP = {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [8]},
      "backbone": {"layer_nums": [1], "layer_strides": [2], "num_filters": [8], "upsample_strides": [1],
                   "num_upsample_filters": [8]}, "shrink_channels": 8}
MODEL = {"agent_types": {"m1": PP}, "fusion": "intermediate", "link": {"type": "full_feature"},
         "score_threshold": 0.01, "fusion_op": "max"}


def _msg(payload=None):
    pose = np.eye(4)
    pose[:3, 3] = [12.0, -3.0, 1.8]
    return Message(20, "m1", 4.0, pose, torch.arange(12, dtype=torch.float32).reshape(1, 3, 4)
                   if payload is None else payload)


def _resign_header(packet: bytes, **fields) -> bytes:
    """A packet with header fields changed and both CRCs valid, its old signature kept."""
    f = list(wire.HEADER.unpack(packet[:wire.HEADER.size]))
    for index, value in fields.items():
        f[int(index[1:])] = value
    head = wire.HEADER.pack(*f)
    return head + struct.pack("<I", zlib.crc32(head)) + packet[wire.HEADER_SIZE:]


def test_signed_round_trip_and_size():
    signed = encode(_msg(), key=KEY)
    plain = encode(_msg())
    assert len(signed) == len(plain) + wire.SIGNATURE_SIZE == wire.message_nbytes((1, 3, 4), signed=True)
    assert signed[:4] == plain[:4] and struct.unpack_from("<H", signed, 4)[0] == wire.VERSION_SIGNED
    for packet in (signed, plain):  # a receiver without a key reads both versions
        torch.testing.assert_close(decode(packet).payload, _msg().payload)
    torch.testing.assert_close(decode(signed, wire.Limits(key=KEY)).payload, _msg().payload)


def test_unsigned_wrong_key_and_tampered_packets_are_refused_with_a_key():
    limits = wire.Limits(key=KEY)
    signed = encode(_msg(), key=KEY)
    cases = {
        "unsigned": encode(_msg()),
        "bad signature: other key": encode(_msg(), key=OTHER),
        "bad signature: header changed": _resign_header(signed, f4=30),  # another sender id, CRC fixed
        "bad signature: pose changed": _resign_header(signed, f10=99.0),
    }
    body = bytearray(signed)
    body[wire.HEADER_SIZE] ^= 0x01  # a payload byte flipped, payload CRC fixed in the header
    f = list(wire.HEADER.unpack(bytes(body[:wire.HEADER.size])))
    f[28] = zlib.crc32(bytes(body[wire.HEADER_SIZE:-wire.SIGNATURE_SIZE]))
    head = wire.HEADER.pack(*f)
    cases["bad signature: payload changed"] = head + struct.pack("<I", zlib.crc32(head)) + bytes(body[wire.HEADER_SIZE:])
    stripped = bytearray(signed[:-wire.SIGNATURE_SIZE])
    cases["unsigned: signature stripped"] = _resign_header(bytes(stripped), f1=wire.VERSION)
    for name, packet in cases.items():
        with pytest.raises(wire.MessageError) as err:
            decode(packet, limits)
        assert err.value.reason.startswith(name.split(":")[0] + ":"), (name, err.value.reason)


def test_signature_is_checked_before_the_payload_is_read():
    """A wrongly signed packet with a poisoned payload is refused for its signature: the receiver
    never reads (decodes, range-checks) what an outsider sent."""
    packet = bytearray(encode(_msg(), key=OTHER))
    body = np.frombuffer(bytes(packet[wire.HEADER_SIZE:-wire.SIGNATURE_SIZE]), dtype="<f4").copy()
    body[0] = np.nan
    raw = body.tobytes()
    f = list(wire.HEADER.unpack(bytes(packet[:wire.HEADER.size])))
    f[28] = zlib.crc32(raw)
    head = wire.HEADER.pack(*f)
    poisoned = head + struct.pack("<I", zlib.crc32(head)) + raw
    poisoned += wire.signature(poisoned, OTHER)
    assert "non-finite" in receive_packet(poisoned, Acceptance(kind="bev"))
    assert receive_packet(poisoned, Acceptance(kind="bev", key=KEY)).startswith("bad signature")


def test_pose_noise_is_signed_by_the_sender():
    """The channel's pose noise stands for the sender's own localisation error: with the alliance key
    the noisy packet is signed again and accepted; changed without it, it fails the check."""
    packet = encode(_msg(), key=KEY)
    noisy = ChannelConfig(pose_noise_m=0.5, pose_noise_deg=1.0, seed=3)
    resigned = apply_channel(packet, noisy, (0,), KEY)
    got = decode(resigned, wire.Limits(key=KEY))
    assert not np.allclose(got.pose, _msg().pose)
    with pytest.raises(wire.MessageError, match="bad signature"):
        decode(apply_channel(packet, noisy, (0,)), wire.Limits(key=KEY))


def _model(monkeypatch, **receiver):
    monkeypatch.setenv("GENCOMM_TEST_KEY", KEY.decode())
    torch.manual_seed(0)
    model = CooperativeDetector(**{k: v for k, v in MODEL.items()}, lidar_range=RANGE).eval()
    model.receiver = ReceiverConfig(key_env="GENCOMM_TEST_KEY", **receiver)
    return model


def _dataset(n=1):
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()})
    return CooperativeDataset(SyntheticReader(n), cfg, {"m1": (0.8, 0.8, 4.0)}, train=False, cooperation="all")


def _alone(model, batch):
    with torch.no_grad():
        feats = model.encode(batch).feats
        return model.method.detect(model, batch, feats, model.method.send(model, batch, feats).select([]))[0]


def test_signed_prediction_arrives_and_counts_the_signature_bytes(monkeypatch):
    model = _model(monkeypatch)
    assert model.authenticated
    batch = collate_samples([_dataset()[0]])
    pred = model.predict(batch, channel=ChannelConfig(pose_noise_m=0.3, pose_noise_deg=0.5, seed=1))
    shape = (model.channels, *model.grid.shape)
    assert len(pred.delivery.arrived) == 2 and not pred.delivery.rejected
    assert pred.delivery.bytes_sent == [wire.message_nbytes(shape, signed=True)] * 2


@pytest.mark.parametrize("forge, reason", [(lambda p: decode(p), "unsigned"),
                                           (lambda p: encode(decode(p), key=OTHER), "bad signature")])
def test_unsigned_and_wrongly_signed_messages_are_rejected_and_the_ego_still_detects(forge, reason, monkeypatch):
    """An outsider's packets replace the members' on the way: refused, and the ego detects alone."""
    model = _model(monkeypatch)
    batch = collate_samples([_dataset()[0]])
    alone = _alone(model, batch)
    honest_channel = messages_module.apply_channel

    def outsider(packet, config, key, signing_key=None):
        forged = forge(honest_channel(packet, config, key, signing_key))
        return encode(forged) if isinstance(forged, Message) else forged

    monkeypatch.setattr(messages_module, "apply_channel", outsider)
    pred = model.predict(batch)
    assert len(pred.delivery.arrived) == 0 and len(pred.delivery.rejected) == 2
    assert all(r.startswith(reason + ":") for _, r in pred.delivery.rejected)
    got = pred.detections[0]
    assert len(got.boxes) == len(alone.boxes) > 0
    torch.testing.assert_close(got.scores, alone.scores)


def test_evaluation_counts_rejections_by_rule_and_never_writes_the_key(monkeypatch, tmp_path):
    """Duplicated senders under a key: the copies are refused as duplicates, counted by rule in the
    results' channel stats, with the receiver's settings; the key itself is in no results file."""
    model = _model(monkeypatch, max_age=5.0)
    honest = type(model.method).send
    monkeypatch.setattr(model.method, "send", lambda m, b, f: honest(model.method, m, b, f).select([0, 0, 0, 1]),
                        raising=False)
    res = evaluate(model, _dataset(2), out_dir=tmp_path, plot_every=0, label="dup", progress=False, resamples=10)
    ch = res.channel
    assert ch["sent"] == 8 and ch["rejected"] == 4 and ch["rejected_reasons"] == {"duplicate sender": 4}
    assert ch["authenticated"] is True and ch["receiver"]["key_env"] == "GENCOMM_TEST_KEY"
    assert ch["receiver"]["max_age"] == 5.0
    assert res.bytes_per_message == wire.message_nbytes((model.channels, *model.grid.shape), signed=True)
    assert "duplicate sender: 4" in res.table()
    for path in tmp_path.iterdir():
        if path.suffix in (".json", ".yaml"):
            assert KEY.decode() not in path.read_text() and "GENCOMM_TEST_KEY" in path.read_text()
    json.loads((tmp_path / "eval_dup.json").read_text())


def test_live_demo_signs_and_rejects_unsigned_packets_with_counts(monkeypatch):
    model = _model(monkeypatch)
    cfg = ExperimentConfig(name="live", data=DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()}),
                           model=dict(MODEL))

    class Outsider(ChannelEffects):
        """Delivers what was sent plus an unsigned copy of each packet and a stale signed one."""

        def step(self, packets):
            out = super().step(packets)
            extra = []
            for p in out:
                m = decode(p)
                extra.append(encode(m))
                extra.append(encode(dataclasses.replace(m, sender_id=m.sender_id + 1000), key=KEY))
            return out + extra

    effects = Outsider(pose_noise_std_m=0.2, seed=0)
    live = LiveCooperation(cfg, model, effects)
    assert effects.signing_key == KEY
    r = live.step(make_frame(seed=0))
    shape = (model.channels, *model.grid.shape)
    assert r.bytes_sent == [wire.message_nbytes(shape, signed=True)] * 2
    assert r.received == 2 and r.rejected_counts == {"unsigned": 2, "unregistered sender": 2}
    assert live.total_rejected == 4 and live.rejected_reasons == {"unsigned": 2, "unregistered sender": 2}
    assert len(r.boxes) > 0


def test_stale_messages_rejected_in_the_live_demo(monkeypatch):
    """Latency of two ticks (frames one 0.05 s tick apart) with max_age one tick, in seconds: every
    delivered message is refused as stale."""
    model = _model(monkeypatch, max_age=0.05)
    cfg = ExperimentConfig(name="live", data=DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()}),
                           model=dict(MODEL))
    live = LiveCooperation(cfg, model, ChannelEffects(latency_ticks=2), tick_s=0.05)
    ticks = [live.step(make_frame(seed=t, timestamp=f"{t:06d}")) for t in range(4)]
    assert [t.received for t in ticks] == [0, 0, 0, 0]
    assert [t.rejected_counts for t in ticks] == [{}, {}, {"stale": 2}, {"stale": 2}]
    assert all(len(t.boxes) > 0 for t in ticks)


def test_key_is_loaded_by_reference_with_one_line_errors(monkeypatch, tmp_path):
    monkeypatch.delenv("GENCOMM_NO_SUCH_KEY", raising=False)
    with pytest.raises(ValueError, match="^receiver.key_env: environment variable GENCOMM_NO_SUCH_KEY is not set"):
        ReceiverConfig(key_env="GENCOMM_NO_SUCH_KEY").load_key()
    short = tmp_path / "short.key"
    short.write_text("tooshort\n")
    with pytest.raises(ValueError, match="8-byte key.*at least 16") as err:
        ReceiverConfig(key_file=str(short)).load_key()
    assert "tooshort" not in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="cannot read"):
        ReceiverConfig(key_file=str(tmp_path / "missing.key")).load_key()
    good = tmp_path / "alliance.key"
    good.write_bytes(KEY + b"\n")
    assert ReceiverConfig(key_file=str(good)).load_key() == KEY
    assert ReceiverConfig().load_key() is None


def test_experiment_receiver_section_reaches_the_model(monkeypatch, tmp_path):
    data = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()})
    key = tmp_path / "alliance.key"
    key.write_bytes(KEY)
    model = build_model(ExperimentConfig(name="k", data=data, model=dict(MODEL, max_boxes=7),  # the receiver's
                                         receiver=ReceiverConfig(key_file=str(key), max_boxes=7)))  # bound >= it
    assert model.authenticated and model.acceptance().key == KEY and model.receiver.max_boxes == 7
    assert KEY.decode() not in repr(model.acceptance())
    unkeyed = build_model(ExperimentConfig(name="k", data=data, model=dict(MODEL)))
    assert not unkeyed.authenticated and unkeyed.acceptance().key is None
    monkeypatch.delenv("GENCOMM_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="GENCOMM_NO_SUCH_KEY is not set"):
        build_model(ExperimentConfig(name="k", data=data, model=dict(MODEL),
                                     receiver=ReceiverConfig(key_env="GENCOMM_NO_SUCH_KEY")))
