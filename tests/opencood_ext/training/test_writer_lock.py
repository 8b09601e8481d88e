"""One writer per run folder: a second trainer (same process or another) stops before it
changes anything; the lock goes when its holder finishes or dies."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from opencood_ext.training import TrainConfig, Trainer
from opencood_ext.training.runfolder import RunFolderBusy, WriterLock
from toy_training import ToyDataset, ToyModel, collate

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = dict(epochs=2, batch_size=4, lr=0.02, seed=7, progress_bar=False)


def _trainer(run_dir, **over):
    torch.manual_seed(0)
    return Trainer(ToyModel(), ToyDataset(8), None, collate, TrainConfig(**{**CFG, **over}), run_dir, device="cpu")


def _snapshot(run):
    return {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}


def test_second_trainer_is_refused_while_the_first_holds_the_folder(tmp_path):
    run = tmp_path / "run"
    _trainer(run).fit()  # a finished run: the lock went with fit()'s end
    first = _trainer(run, epochs=3)
    first.restore()  # holds the folder from here (tools/train.py calls it before writing config.yaml)
    before = _snapshot(run)
    with pytest.raises(RunFolderBusy, match=f"{run}: another process is training into this run folder "
                                            f"\\(pid {os.getpid()} on "):
        _trainer(run, epochs=3).fit()
    assert _snapshot(run) == before  # the refused trainer cut no log record, touched no checkpoint
    assert first.fit().epochs_done == 3  # the holder goes on; then the folder is free again
    assert _trainer(run, epochs=4).fit().epochs_done == 4


def test_lock_is_released_when_training_raises(tmp_path):
    run = tmp_path / "run"
    t = _trainer(run)
    t._check_finite = lambda: (_ for _ in ()).throw(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        t.fit()
    WriterLock(run).release()  # free again


HOLDER = textwrap.dedent("""
    import sys, time
    from opencood_ext.training.runfolder import WriterLock
    lock = WriterLock(sys.argv[1])
    print("locked", flush=True)
    time.sleep(120)
""")


def test_another_process_holds_the_folder_until_it_is_killed(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusy, match=f"pid {holder.pid} on "):
            _trainer(run).fit()
        assert not (run / "train_log.jsonl").exists() and not (run / "checkpoints").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert _trainer(run).fit().epochs_done == 2  # the kernel dropped the dead holder's lock
