"""A tiny trained late-fusion run for the robustness tests, on a tiny OPV2V-format
dataset whose test scenarios have several frames (latency needs earlier ones).

Test split (5 frames): scenario ``tst_a`` at timestamps 000068 / 000070 / 000072
(synthetic worlds 0, 1, 2, three agents each) and ``tst_b`` at 000068 (world 3,
two agents: agent 30 is not there yet) and 000070 (world 1, three agents).
The train split holds worlds 0-3, so the run is evaluated on worlds it fitted:
what matters here is how the channel moves its AP, not how well it generalises.

:func:`trained_late_run` trains once per pytest session (about 20 s on one core):
late fusion, a random vehicle as the ego of each training sample, so the one
detector knows every agent's view and the collaborators' boxes are good ones.
"""
from __future__ import annotations

from pathlib import Path

import torch

from opencood_ext.config import dump_config
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.formats import write_opv2v_frame
from opencood_ext.experiment import build_dataset, build_model, load_experiment
from opencood_ext.training.checkpoint import save_checkpoint
from synthetic import make_frame
from tiny_runs import PP, tiny_config

TEST_FRAMES = [("tst_a", "000068", 0, 3), ("tst_a", "000070", 1, 3), ("tst_a", "000072", 2, 3),
               ("tst_b", "000068", 3, 2), ("tst_b", "000070", 1, 3)]  # (scenario, timestamp, world, agents)
_CACHE: dict = {}


def robust_dataset(root: Path) -> Path:
    for s in range(4):
        write_opv2v_frame(root, "train", make_frame(seed=s, scenario=f"trn_{s}", timestamp="000068"),
                          write_cameras=False)
    for scenario, ts, world, agents in TEST_FRAMES:
        write_opv2v_frame(root, "test", make_frame(seed=world, num_agents=agents, scenario=scenario, timestamp=ts),
                          write_cameras=False)
    return root


def train_in_memory(cfg, steps: int = 240, seed: int = 0):
    """The model of ``cfg`` fitted to 12 samples of its train split (4 worlds x 3 draws of the ego)."""
    torch.manual_seed(seed)
    model = build_model(cfg)
    ds = build_dataset(cfg, "train", train=True)
    samples = [ds[i % len(ds)] for i in range(3 * len(ds))]
    opt = torch.optim.Adam(model.parameters(), lr=0.005)
    model.train()
    for step in range(steps):
        batch = collate_samples([samples[(4 * step + k) % len(samples)] for k in range(4)])
        loss = model.loss(model(batch), batch)
        opt.zero_grad()
        loss.total.backward()
        opt.step()
    model.eval()
    return model


def trained_late_run(tmp_path_factory) -> Path:
    """Run folder (config.yaml + checkpoints/latest.pth) of the trained late-fusion model; the data
    folder is ``<run>/../data``. Trained on the first call of the session, then reused."""
    if "run" not in _CACHE:
        torch.set_num_threads(1)
        tmp = tmp_path_factory.mktemp("robust")
        root = robust_dataset(tmp / "data")
        path = tiny_config(tmp, root, "robust_late", {"m1": PP}, {"fusion": "late"})
        cfg = load_experiment(path, ["data.augment.enabled=false", "eval.plot_every=0"])
        model = train_in_memory(cfg)
        run = tmp / "run"
        (run / "checkpoints").mkdir(parents=True)
        dump_config(cfg, run / "config.yaml")
        save_checkpoint({"model": model.state_dict()}, [run / "checkpoints" / "latest.pth"])
        _CACHE["run"] = run
    return _CACHE["run"]
