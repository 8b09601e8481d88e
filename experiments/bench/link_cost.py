"""GenComm's link, forward + backward: the straightforward computation against the current one,
side by side in one process (ratios only on a shared machine).

    python tools/bench.py link [--messages 2] [--repeat 9] [--threads 1] [--clock cpu|wall] [--family sim]
                               [--protocol native|equalized]

The link is the one of ``bench train``'s GenComm model (``configs/<family>/gencomm_link.yaml`` on the
sim base, one agent type m1) on its BEV grid; ``--messages`` collaborators' (C, H, W) features go
through ``send``, ``receive`` (generate, enhance, warp, mask: the order of the config's protocol,
``equalized`` for the sim configs; warp first under ``native``; ``warp_first`` in the output) and
the generation loss, then backward. ``straightforward`` is the computation before issue 30 item 4, written out here:
the generator's UNet on the concatenated ``[message, x_t]`` at every step, each type's rows
gathered into a zero-filled output by index, and ``F.embedding_bag``'s own backward for the
deformable gather. Both are run once and compared
(``max_abs_diff_*``) before the timing; the two alternate, in turn first (ABBA), and the
figures are medians (``current_over_straightforward``: the speed-up's inverse), also per part
(``message_extractor_*``, ``generator_*``: that module's forward + backward alone).
The equality itself is tested in ``tests/gencomm/test_gencomm_link_equivalence.py``.
"""
from __future__ import annotations

import argparse
import statistics
import time
import types
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

import gencomm  # noqa: F401  (registers the GenComm link)
import opencood_ext.models.deform_conv as deform_conv
from experiments.bench.train_step import _config
from opencood_ext.experiment import build_model, load_experiment
from opencood_ext.models.links import Arrival
from opencood_ext.models.warp import warp_mask, warp_to_ego

_NATIVE_GATHER = types.SimpleNamespace(
    apply=lambda table, rows, w: F.embedding_bag(rows, table, per_sample_weights=w, mode="sum"))


def straightforward_generate(safg, message, init, generator=None):
    """The generator's chain with the UNet on the concatenated ``[message, x_t]`` at every step, the
    noise drawn in the same order as ``safg`` draws it (``generator``: as ``safg``'s own argument)."""
    a, b = safg._start
    x = init.mul(a).add_(safg._noise(init, generator), alpha=b)
    message = message.to(init.dtype)
    for t in range(safg.num_steps - 1, -1, -1):
        x0 = safg.unet(torch.cat([message, x], dim=1), torch.full((x.shape[0],), t, dtype=torch.long))
        if t > 0:
            x = safg.posterior_step(x0, x, t, safg._noise(x, generator))
    return x0


def straightforward_send(link, features, agent_types):
    """``link.send`` with each type's rows gathered into a zero-filled output by index."""
    out = features.new_zeros(features.shape[0], link.payload_channels, *features.shape[-2:])
    for t in dict.fromkeys(agent_types):
        idx = torch.as_tensor([i for i, a in enumerate(agent_types) if a == t])
        out[idx] = link.dme[t](features[idx]).to(out.dtype)
    return out


