"""The contract every registered link, fusion method, fusion op and onboarding method keeps,
parametrized over the registries' contents (a newly registered entry is tested automatically):

(a) a receiver given only the packets' bytes (its own batch holds the ego alone, it is a separate
    model instance) detects exactly what ``predict`` detects in-process;
(b) onboarding trains what the method declares: ``trainable(new type)`` and nothing else, none of
    it taken from the frozen ego's run, and those parameters do reach the loss;
(c) the wire round trip: encode -> bytes -> decode gives the message back (exactly for float32 and
    codes; within the dtype's rounding otherwise), and re-encoding the decoded message gives the
    same bytes.

Tiny models: two PointPillars types m1 (ego) and m2 on a 24 x 24 grid, one synthetic frame.
"""
import copy

import numpy as np
import pytest
import torch

import gencomm  # noqa: F401  (registers GenComm's link and onboarding method)
import opencood_ext.methods  # noqa: F401  (registers the baselines' links and onboarding methods)
from opencood_ext.comm import Message, decode, encode
from opencood_ext.comm.messages import from_wire, receive_packet
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.methods import ONBOARDING
from opencood_ext.models.detector import FUSION_OPS, CooperativeDetector
from opencood_ext.models.fusion_methods import FUSION_METHODS
from opencood_ext.models.links import LINKS
from opencood_ext.training.freeze import FreezePolicy
from opencood_ext.data.synthetic import SyntheticReader

RANGE = (-19.2, -19.2, -3.0, 19.2, 19.2, 1.0)
VOXEL = (0.8, 0.8, 4.0)
BACKBONE = {"layer_nums": [1], "layer_strides": [2], "num_filters": [8], "upsample_strides": [1],
            "num_upsample_filters": [8]}
TYPES = {"m1": {"encoder": {"type": "pointpillars", "voxel_size": list(VOXEL), "num_filters": [8]},
                "backbone": BACKBONE, "shrink_channels": 8},
         "m2": {"encoder": {"type": "pointpillars", "voxel_size": list(VOXEL), "num_filters": [16]},
                "backbone": BACKBONE, "shrink_channels": 8}}
GENCOMM = {"type": "gencomm", "message": {"hidden_channels": 8}, "generator": {"base_channels": 8}}
# entries whose constructor needs arguments beyond the derived ones, or is large by default (also laid
# over an onboarding method's own link spec); any other entry is built from its name alone
LINK_ARGS = {"gencomm": GENCOMM, "stamp": {"protocol": "m1", "hidden_channels": 8, "blocks": 1, "kernel_size": 3},
             "stamp_collab": {"ego": "m1", "hidden_channels": 8, "blocks": 1, "kernel_size": 3},
             "mpda": {"adapted_types": ["m2"], "resizer": {"mlp_dim": 16, "dim_head": 4},
                      "attention": {"heads": 2, "dim_head": 4}, "domain": {"hidden": 16}}}
FUSION_OP_ARGS = {"v2xvit": dict(depth=1, agent_heads=2, agent_head_dim=8, windows=[4, 8], window_heads=[2, 1],
                                 window_head_dims=[8, 16], mlp_dim=16, dropout=0.0),
                  "pyramid": dict(layer_nums=[1, 1], layer_strides=[1, 2], num_filters=[8, 8], upsample_strides=[1, 2],
                                  num_upsample_filters=[8, 8], resnext=False)}
# fusion methods that need their own fusion op (the others run with max)
FUSION_METHOD_OPS = {"pyramid": "pyramid"}
CASES = ([("link", n) for n in LINKS] + [("fusion", n) for n in FUSION_METHODS]
         + [("fusion_op", n) for n in FUSION_OPS] + [("onboarding", n) for n in ONBOARDING])


def _model(registry: str, name: str) -> CooperativeDetector:
    fusion, op, link = "intermediate", "max", {"type": "full_feature"}
    if registry == "link":
        link = {**LINK_ARGS.get(name, {}), "type": name}
    elif registry == "fusion":
        fusion, op = name, FUSION_METHOD_OPS.get(name, op)
    elif registry == "fusion_op":
        op = name
    else:
        method = ONBOARDING.get_class(name, "onboarding method")()
        link = method.link(GENCOMM, "m1", ["m2"])  # GenComm stage-1 runs are every method's start
        link = link and {**link, **LINK_ARGS.get(link["type"], {})}
    torch.manual_seed(0)
    return CooperativeDetector(TYPES, RANGE, fusion=fusion, link=link, fusion_op=op,
                               fusion_args=FUSION_OP_ARGS.get(op), score_threshold=0.01).eval()


def _sample(cooperation: str, ego_alone: bool = False, ego_type_inputs: bool = False):
    """ego_type_inputs: a training sample whose collaborators also carry their scan as the ego type reads it
    (GenComm's ego-encoder target, ``gencomm_egotarget``); otherwise an evaluation sample."""
    cfg = DataConfig(lidar_range=RANGE, agent_types={t: AgentTypeData() for t in TYPES})
    reader = SyntheticReader(1, types=("m1", "m2", "m2"))
    sample = CooperativeDataset(reader, cfg, {t: VOXEL for t in TYPES}, train=ego_type_inputs, cooperation=cooperation,
                                ego_type_inputs=ego_type_inputs)[0]
    if ego_alone:
        sample.agents = sample.agents[:1]
    return sample


