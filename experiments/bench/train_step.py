"""Training step and inference frame: no fusion vs full-feature intermediate vs GenComm, per encoder type.

    python tools/bench.py train [--types m1] [--agents 3] [--repeat 3] [--threads 2] [--device cpu|cuda]
                                [--clock wall|cpu] [--family sim|opv2v_h] [--link JSON] [--also NAME=JSON]
                                [--autocast]

For each type ``t`` three models are built on the sim config (``configs/sim/base.yaml`` +
``configs/<family>/types/<t>.yaml``; ``--family opv2v_h`` puts the OPV2V-H encoders and GenComm
link on the sim's 80 m range), with the same agents and encoders:

* ``<t>_none``: no fusion (``m1_none.yaml``): the ego alone;
* ``<t>_intermediate``: the full 128-channel feature on the wire (float32, as
  ``m1m3_intermediate.yaml``);
* ``<t>_gencomm``: GenComm stage 1 (``configs/<family>/gencomm_link.yaml``; ``--link`` is merged into its
  link section, e.g. ``'{"generator": {"variant": "compact", "base_channels": 16}}'``).

``--also NAME=JSON`` adds a GenComm model ``<t>_gencomm_NAME`` with another link override,
timed in the same rotation, so two generator choices compare within one run.

All models see the same synthetic frame with ``--agents`` agents of type ``t`` (batch 1; the
no-fusion sample carries the ego only). ``train_step_s``: forward, loss, backward and Adam
step; ``inference_frame_s``: ``model.predict`` (evaluation mode, messages through the wire
format). The models are timed in turn within each repetition, so a busy machine slows all
models alike; figures are medians, and ``<t>_gencomm_over_intermediate_*`` are ratios of
those medians. ``<t>_<model>_forward_gflops``: the arithmetic of one forward pass on the training
batch (:mod:`opencood_ext.eval.flops`, deformable sampling included), with GenComm's split into
encoders, message extractors, generators and enhancers (``<t>_gencomm_forward_gflops_*``): the
floor no implementation of the same layers goes under. ``<t>_gencomm_{train,inference}_share_*``:
the part of GenComm's forward pass (``model.forward`` in the training step; all of ``predict``)
spent in the encoders, the message extractors (``deform_sampling``: their deformable convolutions
alone), the generators (the diffusion UNet and its step loop), the enhancers, GenComm's warps
(``gencomm.link.warp_to_ego``) and the fusion op (forward hooks and a wrapped warp, timed over the
same repetitions).

The issue's figures, side by side (``<t>_gencomm_over_intermediate_`` ...):
``train_time`` / ``train_flops`` and ``inference_time`` / ``inference_flops``, with
``{train,inference}_time_over_flops`` (the target: at most 1.1) and the spread of the time ratio
over the repetitions (``train_time_min`` / ``_max``: each repetition's GenComm time over the
intermediate time of the same rotation). Training FLOPs are the forward pass's on the training
batch (a layer's backward is twice its forward for both models, so the ratio is the forward's);
inference FLOPs are ``predict``'s on the evaluation batch (``<t>_<model>_inference_gflops``).
On CUDA every timed call and hook ends with a synchronize; m3 (SECOND) on
CUDA needs a CUDA build of spconv (spconv-cu12x).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import yaml

import gencomm  # noqa: E402,F401  (registers the GenComm link)
import gencomm.link as gencomm_link  # noqa: E402
from opencood_ext.data.batch import collate_samples  # noqa: E402
from opencood_ext.data.dataset import CooperativeDataset  # noqa: E402
from opencood_ext.eval.flops import flops_during  # noqa: E402
from opencood_ext.experiment import build_model, cooperation_for, load_experiment  # noqa: E402
from opencood_ext.data.synthetic import SyntheticReader  # noqa: E402
from opencood_ext.config_files import configs_root  # noqa: E402

def _config(t: str, kind: str, family: str, link: Optional[dict]) -> Path:
    """The bench experiment: sim base (range, anchors) + ``configs/<family>/types/<t>.yaml``
    (+ ``configs/<family>/gencomm_link.yaml``) + the fusion of ``kind``."""
    root = configs_root()
    bases = [root / "sim" / "base.yaml", root / family / "types" / f"{t}.yaml"]
    if kind == "gencomm":
        bases.append(root / family / "gencomm_link.yaml")
    missing = [str(b) for b in bases if not b.is_file()]
    if missing:
        raise SystemExit(f"bench train: no config file {missing[0]}")
    doc = {"name": f"bench_{t}_{kind}", "base": [str(b) for b in bases], "data": {"modality": f"all:{t}"}}
    if kind == "none":
        doc["model"] = {"fusion": "none"}
    elif kind == "intermediate":
        doc["model"] = {"fusion": "intermediate", "link": {"type": "full_feature", "wire_dtype": "float32"}}
    elif link:
        doc["model"] = {"link": link}
    f = Path(tempfile.mkdtemp()) / "bench.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def _model_and_batches(cfg, reader, device: torch.device):
    """The model of ``cfg`` (seed 0) and its training / evaluation batch of frame 0 (same draw for all)."""
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    batches = {}
    for train in (True, False):
        ds = CooperativeDataset(reader, cfg.data, model.voxel_sizes(), train=train,
                                cooperation=cooperation_for(model.fusion, train))
        torch.manual_seed(0)  # the same augmentation draw for every model
        batches[train] = collate_samples([ds[0]]).to(device)
    return model, batches


def _named_link(text: str):
    name, sep, spec = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"--also takes NAME=JSON, got {text!r}")
    link = json.loads(spec)
    if not isinstance(link, dict):
        raise argparse.ArgumentTypeError(f"--also {name}: the link override must be a JSON object")
    return name, link


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _ModuleTimer:
    """Forward time of named groups of modules (pre/post forward hooks), summed while ``enabled``."""

    def __init__(self, groups: Dict[str, List[torch.nn.Module]], device: torch.device, clock: Callable[[], float]):
        self.total: Dict[str, float] = defaultdict(float)
        self.device = device
        self.clock = clock
        self.enabled = False
        for name, mods in groups.items():
            for m in mods:
                m.register_forward_pre_hook(self._pre)
                m.register_forward_hook(self._post(name))

    def _pre(self, mod, args):
        if self.enabled:
            _sync(self.device)
            mod._bench_t0 = self.clock()

    def wrap(self, name: str, fn: Callable) -> Callable:
        """``fn`` with its time added to ``total[name]`` while enabled (a function, not a module)."""
        def timed(*args, **kwargs):
            if not self.enabled:
                return fn(*args, **kwargs)
            _sync(self.device)
            t0 = self.clock()
            out = fn(*args, **kwargs)
            _sync(self.device)
            self.total[name] += self.clock() - t0
            return out
        return timed

    def _post(self, name):
        def hook(mod, args, out):
            if self.enabled:
                _sync(self.device)
                self.total[name] += self.clock() - mod._bench_t0
        return hook


def _gencomm_groups(model) -> Dict[str, List[torch.nn.Module]]:
    link = model.link
    return {"forward": [model], "encoders": list(model.encoders.values()),
            "message_extractor": list(link.dme.values()), "deform_sampling": [d.deform for d in link.dme.values()],
            "generator": list(link.safg.values()), "enhancer": list(link.enhancer.values()), "fusion": [model.fuse]}


SHARES = ("encoders", "message_extractor", "deform_sampling", "generator", "enhancer", "warp", "fusion")


def main(argv=None) -> dict:
    """Run the benchmark; -> the rows (module docstring). GenComm's warp is timed through a wrapper
    of ``gencomm.link.warp_to_ego`` that is removed again on return."""
    real_warp = gencomm_link.warp_to_ego
    try:
        return _run(argv)
    finally:
        gencomm_link.warp_to_ego = real_warp


def _run(argv) -> dict:
    p = argparse.ArgumentParser(prog="bench train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--types", default="m1", help="comma-separated agent types (m1,m2,m3,m4)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: elapsed time; cpu: this process's CPU time (steadier on a shared machine; "
                        "with --threads 1 it is the single core's work; CPU devices only)")
    p.add_argument("--family", default="sim",
                   help="configs/<family>/types/<t>.yaml and configs/<family>/gencomm_link.yaml on the sim "
                        "base (sim: the CPU encoders; opv2v_h: the field's, on the sim's 80 m range)")
    p.add_argument("--link", type=json.loads, default=None,
                   help="JSON object merged into the GenComm link of configs/sim/gencomm_link.yaml, e.g. "
                        "'{\"generator\": {\"variant\": \"compact\", \"base_channels\": 16}}'")
    p.add_argument("--also", type=_named_link, action="append", default=[], metavar="NAME=JSON",
                   help="one more GenComm model, <t>_gencomm_NAME, with this link override, timed in the same "
                        "rotation (e.g. reference='{\"generator\": {\"variant\": \"reference\", "
                        "\"base_channels\": 8}}'); repeatable")
    p.add_argument("--autocast", action="store_true",
                   help="also time every model under torch.autocast(bfloat16) in the same rotation "
                        "(<t>_<model>_bf16_*; <t>_<model>_fp32_over_bf16_*: the speed-up). Mixed precision "
                        "changes numerics; it pays only where the CPU has bf16 instructions (avx512_bf16, amx)")
    args = p.parse_args(argv)
    if args.link is not None and not isinstance(args.link, dict):
        raise SystemExit(f"--link must be a JSON object, got {args.link!r}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.clock == "cpu" and device.type != "cpu":
        raise SystemExit("--clock cpu measures CPU devices only")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    res: Dict[str, object] = {}
    summary: Dict[str, float] = {}
    variants = [("none", "none", None), ("intermediate", "intermediate", None), ("gencomm", "gencomm", args.link)]
    variants += [(f"gencomm_{name}", "gencomm", link) for name, link in args.also]
    for t in args.types.split(","):
        reader = SyntheticReader(1, num_agents=args.agents, types=(t,) * args.agents)
        train_fns: Dict[str, Callable[[], None]] = {}
        infer_fns: Dict[str, Callable[[], None]] = {}
        timer = None
        for tag, kind, link in variants:
            model, batches = _model_and_batches(load_experiment(_config(t, kind, args.family, link)), reader,
                                                device)
            opt = torch.optim.Adam(model.parameters(), 1e-4)

            for amp in ([False, True] if args.autocast else [False]):
                def step(model=model, opt=opt, batch=batches[True], amp=amp):
                    model.train()
                    opt.zero_grad()
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                        loss = model.loss(model(batch), batch).total
                    loss.backward()
                    opt.step()

                def infer(model=model, batch=batches[False], amp=amp):
                    model.eval()
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                        model.predict(batch)
                key = f"{tag}_bf16" if amp else tag
                train_fns[key], infer_fns[key] = step, infer
            if kind == "gencomm":
                res[f"{t}_{tag}_generator_params"] = sum(p.numel() for p in model.link.safg[t].parameters())
            # arithmetic, not time: GFLOPs of one training-batch forward pass (eval mode), whole and by part
            forward = lambda model=model, batch=batches[True]: model(batch)  # noqa: E731
            res[f"{t}_{tag}_forward_gflops"] = flops_during([model], forward) / 1e9
            model.eval()
            predict = lambda model=model, batch=batches[False]: model.predict(batch)  # noqa: E731
            res[f"{t}_{tag}_inference_gflops"] = flops_during([model], predict) / 1e9
            if tag == "gencomm":
                groups = _gencomm_groups(model)
                for name, mods in groups.items():
                    if name != "forward":
                        res[f"{t}_gencomm_forward_gflops_{name}"] = flops_during(mods, forward) / 1e9
                timer = _ModuleTimer(groups, device, clock)
                gencomm_link.warp_to_ego = timer.wrap("warp", gencomm_link.warp_to_ego)
        for tag, kind, _ in variants:
            if kind == "gencomm":
                res[f"{t}_{tag}_over_intermediate_forward_gflops"] = \
                    res[f"{t}_{tag}_forward_gflops"] / res[f"{t}_intermediate_forward_gflops"]
        for phase, fns in (("train_step", train_fns), ("inference_frame", infer_fns)):
            for fn in fns.values():
                fn()  # warm-up
                _sync(device)
            times: Dict[str, List[float]] = {k: [] for k in fns}
            timer.total.clear()
            for _ in range(args.repeat):
                for tag, fn in fns.items():
                    timer.enabled = tag == "gencomm"
                    t0 = clock()
                    fn()
                    _sync(device)
                    times[tag].append(clock() - t0)
                    timer.enabled = False
            for tag in fns:
                res[f"{t}_{tag}_{phase}_s"] = statistics.median(times[tag])
            if args.autocast:
                for tag, kind, _ in variants:
                    res[f"{t}_{tag}_fp32_over_bf16_{phase}"] = \
                        res[f"{t}_{tag}_{phase}_s"] / res[f"{t}_{tag}_bf16_{phase}_s"]
                    if kind == "gencomm":
                        res[f"{t}_{tag}_bf16_over_intermediate_bf16_{phase}"] = \
                            res[f"{t}_{tag}_bf16_{phase}_s"] / res[f"{t}_intermediate_bf16_{phase}_s"]
            for tag, kind, _ in variants:
                if kind == "gencomm":
                    for other in ("intermediate", "none"):
                        res[f"{t}_{tag}_over_{other}_{phase}"] = \
                            res[f"{t}_{tag}_{phase}_s"] / res[f"{t}_{other}_{phase}_s"]
            # the whole of predict() is the inference pass; in training, model.forward (no loss, backward)
            short, whole = ("train", timer.total["forward"]) if phase == "train_step" \
                else ("inference", sum(times["gencomm"]))
            for name in SHARES:
                res[f"{t}_gencomm_{short}_share_{name}"] = timer.total[name] / whole
            per_rep = [g / i for g, i in zip(times["gencomm"], times["intermediate"])]
            flops = "forward" if short == "train" else "inference"
            side = {"time": res[f"{t}_gencomm_over_intermediate_{phase}"],
                    "flops": res[f"{t}_gencomm_{flops}_gflops"] / res[f"{t}_intermediate_{flops}_gflops"]}
            side.update(time_over_flops=side["time"] / side["flops"], time_min=min(per_rep), time_max=max(per_rep))
            summary.update({f"{t}_gencomm_over_intermediate_{short}_{k}": v for k, v in side.items()})
    res.update(summary)  # last, so the printed table ends with the side-by-side figures
    res["agents_per_sample"] = args.agents
    res["threads"] = torch.get_num_threads()
    res["clock"] = args.clock
    res["family"] = args.family
    res["device"] = str(device)
    return res


if __name__ == "__main__":
    print(main(sys.argv[1:]))
