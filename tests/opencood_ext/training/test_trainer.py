"""Trainer: run folder, validation maths, resume (epoch boundary, crash, SIGKILL), schedule, clipping."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opencood_ext.training import LossOutput, TrainConfig, Trainer
from opencood_ext.training.checkpoint import load_checkpoint
from opencood_ext.config import ConfigError, load_config
import toy_training
from toy_training import ToyDataset, ToyModel, collate

TOY_SCRIPT = Path(toy_training.__file__)


pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(**kw):
    base = dict(epochs=3, batch_size=4, lr=0.02, log_every=2, seed=7, progress_bar=False)
    base.update(kw)
    return TrainConfig(**base)


def _run(run_dir, cfg, model=None, n_train=16, n_val=5, policy=None):
    torch.manual_seed(0)
    model = model if model is not None else ToyModel()
    trainer = Trainer(model, ToyDataset(n_train), ToyDataset(n_val, offset=500) if n_val else None,
                      collate, cfg, run_dir, param_filter=policy)
    return trainer.fit(), model


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)   # the trainer may use CUDA


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 3-epoch run (4 steps an epoch, dropout on)."""
    result, model = _run(tmp_path_factory.mktemp("ref"), _cfg(val_batch_size=2))
    return result, model.state_dict()


def test_fit_writes_run_folder_and_learns(tmp_path, reference):
    cfg = _cfg(val_batch_size=2)
    result, model = _run(tmp_path, cfg)
    assert result.epochs_done == 3 and result.global_step == 12 and [h["epoch"] for h in result.history] == [1, 2, 3]
    assert result.trainable_params == sum(p.numel() for p in model.parameters())
    assert result.history[-1]["val_loss"] < result.history[0]["val_loss"]
    assert {"train_loss", "train_mse", "train_abs", "val_loss", "val_mse", "lr", "steps"} <= set(result.history[0])
    ck = tmp_path / "checkpoints"
    assert sorted(os.listdir(ck)) == ["best.pth", "epoch_1.pth", "epoch_2.pth", "epoch_3.pth", "latest.pth"]
    latest = load_checkpoint(ck / "latest.pth")
    assert latest["epoch"] == 3 and latest["step_in_epoch"] == 0 and latest["global_step"] == 12
    assert latest["config"] == dataclasses.asdict(cfg) and len(latest["rng"]) == 1
    assert _same_weights(latest["model"], model.state_dict())
    best = load_checkpoint(ck / "best.pth")
    vals = [h["val_loss"] for h in result.history]
    assert best["best_val"] == min(vals) == result.best_val and best["epoch"] == vals.index(min(vals)) + 1
    lines = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [x["global_step"] for x in lines if x["kind"] == "step"] == [2, 4, 6, 8, 10, 12]
    assert [x["epoch"] for x in lines if x["kind"] == "epoch"] == [1, 2, 3]
    assert [x["global_step"] for x in lines if x["kind"] == "epoch"] == [4, 8, 12]
    from opencood_ext.training.runlog import optimizer_steps
    assert optimizer_steps(tmp_path) == 12  # the budget a results row states
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/mse", "epoch/val_loss", "epoch/train_loss"} <= tags
    assert [e.step for e in acc.Scalars("train/loss")] == [2, 4, 6, 8, 10, 12]
    # same seed, same everything: bit-identical to the module's reference run
    assert _same_weights(model.state_dict(), reference[1])


def test_validation_is_the_sample_weighted_mean_over_the_val_set(reference):
    result, weights = reference
    model = ToyModel()
    model.load_state_dict(weights)
    model.eval()
    val = ToyDataset(5, offset=500)
    with torch.no_grad():  # 5 samples in batches of 2, 2, 1: a per-batch mean would differ
        errs = [float(model(collate([val[i]])).squeeze() - val[i][2]) ** 2 for i in range(5)]
    assert result.history[-1]["val_loss"] == pytest.approx(sum(errs) / 5, rel=1e-6)


