"""Non-finite numbers: refused in every float config field (unless the field opts out), and
never written into a checkpoint."""
import dataclasses
import math

import pytest
import torch

from opencood_ext.config import NONFINITE_OK, ConfigError, config_from_dict, load_config
from opencood_ext.experiment import ExperimentConfig
from opencood_ext.training import TrainConfig, Trainer
from opencood_ext.training.checkpoint import load_checkpoint
from toy_training import ToyDataset, ToyModel, collate

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("override,key", [("train.lr=.inf", "train.lr"), ("train.grad_clip=.nan", "train.grad_clip"),
                                          ("train.gamma=-.inf", "train.gamma"), ("train.lr=1e400", "train.lr"),
                                          ("data.comm_range=.nan", "data.comm_range"),
                                          ("data.lidar_range=[0, 0, 0, .inf, 1, 1]", "data.lidar_range.3")])
def test_nonfinite_config_values_are_refused(tmp_path, override, key):
    p = tmp_path / "exp.yaml"
    p.write_text("name: x\n")
    with pytest.raises(ConfigError, match=rf"key '{key}': must be a finite number"):
        load_config(p, ExperimentConfig, [override])


def test_train_config_refuses_nonfinite_numbers_when_built_directly():
    for name in ("lr", "grad_clip", "weight_decay", "momentum", "gamma", "min_lr"):
        for bad in (math.inf, math.nan):
            with pytest.raises(ValueError, match=f"TrainConfig.{name} must be a finite number"):
                TrainConfig(**{name: bad})


def test_a_field_may_opt_out():
    @dataclasses.dataclass
    class Limits:
        cap: float = dataclasses.field(default=math.inf, metadata={NONFINITE_OK: True})
        step: float = 1.0

    assert config_from_dict(Limits, {"cap": math.inf}).cap == math.inf
    with pytest.raises(ConfigError, match="'step': must be a finite number"):
        config_from_dict(Limits, {"step": math.inf})


class _GradBlowUp(ToyModel):
    """Finite loss, but its gradients overflow: one SGD step makes the weights Inf. (Scaling the gradients by
    1e38 overflowed only when they were large enough, which depended on the batch the suite's order drew.)"""

    def __init__(self):
        super().__init__(dropout=0.0)
        self.blow_up = False
        for p in self.parameters():
            p.register_hook(lambda g: torch.full_like(g, math.inf) if self.blow_up else g)


def test_nonfinite_weights_are_never_checkpointed(tmp_path):
    cfg = dict(batch_size=4, lr=0.01, optimizer="sgd", momentum=0.0, max_steps_per_epoch=1, progress_bar=False)
    model = _GradBlowUp()
    Trainer(model, ToyDataset(8), ToyDataset(4), collate, TrainConfig(epochs=1, **cfg), tmp_path, device="cpu").fit()
    before = {p.name: p.read_bytes() for p in (tmp_path / "checkpoints").iterdir()}
    model.blow_up = True
    trainer = Trainer(model, ToyDataset(8), ToyDataset(4), collate, TrainConfig(epochs=2, **cfg), tmp_path,
                      device="cpu")
    with pytest.raises(FloatingPointError, match=r"hold NaN/Inf after epoch 2 .*nothing saved"):
        trainer.fit()
    assert not all(torch.isfinite(p).all() for p in model.parameters())  # the step did blow up
    after = {p.name: p.read_bytes() for p in (tmp_path / "checkpoints").iterdir()}
    assert after == before  # no epoch_2.pth, latest/best untouched
    latest = load_checkpoint(tmp_path / "checkpoints" / "latest.pth")
    assert latest["epoch"] == 1 and all(torch.isfinite(v).all() for v in latest["model"].values() if v.is_floating_point())
    assert '"epoch": 2' not in (tmp_path / "train_log.jsonl").read_text()
