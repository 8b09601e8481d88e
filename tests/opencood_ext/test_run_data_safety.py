"""Nothing in a run folder is deleted or rewritten before the check it depends on has passed.

- A resume whose checkpoint does not load into the model (a foreign ``latest.pth``, or an
  optimizer state of other parameters) exits 2 with one line and leaves every file of the
  run folder byte-identical: no log records cut, no ``best.pth`` removed, no temporary file
  cleaned up.
- Training into a folder written by ``tools/import_weights.py`` starts from the imported
  weights (fine-tuning) and keeps the imported file, byte for byte, as
  ``checkpoints/imported.pth``.
- ``tools/import_weights.py`` refuses a reference file that asks to call something, naming
  the callable, without advising unsafe loading.
"""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny_runs import BACKBONE, PP, tiny_config, tiny_dataset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import import_weights  # noqa: E402
import train  # noqa: E402

from opencood_ext.training import trainer as trainer_module  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

FULL = {"fusion": "intermediate", "link": {"type": "full_feature"}}
QUICK = ["--set", "train.max_steps_per_epoch=1"]


def _files(run: Path) -> dict:
    """sha256 of every file under ``run`` (hidden ones, tb/ and the lock file included)."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and " INFO " not in ln and " WARNING " not in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("run_data_safety") / "data")


@pytest.fixture
def two_epoch_run(data, tmp_path):
    """A run of 2 epochs (validated each, so best.pth and 2 epoch records) and a run of another model."""
    cfg = tiny_config(tmp_path, data, "safety", {"m1": PP}, FULL)
    run, other = tmp_path / "run", tmp_path / "other"
    assert train.main(["-y", str(cfg), "--model_dir", str(run), "--set", "train.epochs=2", *QUICK]) == 0
    assert train.main(["-y", str(cfg), "--model_dir", str(other), *QUICK,
                       "--set", "model.agent_types.m1.shrink_channels=16"]) == 0
    return run, other


def _prepare_for_repair(run: Path) -> None:
    """Give the folder everything a (wrong) repair would touch: another holder's text in the lock
    file and a dead writer's temporary file (its pid is not alive)."""
    (run / ".writer.lock").write_text("pid 1 on another-host\n")
    (run / "checkpoints" / f".latest.pth.{_dead_pid()}.0123abcd.tmp").write_bytes(b"half a checkpoint")


def _records(run: Path) -> list:
    return [json.loads(ln) for ln in (run / "train_log.jsonl").read_text().splitlines() if ln.strip()]


def test_a_foreign_latest_pth_changes_nothing(two_epoch_run, capsys):
    run, other = two_epoch_run
    ckpt = run / "checkpoints"
    (ckpt / "latest.pth").write_bytes((other / "checkpoints" / "latest.pth").read_bytes())
    _prepare_for_repair(run)
    # what a repair for the foreign resume point (epoch 1) would do: cut the log, drop best.pth (epoch 2)
    foreign = torch.load(ckpt / "latest.pth", weights_only=True)
    assert foreign["epoch"] == 1 and torch.load(ckpt / "best.pth", weights_only=True)["epoch"] == 2
    assert any(r.get("global_step", 0) > foreign["global_step"] or r.get("epoch", 0) > 1 for r in _records(run))
    before = _files(run)
    assert {"train_log.jsonl", "checkpoints/best.pth", "checkpoints/latest.pth", ".writer.lock"} <= set(before)
    capsys.readouterr()
    assert train.main(["--model_dir", str(run), "--set", "train.epochs=3", *QUICK]) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(ckpt / "latest.pth") in line and "does not fit" in line
    assert _files(run) == before


