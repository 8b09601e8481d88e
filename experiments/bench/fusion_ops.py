"""Cost of the fusion ops (``model.fusion_op``): parameters and forward+backward time.

    python tools/bench.py fusion [--reps 3] [--threads 1] [--device cpu|cuda] [--quick]
                                 [--ops max,att,v2xvit_sim,v2xvit_reference] [--configs A.yaml,B.yaml]

Input: 2 samples x 3 agents of 128 x 80 x 80 (the sim grid; ``--quick``: 128 x 20 x 20), the
collaborators covering part of the grid (valid masks as a receiver builds them). Times are
medians over ``--reps`` runs after one warm-up, in ms, all ops in the same run, with each
op's ratio to max fusion. ``v2xvit_sim`` is configs/sim/fusion_v2xvit.yaml's setting,
``v2xvit_reference`` the op's defaults (the GenComm / HEAL reference GPU configs).
``--configs``: also a whole training step (forward, loss, backward, Adam) of each experiment
config on 2 synthetic samples x 3 agents of its types, e.g. a sim config and its ``_v2xvit``
twin, in the same run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict

import torch
import yaml

from opencood_ext.eval.flops import count_parameters
from opencood_ext.models import build
from opencood_ext.models.detector import FUSION_OPS
from experiments.bench.gencomm_modules import _fwd_bwd, _time_ms, timing_parser
from opencood_ext.config_files import resolve_config

SIM_SETTING = "sim/fusion_v2xvit.yaml"  # a shipped config, found by name (checkout or installed)


def _specs() -> Dict[str, dict]:
    sim = yaml.safe_load(resolve_config(SIM_SETTING).read_text())["model"]
    return {"max": {"type": "max"}, "att": {"type": "att"},
            "v2xvit_sim": {"type": sim["fusion_op"], **sim["fusion_args"]},
            "v2xvit_reference": {"type": "v2xvit"}}


def main(argv=None) -> Dict[str, object]:
    specs = _specs()
    p = timing_parser("bench fusion", __doc__, "20 x 20 maps (smoke run)")
    p.add_argument("--ops", default=",".join(specs), help=f"comma-separated, from {sorted(specs)}")
    p.add_argument("--configs", help="comma-separated experiment configs to time a training step of")
    a = p.parse_args(argv)
    ops = [o for o in a.ops.split(",") if o]
    unknown = sorted(set(ops) - set(specs))
    if unknown:
        p.error(f"--ops: unknown {unknown}; choose from {sorted(specs)}")
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    counts, c, hw = [3, 3], 128, (20 if a.quick else 80)
    torch.manual_seed(0)
    x = torch.randn(sum(counts), c, hw, hw, device=dev, requires_grad=True)
    valid = torch.ones(sum(counts), 1, hw, hw, device=dev)
    valid[1, :, : hw // 3] = 0  # collaborators cover part of the ego's grid
    valid[2, :, :, hw // 2:] = 0
    valid[4, :, hw // 2:] = 0
    res: Dict[str, object] = {"device": str(dev), "threads": torch.get_num_threads(),
                              "input": f"{len(counts)} samples x {counts[0]} agents x {c} x {hw} x {hw}"}
    for name in ops:
        op = build(specs[name], FUSION_OPS, f"fusion op {name}", channels=c).to(dev).train()
        res[f"{name}_params"] = count_parameters(op)
        res[f"{name}_fwd_bwd_ms"] = round(_time_ms(_fwd_bwd(lambda: op(x, counts, valid)), a.reps, dev), 1)
    if "max" in ops:
        for name in ops:
            res[f"{name}_vs_max"] = round(res[f"{name}_fwd_bwd_ms"] / max(res["max_fwd_bwd_ms"], 1e-9), 1)
    for path in (c for c in (a.configs or "").split(",") if c):
        res[f"{Path(path).stem}_train_step_ms"] = round(_train_step_ms(Path(path), a.reps, dev), 1)
    return res


def _train_step_ms(path: Path, reps: int, dev: torch.device) -> float:
    """Median ms of one training step of experiment ``path`` on 2 synthetic samples x 3 agents."""
    from opencood_ext.data.batch import collate_samples
    from opencood_ext.data.dataset import CooperativeDataset
    from opencood_ext.experiment import build_model, cooperation_for, load_experiment
    from opencood_ext.data.synthetic import SyntheticReader

    torch.manual_seed(0)
    cfg = load_experiment(path)
    model = build_model(cfg).to(dev).train()
    types = tuple(cfg.data.agent_types)
    ds = CooperativeDataset(SyntheticReader(2, num_agents=3, types=types * 3), cfg.data, model.voxel_sizes(),
                            train=True, cooperation=cooperation_for(model.fusion, train=True))
    batch = collate_samples([ds[0], ds[1]]).to(dev)
    opt = torch.optim.Adam(model.parameters(), 1e-4)

    def step():
        opt.zero_grad()
        model.loss(model(batch), batch).total.backward()
        opt.step()
    return _time_ms(step, reps, dev)


if __name__ == "__main__":
    print(main())
