"""V2X-ViT fusion (model.fusion_op: v2xvit): shapes, masking, invariances, gradients, the delay
encoding, a training step through the detector, and its configs."""
from pathlib import Path

import pytest
import torch

from opencood_ext.config import ConfigError
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.experiment import build_model, load_experiment
from opencood_ext.models.detector import FUSION_OPS, CooperativeDetector
from opencood_ext.models.fusion import MaxFusion
from opencood_ext.models.v2xvit import V2XViTFusion, WindowAttention
from opencood_ext.data.synthetic import SyntheticReader
from tiny_runs import PP

torch.set_num_threads(1)
SIM = Path(__file__).resolve().parents[3] / "configs" / "sim"
RANGE = (-32.0, -32.0, -3.0, 32.0, 32.0, 1.0)
SMALL = dict(depth=2, agent_heads=2, agent_head_dim=4, windows=(2, 4), window_heads=(2, 1),
             window_head_dims=(4, 8), mlp_dim=8, dropout=0.0)


def _op(**kw):
    torch.manual_seed(0)
    return V2XViTFusion(8, **{**SMALL, **kw}).eval()


def _feats(n, h=9, w=7, seed=1):
    return torch.randn(n, 8, h, w, generator=torch.Generator().manual_seed(seed))


def test_registered_and_shapes_with_mixed_agent_counts_and_odd_grid():
    assert FUSION_OPS["v2xvit"] is V2XViTFusion
    op = _op()
    out = op(_feats(6), [1, 3, 2], torch.ones(6, 1, 9, 7))  # 9 x 7: both sides padded to the windows
    assert out.shape == (3, 8, 9, 7) and torch.isfinite(out).all()
    assert op(_feats(1), [1]).shape == (1, 8, 9, 7)  # ego only
    with pytest.raises(ValueError, match="sum to"):
        op(_feats(3), [1, 1])
    with pytest.raises(ValueError, match="built for 8 channels"):
        op(torch.randn(2, 4, 9, 7), [2])


@pytest.mark.parametrize("role_specific", [True, False])
def test_collaborator_without_coverage_gives_exactly_the_ego_only_output(role_specific):
    op = _op(role_specific=role_specific)
    f = _feats(2)
    valid = torch.ones(2, 1, 9, 7)
    valid[1] = 0  # the message covers nothing of the ego's grid
    alone = op(f[:1], [1])
    assert torch.equal(op(f, [2], valid), alone)
    # whatever that collaborator's feature holds
    assert torch.equal(op(torch.cat([f[:1], 1e3 * _feats(1, seed=7)]), [2], valid), alone)
    # and a collaborator that does cover cells changes the output
    assert not torch.allclose(op(f, [2], torch.ones(2, 1, 9, 7)), alone)


def test_cells_outside_a_collaborators_coverage_do_not_reach_the_output():
    """Across agent attention, window attention and split-attention pooling, over 2 layers."""
    op = _op()
    f = _feats(3)
    valid = torch.ones(3, 1, 9, 7)
    valid[1, :, :4] = 0  # top rows outside collaborator 1's coverage
    valid[2, :, :, 5:] = 0
    ref = op(f, [3], valid)
    g = f.clone()
    g[1, :, :4] = 50 * torch.randn(8, 4, 7)
    g[2, :, :, 5:] = -30.0
    assert torch.equal(op(g, [3], valid), ref)
    g[1, :, 6] += 1.0  # a covered cell does count
    assert not torch.allclose(op(g, [3], valid), ref)


@pytest.mark.parametrize("role_specific", [True, False])
def test_permuting_collaborators_leaves_the_output(role_specific):
    op = _op(role_specific=role_specific)
    f = _feats(4)
    valid = (torch.rand(4, 1, 9, 7, generator=torch.Generator().manual_seed(3)) > 0.3).float()
    ref = op(f, [4], valid)
    perm = [0, 3, 1, 2]
    torch.testing.assert_close(op(f[perm], [4], valid[perm]), ref, atol=1e-5, rtol=1e-5)
    swapped = [1, 0, 2, 3]  # but the ego's slot is special
    assert not torch.allclose(op(f[swapped], [4], valid[swapped]), ref, atol=1e-3)