def straightforward_receive(link, payload, arrival, warp_first: bool):
    """``link.receive`` under a native computation (native or equalized): warp (``warp_first``), generate
    by :func:`straightforward_generate` per receiver type, enhance, warp (not ``warp_first``), mask."""
    cond = warp_to_ego(payload, arrival.T_ego_from_sender, link.lidar_range) if warp_first else payload
    init = arrival.receiver_features
    gen = init.new_zeros(init.shape)
    for r in dict.fromkeys(arrival.receiver_types):
        sel = torch.as_tensor([k for k, t in enumerate(arrival.receiver_types) if t == r])
        gen[sel] = link.enhancer[r](straightforward_generate(link.safg[r], cond[sel], init[sel])).to(gen.dtype)
    if not warp_first:
        gen = warp_to_ego(gen, arrival.T_ego_from_sender, link.lidar_range)
    return gen * arrival.valid


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="bench link", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=2)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    p.add_argument("--family", default="sim")
    p.add_argument("--protocol", choices=("native", "equalized"), default=None,
                   help="run the config under this protocol (default: the config's own)")
    args = p.parse_args(argv)
    if args.messages < 1:
        raise SystemExit(f"--messages must be >= 1, got {args.messages}")
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.manual_seed(0)
    model = build_model(load_experiment(_config("m1", "gencomm", args.family, None),
                                        [f"protocol={args.protocol}"] if args.protocol else []))
    link, n = model.link.train(), args.messages
    if model.computation != "native":
        raise SystemExit(f"bench link: the straightforward computation is written for protocols native and "
                         f"equalized, not {model.protocol}")
    warp_first = link.warps_first(model.protocol)  # the config's generation order under its protocol
    with torch.no_grad():  # off the zero / identity initialisations, so every path carries signal
        for prm in link.parameters():
            prm.add_(0.02 * torch.randn_like(prm))
    C, (H, W) = model.link.dme["m1"].in_channels, model.grid.shape
    feats, own = torch.randn(n, C, H, W), torch.randn(n, C, H, W)
    T = torch.eye(4).repeat(n, 1, 1)
    T[:, 0, 3], T[:, 1, 3] = torch.linspace(-8.0, 8.0, n), 3.0
    valid = warp_mask(T, link.lidar_range, (H, W))
    current_gather = deform_conv._WeightedGather

    def step(straight: bool) -> List[torch.Tensor]:
        deform_conv._WeightedGather = _NATIVE_GATHER if straight else current_gather
        try:
            link.zero_grad(set_to_none=True)
            f, o = feats.clone().requires_grad_(), own.clone().requires_grad_()
            arrival = Arrival(T, ["m1"] * n, o, ["m1"] * n, valid)
            torch.manual_seed(1)
            got = straightforward_receive(link, straightforward_send(link, f, arrival.sender_types), arrival,
                                          warp_first) if straight \
                else link.receive(link.send(f, arrival.sender_types), arrival)
            loss = got.square().mean() + sum(link.losses(got, feats, arrival).values())
            loss.backward()
            return [got.detach(), f.grad, o.grad] + [prm.grad for prm in link.parameters()]
        finally:
            deform_conv._WeightedGather = current_gather

    def part(fn: Callable, *inputs) -> Callable[[], None]:
        def run():
            leaves = [t.clone().requires_grad_() for t in inputs]
            torch.manual_seed(1)
            fn(*leaves).square().mean().backward()
        return run

    dme, safg = link.dme["m1"], link.safg["m1"]
    msg = torch.randn(n, link.payload_channels, H, W)

    def dme_straight(x):
        deform_conv._WeightedGather = _NATIVE_GATHER
        try:
            return dme(x)
        finally:
            deform_conv._WeightedGather = current_gather

    pairs: Dict[str, Dict[str, Callable[[], object]]] = {
        "link": {"straightforward": lambda: step(True), "current": lambda: step(False)},
        "message_extractor": {"straightforward": part(dme_straight, feats), "current": part(dme, feats)},
        "generator": {"straightforward": part(lambda m, i: straightforward_generate(safg, m, i), msg, own),
                      "current": part(lambda m, i: safg(m, i).feature, msg, own)},
    }
    res: Dict[str, object] = {}
    ref, cur = step(True), step(False)
    res["max_abs_diff_output"] = float((ref[0] - cur[0]).abs().max())
    res["max_abs_diff_gradients"] = max(float((a - b).abs().max()) for a, b in zip(ref[1:], cur[1:])
                                        if a is not None and b is not None)
    for name, fns in pairs.items():
        times: Dict[str, List[float]] = {k: [] for k in fns}
        for k, fn in fns.items():
            fn()  # warm-up
        for rep in range(args.repeat):
            for k, fn in (list(fns.items()) if rep % 2 == 0 else list(fns.items())[::-1]):  # ABBA order
                t0 = clock()
                fn()
                times[k].append(clock() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        res[f"{name}_straightforward_s"] = med["straightforward"]
        res[f"{name}_current_s"] = med["current"]
        res[f"{name}_current_over_straightforward"] = med["current"] / med["straightforward"]
    res.update(messages=n, grid=f"{H}x{W}", channels=C, threads=torch.get_num_threads(), clock=args.clock,
               family=args.family, protocol=model.protocol, warp_first=warp_first)
    return res