def test_an_optimizer_state_that_does_not_fit_changes_nothing(two_epoch_run, capsys):
    run, _ = two_epoch_run
    ckpt = run / "checkpoints"
    state = torch.load(ckpt / "latest.pth", weights_only=True)
    assert state["epoch"] == 2
    # the model fits; the optimizer state belongs to other parameters (the first moment of a wrong shape)
    first = next(iter(state["optimizer"]["state"].values()))
    first["exp_avg"] = torch.zeros(first["exp_avg"].numel() + 1)
    state["epoch"], state["global_step"], state["history"] = 1, 1, state["history"][:1]
    torch.save(state, ckpt / "latest.pth")
    _prepare_for_repair(run)
    before = _files(run)
    capsys.readouterr()
    assert train.main(["--model_dir", str(run), "--set", "train.epochs=3", *QUICK]) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(ckpt / "latest.pth") in line and "optimizer" in line and "exp_avg" in line
    assert _files(run) == before


def test_a_fitting_resume_still_repairs_the_folder(two_epoch_run):
    """Control: once the checkpoint fits, the repair runs (the tests above can fail)."""
    run, _ = two_epoch_run
    ckpt = run / "checkpoints"
    (ckpt / "latest.pth").write_bytes((ckpt / "epoch_1.pth").read_bytes())  # as if epoch 2 never committed
    _prepare_for_repair(run)
    assert train.main(["--model_dir", str(run), "--set", "train.epochs=2", *QUICK]) == 0
    assert not list(ckpt.glob(".*.tmp"))
    epochs = [r["epoch"] for r in _records(run) if r["kind"] == "epoch"]
    assert epochs == [1, 2]  # epoch 2's first record was dropped, then epoch 2 was trained again
    assert torch.load(ckpt / "latest.pth", weights_only=True)["epoch"] == 2


# ---------------------------------------------------------------- imported runs
REFERENCE_STACK = {"encoder": PP["encoder"], "backbone": dict(BACKBONE, type="base_bev"),
                   "shrink": {"type": "downsample_conv", "kernel_size": [3], "stride": [1], "padding": [1],
                              "dims": [8]}}


@pytest.fixture
def imported_run(data, tmp_path):
    """tools/import_weights.py's run folder for a reference checkpoint of seeded random weights."""
    from opencood_ext.experiment import build_model, load_experiment
    from opencood_ext.interop.weights import export_reference_state
    cfg = tiny_config(tmp_path, data, "imported", {"m1": REFERENCE_STACK}, FULL)
    torch.manual_seed(1234)
    source = build_model(load_experiment(cfg))
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # not what a fresh run's seeded init gives
    ref, skipped = export_reference_state(source)
    assert not skipped
    torch.save(ref, tmp_path / "net_epoch_bestval_at7.pth")
    out = tmp_path / "imported"
    assert import_weights.main([str(tmp_path / "net_epoch_bestval_at7.pth"), "--config", str(cfg),
                                "-o", str(out)]) == 0
    return out, cfg


def _first_step_weights(monkeypatch) -> list:
    """Records the model's state dict at the start of every epoch's training (before its first step)."""
    seen = []
    original = trainer_module.Trainer._train_epoch

    def spy(self, epoch):
        seen.append({k: v.detach().clone() for k, v in self.model.state_dict().items()})
        return original(self, epoch)

    monkeypatch.setattr(trainer_module.Trainer, "_train_epoch", spy)
    return seen


