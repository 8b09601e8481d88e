"""CodeFilling: the codebook quantiser against closed-form cases, the codes message through
the wire (indices in = indices out, bytes = header + planes * H * W * itemsize), the
training (straight-through) message equal in value to the wire's, and codes outside the
codebook refused cell by cell."""
import pytest
import torch
from torch import nn

from opencood_ext.models.links import Arrival
from opencood_ext.comm.messages import Messages, transmit
from opencood_ext.comm.wire import HEADER_SIZE
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.methods.codefilling import CodeFillingLink, ResidualCodebookQuantizer
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.data.synthetic import SyntheticReader

torch.set_num_threads(1)
RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)
PP = {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [8]},
      "backbone": {"layer_nums": [1], "layer_strides": [2], "num_filters": [8], "upsample_strides": [1],
                   "num_upsample_filters": [8]}, "shrink_channels": 8}


def _identity(linear: nn.Linear):
    with torch.no_grad():
        linear.weight.copy_(torch.eye(linear.in_features))
        linear.bias.zero_()


def test_one_level_picks_the_nearest_entry_per_segment_and_rebuilds_it():
    """Identity maps, one level: each half of a cell's feature becomes its nearest codebook entry."""
    torch.manual_seed(0)
    q = ResidualCodebookQuantizer(4, segments=2, codes=3, levels=1)
    for lin in [*q.latent, *q.to_code, *q.from_code, *q.restore]:
        _identity(lin)
    with torch.no_grad():
        q.codebook.copy_(torch.tensor([[[[0., 0.], [1., 1.], [5., -5.]],       # segment 0
                                        [[2., 2.], [-1., 0.], [0., 9.]]]]))     # segment 1
    x = torch.tensor([[0.9, 1.2, -0.8, 0.1], [4.0, -4.0, 0.1, 8.0]]).T.reshape(1, 4, 1, 2)
    onehot = q.quantize(x, sample=False)
    assert onehot.shape == (1, 2, 3, 1, 2)
    assert onehot.argmax(2)[0, :, 0].tolist() == [[1, 2], [1, 2]]
    want = torch.tensor([[1., 1., -1., 0.], [5., -5., 0., 9.]]).T.reshape(1, 4, 1, 2)
    torch.testing.assert_close(q.dequantize(onehot), want)
    torch.testing.assert_close(q(x), want)


def test_levels_quantise_the_residual():
    """Two levels, identity maps: level 2 codes what level 1 left over; the receiver sums both."""
    torch.manual_seed(0)
    q = ResidualCodebookQuantizer(2, segments=1, codes=2, levels=2)
    for lin in [*q.latent, *q.to_code, *q.residual, *q.from_code, *q.side, *q.restore]:
        _identity(lin)
    with torch.no_grad():
        q.codebook.copy_(torch.tensor([[[[0., 0.], [4., 4.]]], [[[0., 0.], [1., -1.]]]]))
    x = torch.tensor([5.2, 2.8]).reshape(1, 2, 1, 1)   # level 1: (4, 4), residual (1.2, -1.2) -> (1, -1)
    onehot = q.quantize(x, sample=False)
    assert onehot.argmax(2).flatten().tolist() == [1, 1]
    torch.testing.assert_close(q.dequantize(onehot), torch.tensor([5., 3.]).reshape(1, 2, 1, 1))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="segments"):
        ResidualCodebookQuantizer(8, segments=3)
    with pytest.raises(ValueError, match="codes"):
        CodeFillingLink(8, ["m1"], RANGE, codes=1 << 17)


def _model(codes=16):
    torch.manual_seed(0)
    return CooperativeDetector({"m1": PP}, RANGE, fusion="intermediate", fusion_op="max", score_threshold=0.01,
                               link={"type": "codefilling", "codes": codes}).eval()


def _batch():
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()})
    ds = CooperativeDataset(SyntheticReader(1), cfg, {"m1": (0.8, 0.8, 4.0)}, train=False, cooperation="all")
    return collate_samples([ds[0]])