@pytest.fixture(scope="module", params=CASES, ids=[f"{r}-{n}" for r, n in CASES])
def case(request):
    """(registry, name, model, what predict detects on a cooperative batch, the collaborators' Messages)."""
    torch.set_num_threads(2)
    registry, name = request.param
    model = _model(registry, name)
    batch = collate_samples([_sample(model.method.dataset_agents(train=False))])
    with torch.no_grad():
        torch.manual_seed(1)  # a receiver that draws noise (GenComm's diffusion) draws the same on both paths
        want = model.predict(batch)
    return registry, name, model, want, want.delivery.sent


def test_a_receiver_from_bytes_alone_equals_predict(case):
    registry, name, model, want, sent = case
    dtype = model.method.wire_dtype(model)
    packets = [encode(sent.to_wire(i), dtype, key=model.signing_key) for i in range(len(sent))]
    cooperative = model.method.dataset_agents(train=False) != "ego_only"
    assert len(packets) == (2 if cooperative else 0) == len(want.delivery.arrived)
    assert not want.delivery.rejected
    receiver = copy.deepcopy(model)  # shares no memory with the senders
    coop = model.method.dataset_agents(train=False)
    own = collate_samples([_sample("early" if coop == "early" else "ego_only", ego_alone=True)])
    got = [receive_packet(p, receiver.acceptance()) for p in packets]
    assert all(isinstance(m, Message) for m in got), got
    arrived = from_wire(got, [0] * len(got), [-1] * len(got)) if got else sent.select([])
    with torch.no_grad():
        own_feats = receiver.encode(own).feats
        torch.manual_seed(1)
        det = receiver.method.detect(receiver, own, own_feats, arrived)[0]
    expected = want.detections[0]
    assert len(det.boxes) == len(expected.boxes) > 0, f"{registry} {name}"
    torch.testing.assert_close(det.boxes, expected.boxes)
    torch.testing.assert_close(det.scores, expected.scores)


def _under(name: str, prefixes) -> bool:
    return any(name == p.rstrip(".") or name.startswith(p.rstrip(".") + ".") for p in prefixes)


@pytest.mark.parametrize("name", list(ONBOARDING))
def test_b_onboarding_trains_what_the_method_declares(name):
    model = _model("onboarding", name)
    method = ONBOARDING.get_class(name, "onboarding method")()
    declared = method.trainable("m2")
    model = copy.deepcopy(model).train()
    FreezePolicy(declared, freeze_batchnorm_stats=True).apply(model)
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trains and trains == {n for n, _ in model.named_parameters() if _under(n, declared)}
    from_ego = {n for n in trains if _under(n, method.ego_prefixes("m1"))}
    # only what the method declares it retrains of the alliance (MPDA's reference set), nothing else
    allowed = {n for n, _ in model.named_parameters() if _under(n, list(method.alliance_parts))}
    assert from_ego == allowed, f"{name} trains weights of the frozen ego's run: {sorted(from_ego - allowed)[:3]}"
    views = getattr(model.link, "needs_ego_type_features", False)  # GenComm's ego-encoder target reads them
    batch = collate_samples([_sample(model.method.dataset_agents(train=True), ego_type_inputs=views)])
    torch.manual_seed(2)
    model.loss(model(batch), batch).total.backward()
    reached = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is not None and p.grad.any()]
    assert reached, f"{name}: no declared trainable parameter receives a gradient"
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)


def test_c_wire_round_trip(case):
    registry, name, model, _, sent = case
    if not len(sent):  # only a method that cooperates without messages may send none
        assert model.method.dataset_agents(train=False) == "ego_only", f"{registry} {name} sends nothing"
        return
    dtype = model.method.wire_dtype(model)
    exact = "uint16" if sent.kind == "codes" else "float32"
    for i in range(len(sent)):
        msg = sent.to_wire(i)
        original = msg.payload.detach().cpu()
        for wire_dtype in dict.fromkeys((dtype, exact)):
            packet = encode(msg, wire_dtype)
            back = decode(packet)
            assert (back.sender_id, back.agent_type, back.timestamp, back.kind) == \
                (msg.sender_id, msg.agent_type, msg.timestamp, msg.kind)
            assert np.array_equal(back.pose, msg.pose)
            assert back.payload.shape == original.reshape(back.payload.shape).shape
            want = original.reshape(back.payload.shape)
            if wire_dtype in ("float32", "uint8", "uint16"):
                assert torch.equal(back.payload, want.to(back.payload.dtype))
            elif wire_dtype == "float16":
                assert torch.equal(back.payload, want.half().float())
            else:  # int8: within half a step of max|x| / 127
                step = float(want.abs().max()) / 127
                assert float((back.payload - want).abs().max()) <= step / 2 + 1e-6
            if wire_dtype != "int8":  # int8's step is recomputed from the decoded peak
                assert encode(back, wire_dtype) == packet


@pytest.mark.parametrize("name", sorted(ONBOARDING))
def test_b_onboarding_cost_counts_exactly_what_trains(name):
    """``cost`` (the benchmark's trainable-parameter and GFLOP columns) runs for every method and counts
    the parameters under ``trainable`` once each."""
    from opencood_ext.methods.base import _modules_under, count_unique_parameters
    model = _model("onboarding", name).eval()
    method = ONBOARDING.get_class(name, "onboarding method")()
    batch = collate_samples([_sample(model.method.dataset_agents(train=False))])
    params, gflops = method.cost(model, "m2", batch)
    assert params == count_unique_parameters(_modules_under(model, method.trainable("m2")))
    assert gflops > 0