def test_resume_at_epoch_boundary_matches_uninterrupted(tmp_path, reference):
    first, _ = _run(tmp_path, _cfg(val_batch_size=2, epochs=2))
    assert first.epochs_done == 2
    torch.manual_seed(123)  # a fresh, differently initialised model: weights must come from latest.pth
    result, model = _run(tmp_path, _cfg(val_batch_size=2), model=ToyModel())
    assert [h["epoch"] for h in result.history] == [1, 2, 3] and result.global_step == 12
    assert _same_weights(model.state_dict(), reference[1])
    kinds = [json.loads(x)["kind"] for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert kinds.count("resume") == 1 and kinds.count("epoch") == 3
    again, _ = _run(tmp_path, _cfg(val_batch_size=2))  # nothing left to do
    assert again.epochs_done == 3 and again.global_step == 12 and len(again.history) == 3


class _Crash(ToyModel):
    def __init__(self, crash_at: int):
        super().__init__()
        self.crash_at = crash_at

    def forward(self, batch):
        if self.training and self.train_calls + 1 == self.crash_at:
            raise KeyboardInterrupt("simulated crash")
        return super().forward(batch)


@pytest.mark.parametrize("ckpt_every,expect_epoch,expect_step", [(None, 1, 0), (3, 1, 2)])
def test_crash_mid_epoch_resumes_without_losing_the_epoch(tmp_path, reference, ckpt_every, expect_epoch,
                                                          expect_step):
    cfg = _cfg(val_batch_size=2, checkpoint_every_steps=ckpt_every)
    torch.manual_seed(0)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, cfg, model=_Crash(crash_at=8))  # dies in step 4 of epoch 2
    latest = load_checkpoint(tmp_path / "checkpoints" / "latest.pth")
    assert (latest["epoch"], latest["step_in_epoch"]) == (expect_epoch, expect_step)
    result, model = _run(tmp_path, cfg)
    assert [h["epoch"] for h in result.history] == [1, 2, 3] and result.global_step == 12
    assert _same_weights(model.state_dict(), reference[1])


def test_sigkill_mid_epoch_then_resume_continues_same_order(tmp_path):
    args = ["--epochs", "3", "--n-train", "12", "--batch-size", "2", "--ckpt-every", "2"]
    toy_training.main(["--run-dir", str(tmp_path / "ref"), "--out", str(tmp_path / "ref"), *args])
    ref = json.loads((tmp_path / "ref.rank0.json").read_text())

    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([sys.executable, str(TOY_SCRIPT), "--run-dir", str(run), "--out", str(tmp_path / "dead"),
                           "--kill-after-steps", "9", *args], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    latest = load_checkpoint(run / "checkpoints" / "latest.pth")
    assert (latest["epoch"], latest["step_in_epoch"], latest["global_step"]) == (1, 2, 8)
    assert sorted(os.listdir(run / "checkpoints")) == ["best.pth", "epoch_1.pth", "latest.pth"]

    toy_training.main(["--run-dir", str(run), "--out", str(tmp_path / "resumed"), *args])
    out = json.loads((tmp_path / "resumed.rank0.json").read_text())
    assert out["epochs_done"] == 3 and out["global_step"] == 18
    assert [h["epoch"] for h in out["history"]] == [1, 2, 3]
    # epoch 2 resumes at its 3rd batch: the samples after the first 4 of the reference epoch 2, then epoch 3
    assert out["seen"] == ref["seen"][12 + 4:]
    assert _same_weights(torch.load(tmp_path / "resumed.rank0.pt", weights_only=True),
                         torch.load(tmp_path / "ref.rank0.pt", weights_only=True))
    log = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    resume = [x for x in log if x["kind"] == "resume"]
    assert resume == [{"kind": "resume", "epoch": 1, "step_in_epoch": 2, "global_step": 8}]


def test_multistep_schedule_epoch_pruning_and_step_cap(tmp_path):
    cfg = _cfg(epochs=3, lr=0.1, lr_scheduler="multistep", milestones=[1, 2], gamma=0.5,
               keep_epoch_checkpoints=1, max_steps_per_epoch=2, val_every=2)
    result, _ = _run(tmp_path, cfg)
    assert [h["lr"] for h in result.history] == pytest.approx([0.1, 0.05, 0.025])
    assert [h["steps"] for h in result.history] == [2, 2, 2] and result.global_step == 6
    assert ["val_loss" in h for h in result.history] == [False, True, True]  # every 2nd and the last
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["best.pth", "epoch_3.pth", "latest.pth"]


def test_grad_clip_bounds_the_update(tmp_path):
    torch.manual_seed(0)
    model = ToyModel(dropout=0.0)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    cfg = _cfg(epochs=1, optimizer="sgd", momentum=0.0, lr=1.0, grad_clip=1e-3, max_steps_per_epoch=1)
    _run(tmp_path, cfg, model=model, n_val=0)
    step = torch.cat([p.detach().cpu().flatten() for p in model.parameters()]) - before
    assert 0 < step.norm() <= 1e-3 * 1.0001


def test_loader_worker_processes_change_nothing(tmp_path):
    cfg = _cfg(epochs=1, max_steps_per_epoch=2, val_batch_size=2)
    _, inline = _run(tmp_path / "w0", cfg)
    _, workers = _run(tmp_path / "w1", dataclasses.replace(cfg, num_workers=1))
    assert _same_weights(inline.state_dict(), workers.state_dict())


class _BadLoss(ToyModel):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def loss(self, output, batch):
        if self.kind == "nan":
            return LossOutput(total=output.sum() * float("nan"), parts={})
        return {"total": output.sum()}


def test_bad_losses_fail_clearly(tmp_path):
    with pytest.raises(FloatingPointError, match="epoch 1 step 0"):
        _run(tmp_path / "a", _cfg(), model=_BadLoss("nan"))
    with pytest.raises(TypeError, match="must return LossOutput"):
        _run(tmp_path / "b", _cfg(), model=_BadLoss("dict"))


@dataclasses.dataclass
class _Experiment:
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)


