"""DDP through torchrun (2 CPU processes, gloo): identical weights, sharded data, rank-0-only files."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opencood_ext.training.checkpoint import load_checkpoint
from opencood_ext.training.distributed import init_distributed, is_main_process
import toy_training

TOY_SCRIPT = Path(toy_training.__file__)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_single_process_without_torchrun_env(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    info = init_distributed("cpu")
    assert (info.rank, info.world_size, info.backend, info.is_main) == (0, 1, None, True)
    assert is_main_process()
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        init_distributed("cpu")


def test_more_ranks_than_gpus_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="LOCAL_RANK=1 but this machine has 1 CUDA device"):
        init_distributed()


def test_torchrun_two_ranks_gloo(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    epochs, n_train = 2, 12
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(TOY_SCRIPT),
           "--run-dir", str(run), "--out", str(out), "--epochs", str(epochs), "--n-train", str(n_train),
           "--n-val", "5", "--batch-size", "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    r0, r1 = (json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["rank"], r1["rank"], r0["world_size"], r0["backend"]) == (0, 1, 2, "gloo")

    # identical weights and BatchNorm buffers on both ranks, and in the checkpoint
    w0, w1 = (torch.load(f"{out}.rank{r}.pt", weights_only=True) for r in (0, 1))
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    latest = load_checkpoint(run / "checkpoints" / "latest.pth")
    assert all(torch.equal(latest["model"][k], w0[k]) for k in w0)
    assert latest["world_size"] == 2 and len(latest["rng"]) == 2

    # each epoch: the two ranks see disjoint halves of the train set (12 samples / 2 ranks / batch 2 = 3 steps)
    per = n_train // 2
    for e in range(epochs):
        a, b = set(r0["seen"][e * per:(e + 1) * per]), set(r1["seen"][e * per:(e + 1) * per])
        assert not a & b and a | b == set(range(n_train))
    assert r0["global_step"] == r1["global_step"] == epochs * 3

    # only rank 0 wrote files
    assert r1["saves"] == [] and len(r0["saves"]) == epochs
    assert sorted(os.listdir(run / "checkpoints")) == ["best.pth", "epoch_1.pth", "epoch_2.pth", "latest.pth"]
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 1
    steps = [json.loads(x)["global_step"] for x in (run / "train_log.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "step"]
    assert steps == [2, 4, 6]

    # validation: all-reduced, the same on both ranks, the exact mean over the whole val set
    assert [h["val_loss"] for h in r0["history"]] == [h["val_loss"] for h in r1["history"]]
    model = toy_training.ToyModel()
    model.load_state_dict(w0)
    model.eval()
    val = toy_training.ToyDataset(5, offset=500)
    with torch.no_grad():
        errs = [float(model(toy_training.collate([val[i]])).squeeze() - val[i][2]) ** 2 for i in range(5)]
    assert r0["history"][-1]["val_loss"] == pytest.approx(sum(errs) / 5, rel=1e-5)


def test_the_configured_timeout_reaches_the_process_group(monkeypatch, tmp_path):
    """TrainConfig.dist_timeout_s is what init_process_group gets (a stalled rank fails the
    others after it); the default is 10 minutes, not the 30 it used to be."""
    import datetime

    import torch.distributed as dist

    from opencood_ext.training import TrainConfig, Trainer
    from toy_training import ToyDataset, ToyModel, collate

    class _Joined(Exception):
        pass

    got = {}

    def fake_init(**kw):
        got.update(kw)
        raise _Joined

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", fake_init)
    for cfg, seconds in ((TrainConfig(dist_timeout_s=42.5), 42.5), (TrainConfig(), 600.0)):
        with pytest.raises(_Joined):
            Trainer(ToyModel(), ToyDataset(4), None, collate, cfg, tmp_path, device="cpu")
        assert got["timeout"] == datetime.timedelta(seconds=seconds) and got["backend"] == "gloo"
    with pytest.raises(ValueError, match="dist_timeout_s must be > 0"):
        TrainConfig(dist_timeout_s=0)
