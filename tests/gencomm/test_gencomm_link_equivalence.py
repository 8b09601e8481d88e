"""GenComm's link computed the faster way (the generator's input conv split into a message half
computed once and a feature half per step; one agent type without gather/scatter copies) gives the
outputs and gradients of the straightforward computation, written here as the reference: every
UNet step on the concatenated ``[message, x_t]``, and each type's rows gathered into a zero-filled
output by index (``experiments/bench/link_cost.py``'s straightforward computation, which
``tools/bench.py link`` times against the current one)."""
import copy

import pytest
import torch

import gencomm  # noqa: F401  (registers the link)
from experiments.bench.link_cost import straightforward_generate as reference_generate
from experiments.bench.link_cost import straightforward_receive as reference_receive
from experiments.bench.link_cost import straightforward_send as reference_send
from gencomm.generator import SpatialAwareFeatureGenerator
from gencomm.link import GenCommLink
from opencood_ext.models.links import Arrival
from opencood_ext.models.warp import warp_mask

C, H, W = 16, 12, 10
RANGE = [-40.0, -40.0, -3.0, 40.0, 40.0, 1.0]
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny float64 maps: threads only contend
GENERATORS = {"compact": {"variant": "compact", "base_channels": 8},
              "reference": {"variant": "reference", "base_channels": 8}}


def _link(types, generator, warp_first=True):
    torch.manual_seed(0)
    link = GenCommLink(C, types, RANGE, message={"hidden_channels": 8, "message_channels": 2},
                       generator=generator, warp_before_generation=warp_first)
    with torch.no_grad():  # off the zero / identity initialisations, so every path carries signal
        for p in link.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return link.double().train()  # float64: the two orders of summation agree to ~1e-12


def _run(link, send, receive, senders, receivers):
    n = len(senders)
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(n, C, H, W, generator=g, dtype=torch.float64).requires_grad_()
    own = torch.randn(n, C, H, W, generator=g, dtype=torch.float64).requires_grad_()
    T = torch.eye(4, dtype=torch.float64).repeat(n, 1, 1)
    T[:, 0, 3] = torch.linspace(-6.0, 9.0, n)
    T[:, 1, 3] = 4.0
    arrival = Arrival(T, senders, own, receivers, warp_mask(T, RANGE, (H, W), dtype=torch.float64))
    link.zero_grad(set_to_none=True)
    torch.manual_seed(2)  # the generator's noise comes from the global RNG in training
    got = receive(send(feats, senders), arrival)
    loss = (got * torch.linspace(-1, 1, got.numel(), dtype=got.dtype).reshape(got.shape)).sum()
    loss = loss + sum(link.losses(got, feats, arrival).values())
    loss.backward()
    return {"output": got.detach(), "d features": feats.grad, "d own": own.grad,
            **{n: p.grad for n, p in link.named_parameters()}}


@pytest.mark.parametrize("warp_first", [True, False], ids=["warp_first", "generate_first"])
@pytest.mark.parametrize("generator", sorted(GENERATORS))
@pytest.mark.parametrize("senders,receivers", [
    (["m1"] * 3, ["m1"] * 3),                           # stage 1: one type
    (["m1", "m2", "m1"], ["m2", "m1", "m1"]),           # an alliance: gathered by type
])
def test_link_equals_reference_computation(generator, senders, receivers, warp_first):
    link = _link(sorted(set(senders) | set(receivers)), GENERATORS[generator], warp_first)
    ref = copy.deepcopy(link)
    want = _run(ref, lambda f, t: reference_send(ref, f, t),
                lambda p, a: reference_receive(ref, p, a, warp_first), senders, receivers)
    got = _run(link, link.send, link.receive, senders, receivers)
    assert want["output"].abs().sum() > 0
    assert set(got) == set(want)
    for name in want:
        if want[name] is None:
            assert got[name] is None, name
            continue
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-10, msg=name)


@pytest.mark.parametrize("generator", sorted(GENERATORS))
def test_generator_chain_equals_concatenated_input(generator):
    """The SAFG alone, seeded generator, evaluation mode: same feature as the concatenated chain."""
    torch.manual_seed(0)
    safg = SpatialAwareFeatureGenerator(C, 2, **GENERATORS[generator]).double().eval()
    g = torch.Generator().manual_seed(3)
    msg = torch.randn(2, 2, H, W, generator=g, dtype=torch.float64)
    init = torch.randn(2, C, H, W, generator=g, dtype=torch.float64)
    got = safg(msg, init, generator=torch.Generator().manual_seed(4)).feature
    want = reference_generate(safg, msg, init, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("generator", sorted(GENERATORS))
def test_flop_count_unchanged_by_the_split(generator):
    """The FLOP counter's hooks see the split input conv's calls: the generator counts what the
    concatenated computation counts (same layers, same arithmetic)."""
    from opencood_ext.eval.flops import flops_during
    link = _link(["m1"], GENERATORS[generator])
    g = torch.Generator().manual_seed(6)
    msg = torch.randn(2, 2, H, W, generator=g, dtype=torch.float64)
    init = torch.randn(2, C, H, W, generator=g, dtype=torch.float64)
    safg = link.safg["m1"]
    counted = flops_during([safg], lambda: safg(msg, init))
    assert counted > 0 and counted == flops_during([safg], lambda: reference_generate(safg, msg, init))