def test_training_an_imported_run_starts_from_and_keeps_the_imported_weights(imported_run, monkeypatch, capsys):
    out, cfg = imported_run
    ckpt = out / "checkpoints"
    imported_bytes = (ckpt / "best.pth").read_bytes()
    imported = torch.load(ckpt / "best.pth", weights_only=True)["model"]
    seen = _first_step_weights(monkeypatch)
    assert train.main(["--model_dir", str(out), "--set", "train.epochs=1", *QUICK]) == 0
    assert len(seen) == 1 and seen[0].keys() == imported.keys()
    for k, v in imported.items():
        assert torch.equal(seen[0][k], v), k  # fine-tuning: the first step starts from the imported weights
    assert (ckpt / "imported.pth").read_bytes() == imported_bytes  # the imported file, byte for byte
    trained = torch.load(ckpt / "latest.pth", weights_only=True)
    assert trained["epoch"] == 1 and any(not torch.equal(trained["model"][k], v) for k, v in imported.items())
    assert torch.load(ckpt / "best.pth", weights_only=True)["epoch"] == 1  # best of this training now
    # resuming goes on from latest.pth, not back to the imported weights; the imported file stays
    seen.clear()
    assert train.main(["--model_dir", str(out), "--set", "train.epochs=2", *QUICK]) == 0
    assert len(seen) == 1 and all(torch.equal(seen[0][k], v) for k, v in trained["model"].items())
    assert (ckpt / "imported.pth").read_bytes() == imported_bytes
    assert torch.load(ckpt / "latest.pth", weights_only=True)["epoch"] == 2
    # importing again into the trained folder would overwrite its config.yaml and best.pth: refused
    before = _files(out)
    reference = json.loads((out / "import_report.json").read_text())["source"]
    assert import_weights.main([reference, "--config", str(cfg), "-o", str(out)]) == 2
    assert "training has started in this run folder" in _one_line(capsys.readouterr().err)
    assert _files(out) == before


def test_an_imported_run_killed_before_its_first_checkpoint_starts_from_the_imported_weights(imported_run,
                                                                                           monkeypatch):
    out, _ = imported_run
    ckpt = out / "checkpoints"
    imported_bytes = (ckpt / "best.pth").read_bytes()
    imported = torch.load(ckpt / "best.pth", weights_only=True)["model"]

    def killed(self, epoch):
        raise KeyboardInterrupt  # as a kill during the first epoch: no latest.pth yet

    monkeypatch.setattr(trainer_module.Trainer, "_train_epoch", killed)
    with pytest.raises(KeyboardInterrupt):
        train.main(["--model_dir", str(out), *QUICK])
    assert (ckpt / "imported.pth").read_bytes() == imported_bytes and not (ckpt / "latest.pth").exists()
    from opencood_ext.runs import checkpoint_of, load_run
    assert checkpoint_of(out) == ckpt / "imported.pth"  # evaluation still finds the imported weights
    assert all(torch.equal(load_run(out)[1].state_dict()[k], v) for k, v in imported.items())
    monkeypatch.undo()
    seen = _first_step_weights(monkeypatch)
    assert train.main(["--model_dir", str(out), *QUICK]) == 0
    assert all(torch.equal(seen[0][k], v) for k, v in imported.items())
    assert (ckpt / "imported.pth").read_bytes() == imported_bytes


def test_imported_weights_that_do_not_fit_change_nothing(imported_run, capsys):
    out, _ = imported_run
    before = _files(out)
    capsys.readouterr()
    assert train.main(["--model_dir", str(out), "--set", "model.agent_types.m1.shrink.dims=[16]", *QUICK]) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(out / "checkpoints" / "best.pth") in line and "does not fit" in line
    after = _files(out)
    # the one addition: the (empty) lock file, which stays once made (deleting it would let two
    # processes lock two different files); every file that was there is byte-identical
    assert {k: v for k, v in after.items() if k != ".writer.lock"} == before and ".writer.lock" not in before
    assert (out / ".writer.lock").read_bytes() == b""


# ---------------------------------------------------------------- the importer's refusal
def _mark(path):
    Path(path).write_text("the payload ran")


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (_mark, (self.marker,))


def test_import_weights_names_the_refused_callable_without_advising_unsafe_loading(data, tmp_path, capsys):
    cfg = tiny_config(tmp_path, data, "imported", {"m1": REFERENCE_STACK}, FULL)
    marker = tmp_path / "payload_ran"
    evil = tmp_path / "net_epoch3.pth"
    torch.save({"cls_head.weight": torch.zeros(2), "evil": _Payload(marker)}, evil)
    capsys.readouterr()
    assert import_weights.main([str(evil), "--config", str(cfg), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    line = _one_line(err)
    assert str(evil) in line and f"{__name__}._mark" in line
    assert "weights_only=False" not in err and "`False`" not in err and "arbitrary code execution" not in err
    assert not marker.exists() and not (tmp_path / "out").exists()
