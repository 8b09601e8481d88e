"""Model selection (training/selection.py): validation on the whole split, its noise fixed by seed
without touching the training run's random stream, best.pth picked on the detection loss alone."""
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from opencood_ext.training import LossOutput, TrainConfig, Trainer
from opencood_ext.training.checkpoint import capture_rng_state, load_checkpoint
from opencood_ext.training.runlog import read_log
from opencood_ext.training.selection import fixed_noise, recorded_best_epoch
from toy_training import ToyBatch, ToyDataset, ToyModel, collate

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(**kw):
    base = dict(epochs=3, batch_size=2, lr=0.02, log_every=2, seed=5, progress_bar=False)
    base.update(kw)
    return TrainConfig(**base)


class NoisyModel(ToyModel):
    """ToyModel whose evaluation samples noise from the global generators (as GenComm's diffusion
    does): torch for the output, python's and numpy's into an auxiliary term."""

    def forward(self, batch: ToyBatch) -> torch.Tensor:
        out = super().forward(batch)
        return out if self.training else out + torch.randn_like(out)

    def loss(self, output, batch) -> LossOutput:
        base = super().loss(output, batch)
        if not self.training:
            aux = torch.tensor(random.random() + float(np.random.rand()))
            return LossOutput(total=base.total + aux, parts={**base.parts, "aux": aux}, detection=base.detection)
        return base


class ScriptedAux(ToyModel):
    """Validation pass k (k = 1, 2, 3) scores detection 3 - k and an auxiliary term 5 (k - 1): the
    detection loss improves every epoch while the total gets worse."""

    def __init__(self):
        super().__init__(dropout=0.0)
        self.passes = 0

    def forward(self, batch):
        if not self.training and 0 in batch.idx:
            self.passes += 1
        return super().forward(batch)

    def loss(self, output, batch) -> LossOutput:
        if self.training:
            return super().loss(output, batch)
        det = torch.tensor(3.0 - self.passes)
        aux = torch.tensor(5.0 * (self.passes - 1))
        return LossOutput(total=det + aux, parts={"aux": aux}, detection=det)


def test_validation_reads_every_batch_of_the_split(tmp_path):
    val = ToyDataset(7, offset=500)
    trainer = Trainer(ToyModel(), ToyDataset(4), val, collate, _cfg(val_batch_size=2), tmp_path, device="cpu")
    trainer.validate()
    assert sorted(val.seen) == list(range(7))  # 4 batches, the last one short
    capped = ToyDataset(7, offset=500)
    trainer = Trainer(ToyModel(), ToyDataset(4), capped, collate, _cfg(val_batch_size=2, max_val_batches=2),
                      tmp_path / "capped", device="cpu")
    trainer.validate()
    assert sorted(capped.seen) == [0, 1, 2, 3]


def test_shipped_configs_validate_on_the_whole_split():
    from opencood_ext.experiment import load_experiment
    base = yaml.safe_load((REPO / "configs/sim/base.yaml").read_text())
    assert base["train"]["max_val_batches"] is None
    cfg = load_experiment(REPO / "configs/sim/gencomm_stage1_m1.yaml")
    assert cfg.train.max_val_batches is None and cfg.train.select_on == "detection_loss"


def test_two_passes_over_the_same_weights_score_the_same(tmp_path):
    model = NoisyModel()
    trainer = Trainer(model, ToyDataset(4), ToyDataset(5, offset=500), collate, _cfg(), tmp_path, device="cpu")
    model.eval()
    batch = collate([ToyDataset(2, offset=500)[i] for i in range(2)])
    assert not torch.equal(model(batch), model(batch))  # the model is stochastic in evaluation
    first, second = trainer.validate(), trainer.validate()
    assert first == second and set(first) == {"val_loss", "val_detection_loss", "val_mse", "val_abs", "val_aux"}


def test_validation_leaves_the_training_random_stream_alone(tmp_path):
    model = NoisyModel()
    trainer = Trainer(model, ToyDataset(4), ToyDataset(5, offset=500), collate, _cfg(), tmp_path, device="cpu")
    torch.manual_seed(11)
    random.seed(11)
    np.random.seed(11)
    before = capture_rng_state()
    trainer.validate()
    after = capture_rng_state()
    assert torch.equal(before["torch"], after["torch"]) and before["python"] == after["python"]
    assert torch.equal(before["numpy"]["key"], after["numpy"]["key"]) and before["numpy"]["pos"] == after["numpy"]["pos"]


