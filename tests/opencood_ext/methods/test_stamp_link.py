"""STAMP's link on its own: the reference's adapter / reverter size and cost, the sender and
receiver halves, and the alignment losses (which features they compare, in which frame, and
which module each term trains)."""
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from opencood_ext.models.links import Arrival
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.methods import ONBOARDING
from opencood_ext.methods.stamp import DomainAdapter, StampLink
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.models.warp import warp_to_ego
from opencood_ext.data.synthetic import SyntheticReader

RANGE = [-32.0, -32.0, -3.0, 32.0, 32.0, 1.0]


def _conv_next_params(d, k=7):
    # depthwise conv (weights + bias), LayerNorm, d -> 4d -> d MLP, layer scale
    return (d * k * k + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d) + d


def test_adapter_and_reverter_have_the_reference_size():
    c, d = 128, 64
    link = StampLink(c, ["m1", "m2"], RANGE, protocol="m1")
    assert set(link.adapter) == set(link.reverter) == {"m2"}  # the protocol owner has none
    per_module = (c * d + d) + 3 * _conv_next_params(d) + (d * c + c)
    assert sum(p.numel() for p in link.adapter["m2"].parameters()) == per_module == 126_016
    assert sum(p.numel() for p in link.parameters()) == 2 * per_module == 252_032
    # the reference counts 547,200: the same modules plus a 3x3 C -> C "smoothing" conv in each that
    # its forward never applies (stamp_modules/adapter.py, AdapterConvNext)
    assert 2 * per_module + 2 * (c * c * 9 + c) == 547_200


def test_cost_is_the_reference_two_gmacs_at_64_x_128():
    c, d, h, w = 128, 64, 64, 128
    model = nn.Module()
    model.link = StampLink(c, ["m1", "m2"], RANGE, protocol="m1")
    model.channels, model.grid = c, SimpleNamespace(shape=(h, w))
    params, gflops = ONBOARDING.get_class("stamp", "method")().cost(model, "m2", batch=None)
    per_cell = 2 * c * d + 3 * (49 * d + d + 2 * d * 4 * d)  # 1x1 convs, blocks (LayerNorm 1 MAC/element)
    assert params == 252_032
    assert gflops == pytest.approx(2 * 2 * h * w * per_cell / 1e9)
    assert gflops / 2 == pytest.approx(2.03, abs=0.01)  # DESIGN.md: 2.03 GMACs on the reference modules


def test_sender_adapts_and_receiver_reverts_its_own_type():
    torch.manual_seed(0)
    link = StampLink(8, ["m1", "m2", "m3"], RANGE, protocol="m1", hidden_channels=4, blocks=1).eval()
    x = torch.randn(3, 8, 10, 10)
    sent = link.send(x, ["m1", "m2", "m3"])
    assert torch.equal(sent[0], x[0])  # the protocol owner sends its feature as it is
    assert torch.allclose(sent[1:2], link.adapter["m2"](x[1:2]))
    assert torch.allclose(sent[2:3], link.adapter["m3"](x[2:3]))
    eye = torch.eye(4).expand(3, 4, 4)
    got = link.receive(sent, Arrival(eye, ["m1"] * 3, torch.zeros_like(x), ["m1", "m2", "m3"], torch.ones(3, 1, 10, 10)))
    assert torch.equal(got[0], sent[0])  # an m1 receiver reads the protocol space directly
    assert torch.allclose(got[1:2], link.reverter["m2"](sent[1:2]))
    assert torch.allclose(got[2:3], link.reverter["m3"](sent[2:3]))
    with pytest.raises(KeyError, match="m9"):
        link.send(x[:1], ["m9"])
    with pytest.raises(ValueError, match="protocol"):
        StampLink(8, ["m2"], RANGE, protocol="m1")


def _shift(n, cells, cell=64.0 / 16):
    T = torch.eye(4).repeat(n, 1, 1)
    T[:, 0, 3] = cells * cell
    return T


