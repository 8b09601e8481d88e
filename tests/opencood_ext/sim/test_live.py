"""The live cooperation loop: wire, channel effects and fusion tick by tick."""
import dataclasses

import torch

from opencood_ext.data.dataset import AgentTypeData, DataConfig
from opencood_ext.comm import HEADER_SIZE, ChannelEffects
from opencood_ext.sim.live import LiveCooperation
from opencood_ext.experiment import ExperimentConfig
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.data.synthetic import make_frame

RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)
PP = {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [8]},
      "backbone": {"layer_nums": [1], "layer_strides": [2], "num_filters": [8], "upsample_strides": [1],
                   "num_upsample_filters": [8]}, "shrink_channels": 8}


def _setup(link="gencomm", **effects):
    torch.manual_seed(0)
    model_cfg = {"agent_types": {"m1": PP}, "fusion": "intermediate",
                 "link": {"type": link, **({"generator": {"base_channels": 8}} if link == "gencomm" else {})}}
    cfg = ExperimentConfig(name="live", data=DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()}),
                           model=model_cfg)
    model = CooperativeDetector(**model_cfg, lidar_range=RANGE)
    return LiveCooperation(cfg, model, ChannelEffects(**effects))


def test_ticks_send_messages_and_accumulate_ap():
    live = _setup()
    for t in range(3):
        r = live.step(make_frame(seed=t, timestamp=f"{t:06d}"))
        assert r.agent_ids == [10, 20, 30] and len(r.bytes_sent) == 2 and r.received == 2
        assert r.boxes.shape[1] == 7 and len(r.gt_boxes) > 0
    assert set(live.running_ap()) == {0.3, 0.5, 0.7}
    assert live.bytes_per_message == r.bytes_sent[0] < 8 * 32 * 32 * 4


def test_latency_and_loss():
    live = _setup(latency_ticks=1)
    first = live.step(make_frame(seed=0))
    second = live.step(make_frame(seed=1))
    assert first.received == 0 and second.received == 2  # last tick's messages arrive one tick late
    lossy = _setup(drop_prob=1.0)
    assert lossy.step(make_frame(seed=0)).received == 0


def test_full_feature_link_and_every_fusion_method_live():
    """The live loop runs whatever the model's fusion method sends: features, boxes, points."""
    live = _setup(link="full_feature")
    r = live.step(make_frame(seed=0))
    assert r.received == 2 and r.bytes_sent[0] > 8 * 32 * 32 * 4
    for fusion, per_item in (("late", 9 * 4), ("early", 4 * 4)):
        cfg = dataclasses.replace(live.cfg, model={"agent_types": {"m1": PP}, "fusion": fusion})
        lv = LiveCooperation(cfg, CooperativeDetector({"m1": PP}, RANGE, fusion=fusion).eval(), ChannelEffects())
        r = lv.step(make_frame(seed=0))
        assert r.received == 2 and not r.rejected
        assert all((b - HEADER_SIZE) % per_item == 0 for b in r.bytes_sent)
    early = lv.step(make_frame(seed=1)).bytes_sent  # early fusion sends every point of each scan
    assert min(early) > 1000 * 16


def test_live_detection_goes_through_the_post_fusion_layers():
    live = _setup(link="full_feature")
    model = CooperativeDetector(**{**live.cfg.model, "post_fusion_layers": 1}, lidar_range=RANGE)
    live = LiveCooperation(live.cfg, model, ChannelEffects())
    seen = []
    model.post_fusion.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    assert live.step(make_frame(seed=0)).received == 2
    assert seen == [(1, 8, 40, 40)]


def test_live_loop_uses_the_models_transport_blanking_and_wire_dtype():
    """The live loop delivers through model.deliver: blank_message_types zeroes the blanked senders'
    payloads, and the payload dtype is the link's wire_dtype (the config key, one way to set it)."""
    live = _setup(link="full_feature")
    model = live.model
    got = []
    honest = type(model.method).detect
    model.method.detect = lambda m, b, f, arrived: got.append(arrived) or honest(model.method, m, b, f, arrived)
    r = live.step(make_frame(seed=0))
    assert r.received == 2 and all(p.abs().sum() > 0 for p in got[-1].payload)
    assert r.bytes_sent == [HEADER_SIZE + 8 * 40 * 40 * 4] * 2  # float32: the link's default
    model.blank_message_types = {"m1"}
    model.link.wire_dtype = "float16"
    r = live.step(make_frame(seed=0))
    assert r.received == 2 and all(not p.any() for p in got[-1].payload)
    assert r.bytes_sent == [HEADER_SIZE + 8 * 40 * 40 * 2] * 2