def test_gradient_reaches_every_parameter_and_the_inputs():
    op = _op(delay_encoding=True).train()
    f = _feats(5).requires_grad_()
    valid = torch.ones(5, 1, 9, 7)
    valid[2, :, :3] = 0
    out = op(f, [3, 2], valid, delays=torch.tensor([0.0, 2.0, 1.0, 0.0, 4.0]))
    out.square().mean().backward()
    for name, p in op.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert f.grad[1].abs().sum() > 0 and f.grad[4].abs().sum() > 0  # collaborators feed the ego's output


def test_window_attention_ignores_invalid_keys_and_empty_windows_stay_finite():
    torch.manual_seed(0)
    win = WindowAttention(8, 4, 2, 4, 0.0)
    x = torch.randn(1, 8, 8, 8)
    ok = torch.ones(1, 8, 8, dtype=torch.bool)
    ok[0, :4, :4] = False  # one whole window invalid, and one cell of another
    ok[0, 5, 5] = False
    ref = win(x, ok)
    y = x.clone()
    y[0, :4, :4] = 1e4
    y[0, 5, 5] = -1e4
    out = win(y, ok)
    assert torch.isfinite(out).all()
    assert torch.equal(out[ok], ref[ok])


def test_delay_encoding_uses_the_delays_and_needs_them():
    op = _op(delay_encoding=True, delay_step=2.0, max_delay_steps=4)
    assert op.needs_delays and not _op().needs_delays
    f = _feats(2)
    now = op(f, [2], delays=torch.tensor([0.0, 0.0]))
    late = op(f, [2], delays=torch.tensor([0.0, 4.0]))
    assert not torch.allclose(now, late)
    # beyond the table: its last row (steps 0..3 at 2 units a step)
    torch.testing.assert_close(op(f, [2], delays=torch.tensor([0.0, 6.0])),
                               op(f, [2], delays=torch.tensor([0.0, 60.0])))
    with pytest.raises(ValueError, match="needs delays"):
        op(f, [2])
    with pytest.raises(ValueError, match="without delay_encoding"):
        _op()(f, [2], delays=torch.zeros(2))


def test_constructor_refuses_inconsistent_settings():
    with pytest.raises(ValueError, match="one entry per window size"):
        V2XViTFusion(8, windows=[4, 8], window_heads=[1], window_head_dims=[4, 4])
    with pytest.raises(ValueError, match="window_fuse"):
        V2XViTFusion(8, window_fuse="sum")
    with pytest.raises(ValueError, match="depth"):
        V2XViTFusion(8, depth=0)


FUSE_ARGS = dict(depth=1, agent_heads=2, agent_head_dim=8, windows=[4, 8], window_heads=[2, 1],
                 window_head_dims=[8, 16], mlp_dim=16, dropout=0.0)


def _batch(model, train=False):
    """One synthetic sample of 3 m1 agents (ego first) for intermediate fusion."""
    cfg = DataConfig(lidar_range=RANGE, agent_types={"m1": AgentTypeData()}, augment=AugmentConfig(enabled=False))
    ds = CooperativeDataset(SyntheticReader(1), cfg, model.voxel_sizes(), train=train, cooperation="all")
    return collate_samples([ds[0]])


