"""Stage policies: exact trainable set, frozen weights and BatchNorm stats bit-identical."""
import pytest
import torch
from torch import nn

from opencood_ext.training import FreezePolicy, TrainConfig, Trainer
from opencood_ext.training.freeze import resolve_policy
from toy_training import ToyDataset, ToyModel, collate


pytestmark = pytest.mark.usefixtures("one_thread")


class _Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.dme = nn.ModuleDict({"lidar": nn.Linear(3, 3), "lidar2": nn.Linear(3, 3)})
        self.backbone = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))


def test_apply_trains_exactly_the_prefix_params():
    m = _Nested()
    params = FreezePolicy(["dme.lidar"]).apply(m)
    expected = [m.dme["lidar"].weight, m.dme["lidar"].bias]  # not dme.lidar2 (dotted boundary)
    assert [id(p) for p in params] == [id(p) for p in expected]
    for name, p in m.named_parameters():
        assert p.requires_grad == name.startswith("dme.lidar."), name


def test_unknown_prefix_names_the_closest_module():
    with pytest.raises(ValueError, match=r"'dme.lidr'.*closest.*dme.lidar"):
        FreezePolicy(["dme.lidr"]).apply(_Nested())
    with pytest.raises(ValueError, match="at least one"):
        FreezePolicy([])


def test_summary_counts_per_prefix():
    m = _Nested()
    policy = FreezePolicy(["dme.lidar", "backbone.1"])
    policy.apply(m)
    s = policy.summary(m)
    assert s.per_prefix == {"dme.lidar": 12, "backbone.1": 6}
    assert s.trainable == 18 and s.frozen == 12 + 12
    assert s.frozen_batchnorms == []  # backbone.1 itself is trainable
    assert "trainable 18" in str(s)


def test_stray_model_train_cannot_update_frozen_batchnorm():
    m = _Nested()
    FreezePolicy(["dme"]).apply(m)
    bn = m.backbone[1]
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    m.train()  # e.g. some code outside the trainer
    m.backbone(torch.randn(6, 3) * 5 + 2)
    assert all(torch.equal(before[k], v) for k, v in bn.state_dict().items())


def _snapshot(module):
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}   # the trainer may move it to CUDA


@pytest.mark.parametrize("as_callable", [False, True])
def test_one_epoch_frozen_bit_identical_trainable_changed(tmp_path, as_callable):
    torch.manual_seed(0)
    model = ToyModel(dropout=0.0)
    enc_before, head_before = _snapshot(model.encoder), _snapshot(model.head)
    if as_callable:
        policy = lambda m: list(m.head.parameters())  # noqa: E731
    else:
        policy = FreezePolicy(["head"])
    cfg = TrainConfig(epochs=1, batch_size=4, lr=0.05, progress_bar=False, log_every=1)
    result = Trainer(model, ToyDataset(16), None, collate, cfg, tmp_path, param_filter=policy).fit()
    assert result.trainable_params == sum(p.numel() for p in model.head.parameters())
    enc_after, head_after = _snapshot(model.encoder), _snapshot(model.head)
    # frozen encoder: weights AND BatchNorm running stats / counter bit-identical
    assert enc_before.keys() == enc_after.keys()
    assert all(torch.equal(enc_before[k], enc_after[k]) for k in enc_before), "frozen part changed"
    assert "1.running_mean" in enc_before
    # trainable head: weights changed, and its own BatchNorm did track batch statistics
    assert not torch.equal(head_before["0.weight"], head_after["0.weight"])
    assert not torch.equal(head_before["1.running_mean"], head_after["1.running_mean"])
    assert head_after["1.num_batches_tracked"].item() == 4
    assert model.encoder[1].training is False and model.head[1].training is True


def test_resolve_policy_rejects_junk_and_default_trains_all():
    with pytest.raises(TypeError, match="param_filter"):
        resolve_policy(42)
    m = _Nested()
    assert len(resolve_policy(None).apply(m)) == len(list(m.parameters()))
    with pytest.raises(ValueError, match="not in the model"):
        resolve_policy(lambda _: [nn.Parameter(torch.zeros(1))]).apply(m)