@pytest.mark.parametrize("direction", ["new_to_protocol", "protocol_to_new"])
def test_alignment_compares_the_same_ground_in_the_new_types_frame(direction):
    """With identity adapter / reverter and the receiver's feature the sender's seen from 2 cells
    away, M->P and P->M are exactly 0: the protocol feature is moved into the new type's frame."""
    torch.manual_seed(1)
    link = StampLink(4, ["m1", "m2"], RANGE, protocol="m1")
    link.adapter["m2"], link.reverter["m2"] = nn.Identity(), nn.Identity()
    sender = torch.randn(2, 4, 16, 16)
    T = _shift(2, 2)
    receiver = warp_to_ego(sender, T, RANGE)  # the same world in the receiver's frame
    types = (["m2", "m2"], ["m1", "m1"]) if direction == "new_to_protocol" else (["m1", "m1"], ["m2", "m2"])
    ctx = dict(sender_types=types[0], receiver_types=types[1], receiver_features=receiver)
    out = link.losses(receiver, sender, Arrival(T, valid=torch.ones(2, 1, 16, 16), **ctx))
    assert out["align_m2p"].item() < 1e-9 and out["align_p2m"].item() < 1e-9
    if direction == "new_to_protocol":
        assert out["align_m2p2m"].item() == 0.0
    else:
        assert "align_m2p2m" not in out  # the cycle runs on new-type senders' own maps
    ctx["receiver_features"] = torch.randn_like(receiver)
    out = link.losses(receiver, sender, Arrival(T, valid=torch.ones(2, 1, 16, 16), **ctx))
    assert out["align_m2p"].item() > 0.1 * 10 and out["align_p2m"].item() > 0.1 * 9


def test_each_alignment_term_trains_its_own_module():
    torch.manual_seed(2)
    link = StampLink(4, ["m1", "m2"], RANGE, protocol="m1", hidden_channels=8, blocks=1)
    sender, receiver = torch.randn(1, 4, 16, 16), torch.randn(1, 4, 16, 16)
    T = _shift(1, 1)
    ctx = dict(sender_types=["m2"], receiver_types=["m1"], receiver_features=receiver)
    arrival = Arrival(T, valid=torch.ones(1, 1, 16, 16), **ctx)
    out = link.losses(warp_to_ego(link.send(sender, ["m2"]), T, RANGE), sender, arrival)
    assert set(out) == {"align_m2p", "align_p2m", "align_m2p2m"}
    for term, trains in (("align_m2p", "adapter"), ("align_p2m", "reverter"), ("align_m2p2m", "reverter")):
        link.zero_grad(set_to_none=True)
        out[term].backward(retain_graph=True)
        with_grad = {n.split(".")[0] for n, p in link.named_parameters()
                     if p.grad is not None and p.grad.abs().sum() > 0}
        assert with_grad == {trains}, term
    # a zero weight switches its term off
    quiet = StampLink(4, ["m1", "m2"], RANGE, protocol="m1", m2p_weight=0.0, p2m_weight=0.0)
    assert set(quiet.losses(receiver, sender, arrival)) == {"align_m2p2m"}


def test_the_detector_gives_the_link_both_sides_in_training_only():
    torch.manual_seed(3)
    stack = {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [8]},
             "backbone": {"layer_nums": [1], "layer_strides": [2], "num_filters": [8],
                          "upsample_strides": [1], "num_upsample_filters": [8]}, "shrink_channels": 8}
    model = CooperativeDetector({"m1": stack, "m2": stack}, RANGE, fusion="intermediate", fusion_op="max",
                                link={"type": "stamp", "protocol": "m1", "hidden_channels": 8, "blocks": 1})
    data = DataConfig(modality="cycle:m1,m2", lidar_range=tuple(RANGE), max_agents=3,
                      agent_types={"m1": AgentTypeData(), "m2": AgentTypeData()})
    ds = CooperativeDataset(SyntheticReader(1, types=("m1", "m2", "m1")), data, model.voxel_sizes(), train=False)
    batch = collate_samples([ds[0]])
    assert batch.agent_types[0] == "m1" and "m2" in batch.agent_types
    model.train()
    out = model(batch)
    assert {"align_m2p", "align_p2m", "align_m2p2m"} <= set(out.losses)
    loss = model.loss(out, batch)
    assert torch.isfinite(loss.total) and "align_m2p" in loss.parts
    model.eval()
    assert model(batch).losses == {}
