"""A kill at any instant leaves a run folder that resumes to the uninterrupted result: no stale
best.pth, no lost or duplicated log records, no temporary files; a corrupt latest.pth falls
back to the newest intact epoch file."""
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opencood_ext.training import TrainConfig, Trainer
from opencood_ext.training import checkpoint as C
from opencood_ext.training import runlog as R
from opencood_ext.training.checkpoint import load_checkpoint
import toy_training
from toy_training import ToyDataset, ToyModel, collate

pytestmark = pytest.mark.usefixtures("one_thread")

# 3 epochs of 4 steps, a mid-epoch latest.pth every 3 steps, a step record every 2 steps
CFG = dict(epochs=3, batch_size=4, lr=0.02, log_every=2, seed=7, checkpoint_every_steps=3, progress_bar=False,
           val_batch_size=2)


class _Kill(BaseException):
    """Stands in for SIGKILL inside the process: nothing catches it."""


def _run(run_dir, **over):
    torch.manual_seed(0)
    model = ToyModel()
    trainer = Trainer(model, ToyDataset(16), ToyDataset(5, offset=500), collate, TrainConfig(**{**CFG, **over}),
                      run_dir, device="cpu")
    return trainer.fit(), model


def _records(run_dir, kind):
    return [r for r in R.read_log(run_dir) if r["kind"] == kind]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run = tmp_path_factory.mktemp("ref")
    result, model = _run(run)
    return run, result, model.state_dict()