@pytest.mark.parametrize("codes, dtype, itemsize", [(16, "uint8", 1), (300, "uint16", 2)])
def test_codes_round_trip_the_wire_exactly(codes, dtype, itemsize):
    model = _model(codes)
    batch = _batch()
    assert model.link.kind == "codes" and model.link.wire_dtype == dtype
    with torch.no_grad():
        feats = model.encode(batch).feats
        sent = model.method.send(model, batch, feats)
        pred = model.predict(batch)
    H, W = model.grid.shape
    planes = model.link.payload_channels
    assert planes == 6 and sent.kind == "codes" and len(sent) == 2
    for p in sent.payload:
        assert p.shape == (planes, H, W) and not p.dtype.is_floating_point and int(p.max()) < codes
    d = pred.delivery
    assert d.bytes_sent == [HEADER_SIZE + planes * H * W * itemsize] * 2 and not d.rejected
    for a, b in zip(d.arrived.payload, sent.payload):
        assert torch.equal(a, b)  # indices in = indices out
    assert int(torch.stack(sent.payload).max()) > 0  # several entries are in use
    # the receiver's acceptance: codes of this shape only
    acc = model.method.accept(model)
    assert acc.kind == "codes" and acc.shape == (planes, H, W)
    bev = Messages("bev", [0], [1], [7], ["m1"], [0.0], sent.pose[:1], [torch.zeros(planes, H, W)])
    assert transmit(bev, wire=True, dtype="float32", accept=acc).rejected[0][1].startswith("payload kind 'bev'")


def test_training_message_is_the_straight_through_one_hot_of_the_wire_codes():
    """In memory the message is a one-hot with gradients; its value rebuilds exactly what its
    integer codes (what the wire carries) rebuild, and the loss reaches the sender's maps and
    the codebook."""
    torch.manual_seed(0)
    link = CodeFillingLink(8, ["m1"], RANGE, codes=16).train()
    x = torch.randn(2, 8, 6, 5)
    onehot = link.send(x, ["m1", "m1"])
    assert onehot.shape == (2, 6, 16, 6, 5) and onehot.requires_grad
    assert torch.equal(onehot.detach().sum(2), torch.ones(2, 6, 6, 5))
    T = torch.eye(4).expand(2, 4, 4)
    valid = torch.ones(2, 1, 6, 5)
    got = link.receive(onehot, Arrival(T, ["m1", "m1"], x, ["m1", "m1"], valid))
    link.eval()
    again = link.receive(onehot.detach().argmax(2), Arrival(T, ["m1", "m1"], x, ["m1", "m1"], valid))
    torch.testing.assert_close(got.detach(), again)
    link.train()
    loss = got.square().mean() + link.losses(got, x, Arrival(T, ["m1", "m1"], x, ["m1", "m1"], valid))["codebook"]
    loss.backward()
    q = link.quantizer
    for p in (q.latent[0].weight, q.to_code[0].weight, q.codebook, q.temperature, q.restore[0].weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_reconstruction_loss_is_the_masked_mse_to_the_senders_feature():
    link = CodeFillingLink(4, ["m1"], RANGE, reconstruction_weight=0.5)
    received = torch.ones(1, 4, 2, 2)
    sender = torch.zeros(1, 4, 2, 2)
    valid = torch.tensor([[[[1., 0.], [0., 0.]]]])
    arrival = Arrival(torch.eye(4)[None], ["m1"], sender, ["m1"], valid)
    loss = link.losses(received, sender, arrival)["codebook"]
    torch.testing.assert_close(loss, torch.tensor(0.5))
    assert CodeFillingLink(4, ["m1"], RANGE, reconstruction_weight=0.0).losses(received, sender, arrival) == {}


def test_codes_outside_the_codebook_leave_their_cells_empty():
    torch.manual_seed(0)
    link = CodeFillingLink(8, ["m1"], RANGE, codes=16).eval()
    x = torch.randn(1, 8, 4, 4)
    codes = link.send(x, ["m1"])
    T = torch.eye(4)[None]
    valid = torch.ones(1, 1, 4, 4)
    good = link.receive(codes, Arrival(T, ["m1"], x, ["m1"], valid))
    bad = codes.clone()
    bad[0, 3, 1, 2] = 200
    got = link.receive(bad, Arrival(T, ["m1"], x, ["m1"], valid))
    assert torch.equal(got[0, :, 1, 2], torch.zeros(8))
    keep = torch.ones(4, 4, dtype=torch.bool)
    keep[1, 2] = False
    torch.testing.assert_close(got[0][:, keep], good[0][:, keep])
