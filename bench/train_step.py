"""Training step and inference time per frame for each encoder type on the sim config.

    python tools/bench.py train [--agents 3] [--repeat 3] [--threads 2] [--device cpu|cuda]

Each type runs alone (no fusion, ``configs/sim/types/<t>.yaml`` on the sim base)
on synthetic frames with ``--agents`` agents of that type per sample (batch 1);
the intermediate GenComm stage-1 model of each type is timed too. Medians; on
CUDA each timed call ends with a synchronize. m3 (SECOND) on CUDA needs a CUDA
build of spconv (spconv-cu12x).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _config(t: str, gencomm: bool) -> Path:
    bases = ["base.yaml", f"types/{t}.yaml"] + (["gencomm_link.yaml"] if gencomm else [])
    doc = {"name": f"bench_{t}", "base": [str(ROOT / "configs/sim" / b) for b in bases],
           "data": {"modality": f"all:{t}"}}
    if not gencomm:
        doc["model"] = {"fusion": "none"}
    f = Path(tempfile.mkdtemp()) / "bench.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def _time(fn, repeat, device):
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--types", default="m1,m2,m3,m4")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    from opencood_ext.data.batch import collate_samples
    from opencood_ext.data.dataset import CooperativeDataset
    from opencood_ext.experiment import build_model, cooperation_for, load_experiment
    from synthetic import SyntheticReader

    res = {}
    for t in args.types.split(","):
        for gencomm in (False, True):
            cfg = load_experiment(_config(t, gencomm))
            model = build_model(cfg).to(device)
            reader = SyntheticReader(1, num_agents=args.agents, types=(t,) * args.agents)
            coop = cooperation_for(model.fusion, True)
            ds = CooperativeDataset(reader, cfg.data, model.voxel_sizes(), train=True, cooperation=coop)
            batch = collate_samples([ds[0]]).to(device)
            opt = torch.optim.Adam(model.parameters(), 1e-4)

            def step():
                opt.zero_grad()
                out = model(batch)
                model.loss(out, batch).total.backward()
                opt.step()
            tag = f"{t}_{'gencomm' if gencomm else 'none'}"
            model.train()
            step()  # warm-up
            res[f"{tag}_train_step_s"] = _time(step, args.repeat, device)
            model.eval()
            ds.train = False
            ds.cooperation = cooperation_for(model.fusion, False)
            eval_batch = collate_samples([ds[0]]).to(device)
            model.predict(eval_batch)  # warm-up
            res[f"{tag}_inference_frame_s"] = _time(lambda: model.predict(eval_batch), args.repeat, device)
    res["agents_per_sample"] = args.agents
    res["threads"] = args.threads
    res["device"] = str(device)
    return res


if __name__ == "__main__":
    print(main(sys.argv[1:]))