class _Killer:
    """Counts the run folder's writes (atomic checkpoint writes, log records) and kills at write n:
    a checkpoint write leaves its half-written temporary file, a log record a torn half line."""

    def __init__(self, monkeypatch, kill_at=None):
        self.n, self.kill_at, self.events = 0, kill_at, []
        real_write, real_record = C.atomic_write_bytes, R.RunLog.record
        killer = self

        def write(path, data):
            if killer._tick(f"write {Path(path).name}"):
                tmp = Path(path).parent / f".{Path(path).name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
                tmp.write_bytes(data[:len(data) // 2])
                raise _Kill(killer.events[-1])
            real_write(path, data)

        def record(self, kind, data, *args, **kw):
            if killer._tick(f"log {kind}"):
                self.jsonl.write(json.dumps({"kind": kind, **data})[:20])
                self.jsonl.flush()
                raise _Kill(killer.events[-1])
            return real_record(self, kind, data, *args, **kw)

        monkeypatch.setattr(C, "atomic_write_bytes", write)
        monkeypatch.setattr(R.RunLog, "record", record)

    def _tick(self, what):
        self.n += 1
        self.events.append(what)
        return self.n == self.kill_at


def _check_consistent_after_kill(run):
    """What a reader sees right after the kill: latest.pth (when present) loads, and best.pth
    is never older than the best epoch latest.pth records."""
    ck = run / "checkpoints"
    if not (ck / "latest.pth").exists():
        return
    latest = load_checkpoint(ck / "latest.pth")
    if latest["best_val"] is not None:
        best_epoch = [h["epoch"] for h in latest["history"] if h.get("val_loss") == latest["best_val"]][-1]
        assert load_checkpoint(ck / "best.pth")["epoch"] >= best_epoch


def _check_finished_like_reference(run, reference):
    ref_run, ref_result, ref_weights = reference
    ck = run / "checkpoints"
    latest = load_checkpoint(ck / "latest.pth")
    assert latest["epoch"] == 3 and latest["global_step"] == ref_result.global_step
    assert all(torch.equal(latest["model"][k], v) for k, v in ref_weights.items())
    assert not [p.name for p in ck.iterdir() if p.name.endswith(".tmp")]
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]
    # the log: every epoch once, every step record once, as in the uninterrupted run
    assert [r["epoch"] for r in _records(run, "epoch")] == [1, 2, 3]
    assert [r["train_loss"] for r in _records(run, "epoch")] == [h["train_loss"] for h in ref_result.history]
    assert [r["global_step"] for r in _records(run, "step")] == [r["global_step"] for r in _records(ref_run, "step")]
    # best.pth is the epoch latest.pth records as best, with that epoch's weights
    vals = [h["val_loss"] for h in latest["history"]]
    best = load_checkpoint(ck / "best.pth")
    assert best["epoch"] == vals.index(min(vals)) + 1 == ref_result.history.index(
        min(ref_result.history, key=lambda h: h["val_loss"])) + 1
    epoch_file = load_checkpoint(ck / f"epoch_{best['epoch']}.pth")
    assert all(torch.equal(best["model"][k], v) for k, v in epoch_file["model"].items())


def test_kill_at_every_write_then_resume_gives_the_uninterrupted_run(tmp_path, monkeypatch, reference):
    with monkeypatch.context() as m:
        counter = _Killer(m)
        _run(tmp_path / "count")
    events = counter.events
    assert {"write best.pth", "write latest.pth", "write epoch_3.pth", "log epoch", "log step"} <= set(events)
    for n in range(1, len(events) + 1):
        run = tmp_path / f"kill_{n:02d}"
        with monkeypatch.context() as m:
            _Killer(m, kill_at=n)
            with pytest.raises(_Kill):
                _run(run)
        _check_consistent_after_kill(run)
        _run(run)  # resume
        try:
            _check_finished_like_reference(run, reference)
        except AssertionError as exc:
            raise AssertionError(f"killed at write {n} ({events[n - 1]}): {exc}") from exc


def test_corrupt_latest_falls_back_to_the_newest_intact_epoch_file(tmp_path, caplog, reference):
    run = tmp_path / "run"
    _run(run, epochs=2)
    (run / "checkpoints" / "latest.pth").write_bytes(b"PK\x03\x04 torn by a failing disk")
    with caplog.at_level(logging.WARNING):
        _run(run)
    assert "resuming from" in caplog.text and "epoch_2.pth" in caplog.text and "latest.pth" in caplog.text
    _check_finished_like_reference(run, reference)


def _toy(run, out, *extra):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([sys.executable, str(Path(toy_training.__file__)), "--run-dir", str(run), "--out", str(out),
                           "--epochs", "3", "--n-train", "8", "--batch-size", "2", *extra],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("victim", ["best.pth", "latest.pth"])
def test_sigkill_while_writing_a_checkpoint(tmp_path, victim):
    """A real kill -9 in the middle of the last epoch's best.pth / latest.pth write."""
    ref = tmp_path / "ref"
    toy_training.main(["--run-dir", str(ref), "--out", str(tmp_path / "ref"), "--epochs", "3", "--n-train", "8",
                       "--batch-size", "2"])
    ref_latest = load_checkpoint(ref / "checkpoints" / "latest.pth")
    vals = [h["val_loss"] for h in ref_latest["history"]]
    # kill in the last write of the victim: best.pth is written once per improvement, latest.pth per epoch
    writes = sum(v < min(vals[:i], default=float("inf")) for i, v in enumerate(vals)) if victim == "best.pth" else 3
    run = tmp_path / "run"
    proc = _toy(run, tmp_path / "dead", "--kill-writing", f"{victim}:{writes}")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    left = [p.name for p in (run / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    assert left and left[0].startswith(f".{victim}.")
    _check_consistent_after_kill(run)
    toy_training.main(["--run-dir", str(run), "--out", str(tmp_path / "resumed"), "--epochs", "3", "--n-train", "8",
                       "--batch-size", "2"])
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    latest = load_checkpoint(run / "checkpoints" / "latest.pth")
    assert all(torch.equal(latest["model"][k], v) for k, v in ref_latest["model"].items())
    assert [r["epoch"] for r in _records(run, "epoch")] == [1, 2, 3]
    assert [r["global_step"] for r in _records(run, "step")] == [r["global_step"] for r in _records(ref, "step")]
    assert load_checkpoint(run / "checkpoints" / "best.pth")["epoch"] == \
        load_checkpoint(ref / "checkpoints" / "best.pth")["epoch"]