def test_config_schema_through_the_yaml_loader(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("epochs: 4\nlr: 2e-3\noptimizer: adamw\nlr_scheduler: cosine\nmilestones: [2]\n")
    cfg = load_config(p, TrainConfig)
    assert (cfg.epochs, cfg.lr, cfg.optimizer, cfg.lr_scheduler) == (4, 2e-3, "adamw", "cosine")
    p.write_text("optimiser: adam\n")
    with pytest.raises(ConfigError, match="did you mean 'optimizer'"):
        load_config(p, TrainConfig)
    p.write_text("train:\n  epochs: 0\n")  # as a section of an experiment file
    with pytest.raises(ConfigError, match=r"t.yaml: key 'train.epochs': TrainConfig.epochs must be > 0"):
        load_config(p, _Experiment)
    with pytest.raises(ValueError, match="milestones"):
        TrainConfig(lr_scheduler="multistep")


class _DtypeSpy(ToyModel):
    """Records the dtype of the head's output in each training forward."""

    def __init__(self):
        super().__init__(dropout=0.0)
        self.dtypes = []

    def forward(self, batch):
        out = super().forward(batch)
        if self.training:
            self.dtypes.append(out.dtype)
        return out


@pytest.mark.parametrize("amp, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_computes_in_half_and_keeps_float32_weights(tmp_path, amp, dtype):
    model = _DtypeSpy()
    result, model = _run(tmp_path, _cfg(val_batch_size=2, amp=amp), model=model)
    assert set(model.dtypes) == {dtype} and len(model.dtypes) == 12
    assert result.history[-1]["val_loss"] < result.history[0]["val_loss"]
    latest = load_checkpoint(tmp_path / "checkpoints" / "latest.pth")
    assert all(v.dtype == torch.float32 for k, v in latest["model"].items() if v.is_floating_point())
    if amp == "fp16":  # the loss scale is part of the resume point
        assert latest["grad_scaler"]["scale"] > 0
    else:
        assert latest["grad_scaler"] is None


def test_fp16_resume_restores_the_loss_scale(tmp_path):
    from opencood_ext.training.checkpoint import save_checkpoint
    _run(tmp_path, _cfg(epochs=2, amp="fp16"))
    path = tmp_path / "checkpoints" / "latest.pth"
    state = load_checkpoint(path)
    state["grad_scaler"]["scale"] = 128.0
    save_checkpoint(state, [path])
    trainer = Trainer(ToyModel(), ToyDataset(16), None, collate, _cfg(epochs=3, amp="fp16"), tmp_path)
    assert trainer.restore() and trainer.scaler.get_scale() == 128.0


def test_float32_is_the_default_and_a_bad_amp_is_refused():
    assert TrainConfig().amp is None
    with pytest.raises(ValueError, match=r"TrainConfig\.amp must be None, bf16 or fp16, got 'fp8'"):
        TrainConfig(amp="fp8")


def _epoch_records(run_dir):
    return [r for r in map(json.loads, (run_dir / "train_log.jsonl").read_text().splitlines()) if r["kind"] == "epoch"]


def test_epochs_record_their_thread_count_and_a_resume_under_another_warns(tmp_path, caplog):
    """Results depend on the intra-op thread count (CPU kernels reduce in another order), so every epoch
    says what it ran with, and a resume under another count says it will not be bit-exact."""
    _run(tmp_path, _cfg(epochs=1))
    assert [r["threads"] for r in _epoch_records(tmp_path)] == [torch.get_num_threads()] == [1]
    with caplog.at_level("WARNING", logger="opencood_ext.training"):
        _run(tmp_path, _cfg(epochs=2))  # same count: silent
    assert "intra-op thread" not in caplog.text
    try:
        torch.set_num_threads(2)
        with caplog.at_level("WARNING", logger="opencood_ext.training"):
            result, _ = _run(tmp_path, _cfg(epochs=3))
    finally:
        torch.set_num_threads(1)
    assert f"{tmp_path}: epoch 2 trained with 1 intra-op thread(s), this resume has 2" in caplog.text
    assert "OMP_NUM_THREADS=1 to resume it exactly" in caplog.text
    assert [r["threads"] for r in _epoch_records(tmp_path)] == [1, 1, 2] == [h["threads"] for h in result.history]
    caplog.clear()
    with caplog.at_level("WARNING", logger="opencood_ext.training"):
        _run(tmp_path, _cfg(epochs=3))  # finished (a job's sequential step after its lanes): nothing trains, no warning
    assert "intra-op thread" not in caplog.text


class _SometimesDetached(ToyModel):
    """Its loss reaches no trainable parameter on the 1st and 3rd batches of two (as an onboarding
    batch without a new-type agent, whose loss runs through frozen parts only)."""

    def loss(self, output, batch):
        out = super().loss(output, batch)
        if batch.idx[0] // 2 % 2 == 0:
            const = out.total.detach()
            return LossOutput(total=const, parts={"mse": const}, detection=const)
        return out


def test_a_batch_whose_loss_reaches_no_trainable_parameter_takes_no_step(tmp_path):
    """Before, backward() raised 'element 0 of tensors does not require grad' and stopped the onboarding
    (the default main job's GenComm m3 onboarding on the 400-scene data, 2026-12-06)."""
    torch.manual_seed(0)
    model = _SometimesDetached(dropout=0.0)
    cfg = TrainConfig(epochs=1, batch_size=2, lr=0.01, optimizer="sgd", momentum=0.0, shuffle=False, progress_bar=False)
    steps = []
    weights = lambda: [p.detach().clone() for p in model.parameters()]  # noqa: E731
    orig = model.loss

    def watching(output, batch):
        steps.append((batch.idx[0], weights()))
        return orig(output, batch)
    model.loss = watching
    result = Trainer(model, ToyDataset(8), None, collate, cfg, tmp_path, device="cpu").fit()
    steps.append((None, weights()))
    assert [i for i, _ in steps[:-1]] == [0, 2, 4, 6] and result.history[0]["steps"] == 4
    changed = [any(not torch.equal(a, b) for a, b in zip(steps[k][1], steps[k + 1][1])) for k in range(4)]
    assert changed == [False, True, False, True]  # the detached batches: no step; the others: a step