def test_intermediate_training_step_through_the_detector():
    torch.manual_seed(0)
    model = CooperativeDetector({"m1": PP}, RANGE, fusion_op="v2xvit", fusion_args=FUSE_ARGS)
    assert isinstance(model.fuse, V2XViTFusion) and model.fuse.channels == 8
    batch = _batch(model, train=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = {n: p.detach().clone() for n, p in model.fuse.named_parameters()}
    loss = model.loss(model(batch), batch)
    loss.total.backward()
    assert torch.isfinite(loss.total)
    assert model.fuse.blocks[0].agent.k[1].weight.grad.abs().sum() > 0  # collaborators' key projection
    opt.step()
    assert all(not torch.equal(p, before[n]) for n, p in model.fuse.named_parameters())
    model.eval()
    pred = model.predict(_batch(model))
    assert len(pred.delivery.arrived) == 2 and pred.detections[0].boxes.shape[1] == 7


def test_detector_passes_message_ages_to_the_delay_encoding():
    torch.manual_seed(0)
    model = CooperativeDetector({"m1": PP}, RANGE, fusion_op="v2xvit",
                                fusion_args={**FUSE_ARGS, "delay_encoding": True})
    batch = _batch(model)
    batch.agent_times = [10.0, 8.0, 6.0]  # the collaborators' data is 2 and 4 units older
    seen = []
    model.fuse.register_forward_pre_hook(lambda mod, args, kw: seen.append(kw["delays"].tolist()), with_kwargs=True)
    model.eval()
    with torch.no_grad():
        model(batch)
        feats = model.encode(batch).feats
        model.method.receive(model, batch, feats, model.method.send(model, batch, feats).select([]))
    assert seen == [[0.0, 2.0, 4.0], [0.0]]


def test_max_fusion_by_config_refuses_v2xvit_arguments():
    with pytest.raises(ValueError, match=r"model.fusion_args.depth: not an argument of 'max'"):
        CooperativeDetector({"m1": PP}, RANGE, fusion_op="max", fusion_args={"depth": 1})
    with pytest.raises(ValueError, match=r"model.fusion_args.channels: is derived"):
        CooperativeDetector({"m1": PP}, RANGE, fusion_op="v2xvit", fusion_args={"channels": 8})
    with pytest.raises(ValueError, match="without 'type'"):
        CooperativeDetector({"m1": PP}, RANGE, fusion_op="v2xvit", fusion_args={"type": "att"})
    assert isinstance(CooperativeDetector({"m1": PP}, RANGE, fusion_op="max").fuse, MaxFusion)


@pytest.mark.parametrize("name", ["m1m3_intermediate_v2xvit.yaml", "gencomm_stage1_m1_v2xvit.yaml"])
def test_sim_v2xvit_configs_build_the_small_setting(name):
    cfg = load_experiment(SIM / name)
    assert cfg.model["fusion_op"] == "v2xvit"
    fuse = build_model(cfg).fuse
    assert isinstance(fuse, V2XViTFusion) and len(fuse.blocks) == 1 and fuse.channels == 128
    assert [b.window for b in fuse.blocks[0].window.branches] == [4, 8, 16]
    plain = name.replace("_v2xvit", "")
    assert {k: v for k, v in load_experiment(SIM / plain).model.items() if k != "fusion_op"} == \
        {k: v for k, v in cfg.model.items() if k not in ("fusion_op", "fusion_args")}


def test_set_overrides_pick_v2xvit_for_any_experiment():
    path = SIM / "m1m3_intermediate.yaml"
    fuse = build_model(load_experiment(path, ["model.fusion_op=v2xvit"])).fuse
    assert isinstance(fuse, V2XViTFusion) and len(fuse.blocks) == 3  # the reference setting
    fuse = build_model(load_experiment(path, ["model.fusion_op=v2xvit", "model.fusion_args.depth=2"])).fuse
    assert len(fuse.blocks) == 2
    with pytest.raises(ConfigError, match=r"model.fusion_args.depht: not an argument of 'v2xvit'.*'depth'"):
        build_model(load_experiment(path, ["model.fusion_op=v2xvit", "model.fusion_args.depht=2"]))
    with pytest.raises(ConfigError, match="unknown fusion op 'v2xvt'.*'v2xvit'"):
        build_model(load_experiment(path, ["model.fusion_op=v2xvt"]))


def test_fusion_benchmark_reports_the_sim_settings_parameters():
    import sys
    sys.path.insert(0, str(SIM.parents[1]))
    from experiments.bench.fusion_ops import main
    res = main(["--quick", "--reps", "1", "--ops", "max,v2xvit_sim"])
    fuse = build_model(load_experiment(SIM / "m1m3_intermediate_v2xvit.yaml")).fuse
    assert res["v2xvit_sim_params"] == sum(p.numel() for p in fuse.parameters()) > 0
    assert res["max_params"] == 0 and res["v2xvit_sim_fwd_bwd_ms"] > 0
