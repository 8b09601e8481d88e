"""MPDA's receiver-side alignment: window / grid partitions, the adapter only for the adapted
sender types (the alliance's own messages pass through exactly as the full feature would),
the sender's type taken from the message header, the adversarial domain loss and its
gradient reversal, and the reference sizes' parameter count."""
import pytest
import torch

from opencood_ext.models.links import Arrival
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.eval.flops import count_flops
from opencood_ext.methods.base import feature_macs
from opencood_ext.methods.mpda import MPDAAdapter, MPDALink
from opencood_ext.methods.mpda_modules import DomainClassifier, WindowSelfAttention, merge, partition
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.models.links import FullFeatureLink
from opencood_ext.data.synthetic import SyntheticReader

torch.set_num_threads(1)
RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)
SMALL = {"resizer": {"mlp_dim": 16, "dim_head": 4, "dropout": 0.0}, "attention": {"heads": 2, "dim_head": 4},
         "domain": {"hidden": 16}}


def _pp(filters):
    return {"encoder": {"type": "pointpillars", "voxel_size": [0.8, 0.8, 4.0], "num_filters": [filters]},
            "backbone": {"layer_nums": [1], "layer_strides": [2], "num_filters": [8], "upsample_strides": [1],
                         "num_upsample_filters": [8]}, "shrink_channels": 8}


@pytest.mark.parametrize("grid", [False, True])
@pytest.mark.parametrize("hw", [(6, 8), (7, 9)])
def test_partition_groups_the_right_cells_and_merge_undoes_it(grid, hw):
    H, W = hw
    x = torch.arange(2 * 3 * H * W, dtype=torch.float32).reshape(2, 3, H, W)
    t, info = partition(x, 2, grid)
    nh, nw = -(-H // 2), -(-W // 2)
    assert t.shape == (2 * nh * nw, 4, 3)
    assert torch.equal(merge(t, info), x)
    xp = torch.nn.functional.pad(x, (0, 2 * nw - W, 0, 2 * nh - H))
    # the first group of sample 0: a 2 x 2 neighbourhood, or 2 x 2 cells nh / nw apart
    rows, cols = ([0, nh], [0, nw]) if grid else ([0, 1], [0, 1])
    want = torch.stack([xp[0, :, r, c] for r in rows for c in cols])
    assert torch.equal(t[0], want)


def test_reference_sizes_give_the_reference_parameter_count():
    """C = 128 with the reference baseline's resizer / cross-domain / classifier settings."""
    a = MPDAAdapter(128)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert (count(a.resizer), count(a.cross), count(a.domain)) == (1_169_424, 678_528, 66_561)


def test_only_adapted_sender_types_are_changed():
    torch.manual_seed(0)
    link = MPDALink(8, ["m1", "m3"], RANGE, adapted_types=["m3"], **SMALL).eval()
    full = FullFeatureLink(8, ["m1", "m3"], RANGE)
    payload = torch.randn(3, 8, 10, 10)
    ego = torch.randn(3, 8, 10, 10)
    T = torch.eye(4).repeat(3, 1, 1)
    T[1, 0, 3] = 6.4
    valid = torch.ones(3, 1, 10, 10)
    valid[1, :, :, :2] = 0
    got = link.receive(payload, Arrival(T, ["m1", "m1", "m3"], ego, ["m1"] * 3, valid))
    want = full.receive(payload, Arrival(T, ["m1", "m1", "m3"], ego, ["m1"] * 3, valid)) * valid
    assert torch.equal(got[:2], want[:2])
    assert not torch.allclose(got[2], want[2])
    torch.testing.assert_close(got[2], link.adapter["m3"](want[2:], ego[2:])[0])
    with pytest.raises(ValueError, match="adapted_types"):
        MPDALink(8, ["m1"], RANGE, adapted_types=["m9"])


def test_domain_loss_trains_the_classifier_and_reverses_into_the_adapter():
    torch.manual_seed(0)
    link = MPDALink(8, ["m1", "m3"], RANGE, adapted_types=["m3"], domain_weight=2.0, **SMALL).train()
    payload, ego = torch.randn(2, 8, 6, 6), torch.randn(2, 8, 6, 6)
    T, valid = torch.eye(4).repeat(2, 1, 1), torch.ones(2, 1, 6, 6)
    plain = Arrival(T, ["m1", "m1"], ego, ["m1", "m1"], valid)
    assert link.losses(link.receive(payload, plain), payload, plain) == {}  # nothing adapted, no domain term
    mixed = Arrival(T, ["m3", "m1"], ego, ["m1", "m1"], valid)
    got = link.receive(payload, mixed)
    loss = link.losses(got, payload, mixed)["domain"]
    # at initialisation the classifier's logits are ~0: BCE ~ log 2, times the weight
    assert abs(float(loss.detach()) - 2.0 * float(torch.log(torch.tensor(2.0)))) < 1e-2
    loss.backward()
    adapter = link.adapter["m3"]
    assert adapter.domain.conv2.weight.grad.abs().sum() > 0 and adapter.resizer.select.weight.grad.abs().sum() > 0


def test_gradient_reversal_scales_and_flips_the_feature_gradient():
    torch.manual_seed(0)
    clf = DomainClassifier(4, hidden=8, reverse_scale=9.1)
    x = torch.randn(1, 4, 3, 3, requires_grad=True)
    clf(x).sum().backward()
    reversed_grad = x.grad.clone()
    x.grad = None
    head = torch.nn.Sequential(clf.conv1, torch.nn.ReLU(), clf.conv2)
    head(x).sum().backward()
    torch.testing.assert_close(reversed_grad, -9.1 * x.grad)


def test_detector_gives_the_adapter_each_messages_header_type():
    """Through the fusion method: an m1 + m3 alliance where m3's messages are adapted; an m1
    collaborator's message reaches the fusion exactly as the full-feature link delivers it."""
    torch.manual_seed(0)
    types = {"m1": _pp(8), "m3": _pp(6)}
    link = {"type": "mpda", "adapted_types": ["m3"], **SMALL}
    model = CooperativeDetector(types, RANGE, fusion="intermediate", fusion_op="max", link=link).eval()
    cfg = DataConfig(lidar_range=RANGE, agent_types={t: AgentTypeData() for t in types})
    ds = CooperativeDataset(SyntheticReader(1, types=("m1", "m3", "m1")), cfg, model.voxel_sizes(), train=False)
    batch = collate_samples([ds[0]])
    seen = []
    model.link.adapter["m3"].register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
    with torch.no_grad():
        pred = model.predict(batch)
    assert pred.delivery.arrived.agent_type == ["m3", "m1"] and seen == [1]
    assert pred.delivery.bytes_sent[0] == 204 + 8 * model.grid.shape[0] * model.grid.shape[1] * 4


def test_feature_macs_adds_the_attention_matmuls():
    """Window attention on n tokens of width C with h heads: the layers' MACs (qkv, out) plus
    2 * n * n * C for the scores and the mixing, which no layer hook sees."""
    attn = WindowSelfAttention(8, 4, window=2, dropout=0.0)
    x = torch.zeros(5, 4, 8)
    layers = count_flops(attn, (x,)) // 2
    assert layers == 5 * 4 * (8 * 24 + 8 * 8)  # to_qkv and to_out
    assert feature_macs(attn, (x,)) == layers + 2 * 5 * 4 * 4 * 8