def test_a_run_trains_the_same_weights_with_or_without_validation(tmp_path):
    """Dropout draws from the training stream: had validation's noise advanced it, the weights would differ."""
    weights = []
    for name, val in (("with", ToyDataset(5, offset=500)), ("without", None)):
        torch.manual_seed(0)
        model = NoisyModel()
        Trainer(model, ToyDataset(8), val, collate, _cfg(epochs=2), tmp_path / name, device="cpu").fit()
        weights.append(model.state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_fixed_noise_seeds_inside_and_restores_outside():
    torch.manual_seed(3)
    with fixed_noise(42, torch.device("cpu")):
        a = (torch.rand(3), random.random(), np.random.rand())
    outside = torch.rand(3)
    torch.manual_seed(3)
    assert torch.equal(outside, torch.rand(3))
    with fixed_noise(42, torch.device("cpu")):
        b = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


@pytest.mark.parametrize("select_on, best", [("detection_loss", 3), ("total_loss", 1)])
def test_selection_follows_the_detection_loss_not_the_auxiliary_term(tmp_path, select_on, best):
    model = ScriptedAux()
    result = Trainer(model, ToyDataset(4), ToyDataset(3, offset=500), collate, _cfg(select_on=select_on),
                     tmp_path, device="cpu").fit()
    assert [h["val_detection_loss"] for h in result.history] == [2.0, 1.0, 0.0]
    assert [h["val_loss"] for h in result.history] == [2.0, 6.0, 10.0]
    assert result.best_epoch == best and result.select_on == select_on
    assert load_checkpoint(tmp_path / "checkpoints/best.pth")["epoch"] == best
    assert load_checkpoint(tmp_path / "checkpoints/latest.pth")["epoch"] == 3  # the last epoch is kept too
    logged = read_log(tmp_path, "epoch")
    assert [(r["val_loss"], r["val_detection_loss"]) for r in logged] == [(2.0, 2.0), (6.0, 1.0), (10.0, 0.0)]
    assert [r["best_epoch"] for r in logged] == ([1, 2, 3] if best == 3 else [1, 1, 1])


def test_detection_selection_needs_the_models_detection_term(tmp_path):
    class NoDetection(ToyModel):
        def loss(self, output, batch):
            return LossOutput(total=((output - batch.y) ** 2).mean())
    trainer = Trainer(NoDetection(), ToyDataset(4), ToyDataset(3), collate, _cfg(), tmp_path, device="cpu")
    with pytest.raises(TypeError, match="no LossOutput.detection.*select_on: total_loss"):
        trainer.validate()
    trainer = Trainer(NoDetection(), ToyDataset(4), ToyDataset(3), collate, _cfg(select_on="total_loss"),
                      tmp_path / "total", device="cpu")
    assert set(trainer.validate()) == {"val_loss"}


def test_a_resumed_run_keeps_the_rule_it_started_with(tmp_path):
    model = ScriptedAux()
    Trainer(model, ToyDataset(4), ToyDataset(3, offset=500), collate, _cfg(epochs=2, select_on="total_loss"),
            tmp_path, device="cpu").fit()
    model.passes = 2
    result = Trainer(model, ToyDataset(4), ToyDataset(3, offset=500), collate, _cfg(epochs=3), tmp_path,
                     device="cpu").fit()
    assert result.select_on == "total_loss" and result.best_epoch == 1
    assert load_checkpoint(tmp_path / "checkpoints/latest.pth")["config"]["select_on"] == "total_loss"


def test_best_epoch_of_histories_written_before_best_epoch_existed():
    old = [{"epoch": 1, "val_loss": 2.0}, {"epoch": 2, "val_loss": 1.5}, {"epoch": 3, "val_loss": 1.7}]
    assert recorded_best_epoch(old, 1.5) == 2 and recorded_best_epoch(old, None) is None
    new = [dict(h, best_epoch=b) for h, b in zip(old, [1, 1, 3])]
    assert recorded_best_epoch(new, 1.7) == 3


def test_train_config_refuses_an_unknown_selection():
    with pytest.raises(ValueError, match="select_on"):
        TrainConfig(select_on="val_ap")


def test_gencomm_validation_draws_the_same_diffusion_noise_every_pass(tmp_path):
    """A real GenComm model: its receiver samples diffusion noise, yet two validation passes agree."""
    from opencood_ext.experiment import build_dataset, build_model, collate as collate_samples, load_experiment
    from tiny_runs import GENCOMM, PP, tiny_config, tiny_dataset
    data = tiny_dataset(tmp_path / "data")
    cfg = load_experiment(tiny_config(tmp_path, data, "g", {"m1": PP}, {"fusion": "intermediate", "link": GENCOMM}))
    torch.manual_seed(0)
    model = build_model(cfg)
    val = build_dataset(cfg, cfg.data.val_split, train=False)
    model.eval()
    batch = collate_samples([val[0]])
    with torch.no_grad():
        a, b = (model.loss(model(batch), batch).total for _ in range(2))
    assert a != b  # diffusion noise is drawn in evaluation
    trainer = Trainer(model, build_dataset(cfg, cfg.data.train_split, train=True), val, collate_samples,
                      _cfg(), tmp_path / "run", device="cpu")
    first, second = trainer.validate(), trainer.validate()
    assert first == second
    parts = first["val_cls"] + first["val_box"] + first["val_dir"]
    assert first["val_detection_loss"] == pytest.approx(parts, rel=1e-6)  # the detection terms, nothing else
    assert json.loads(json.dumps(first)) == first  # plain floats: what train_log.jsonl records


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_validation_on_cuda_fixes_and_restores_the_device_generator(tmp_path):
    model = NoisyModel()
    trainer = Trainer(model, ToyDataset(4), ToyDataset(5, offset=500), collate, _cfg(), tmp_path, device="cuda:0")
    torch.cuda.manual_seed(9)
    before = torch.cuda.get_rng_state(0)
    first, second = trainer.validate(), trainer.validate()
    assert first == second and torch.equal(before, torch.cuda.get_rng_state(0))
