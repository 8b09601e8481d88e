"""Training under ``protocol: reference``: the two training-only terms of the reference GenComm.

1. The generation loss (GenComm ``opencood/loss/point_pillar_gencomm_loss.py`` on the outputs of
   ``heter_model_baseline_w_gencomm_stage1.py``): ``generate_weight * nn.MSELoss()(gt_feature,
   pred_feature)``, where gt_feature is every agent's own feature (the ego's included), in its own
   frame, not detached, and pred_feature the generator's output for that agent (from the ego's
   feature and the agent's own message) BEFORE the enhancer; the mean runs over every element.
2. PointPillars' PFNLayer in training: its BatchNorm1d (eps 1e-3, momentum 0.01) sees the (V, C, P)
   tensor of every slot, the zeroed padding slots included, in its batch and running statistics.

Checked on a checkpoint in the reference's layout (tests/opencood_ext/models/test_reference_e2e.py's builders, random
weights and BatchNorm statistics) and the V2XSet fixture frame, diffusion noise zero on both sides,
against the restatement of tests/helpers/reference_forward.py run with training-mode BatchNorm. The same
model under ``protocol: native`` keeps this project's terms (the generation loss on the received,
enhanced, warped features against the warped real ones over covered cells; BatchNorm over the real
points), each checked against its own restatement, so a broken protocol gate fails one side.
"""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

import reference_forward as ref
from opencood_ext.models.warp import warp_mask
import test_reference_e2e
from test_reference_e2e import GENCOMM_LINK, RANGE, UNET, VOXEL, _batch, _checkpoint, _load, _model, _shapes

torch.set_num_threads(1)
no_noise = test_reference_e2e.no_noise  # the fixture zeroing the diffusion noise on both sides
WEIGHT = 0.5  # the reference's loss.args.generate_weight (model.link.generation_weight here)
BACKBONE_M1 = ([1, 1], [2, 2], [1, 2])  # tests/opencood_ext/models/test_reference_e2e.py BACKBONES["m1"]: layer_nums, strides, ups


def _train_bn(real_only=None):
    """Training-mode BatchNorm for reference_forward (its ``_bn``): batch statistics over every
    dimension but the channels, the running statistics of ``sd`` updated in place (momentum 0.01,
    as the reference's PFNLayer and BaseBEVBackbone). real_only: (V, P) bool; the PFN's statistics
    then count those slots only, and the others come out as -inf (so no padding slot reaches the
    pillar max): this project's native PillarFeatureNet."""
    def bn(sd, p, x, eps):
        args = (sd[f"{p}.running_mean"], sd[f"{p}.running_var"], sd[f"{p}.weight"], sd[f"{p}.bias"], True, 0.01, eps)
        if real_only is None or ".pillar_vfe." not in f".{p}.":
            return F.batch_norm(x, *args)
        picked = x.permute(0, 2, 1)[real_only]  # x (V, C, P) -> (Nreal, C)
        F.batch_norm(picked, *args)  # the running statistics, of the real points
        mean, var = picked.mean(0)[None, :, None], picked.var(0, unbiased=False)[None, :, None]
        y = (x - mean) / torch.sqrt(var + eps) * args[2][None, :, None] + args[3][None, :, None]
        return torch.where(real_only[:, None, :].expand_as(x), y, torch.full_like(x, -math.inf))
    return bn


def _features(sd, batch, monkeypatch, native=False):
    """Every agent's own (N, C, H, W) feature in its own frame, agent order, reference stack in training."""
    inp = batch.inputs["m1"]
    real = torch.arange(inp.voxels.shape[1])[None, :] < inp.num_points[:, None]
    monkeypatch.setattr(ref, "_bn", _train_bn(real if native else None))
    pf = ref.pillar_vfe(sd, "encoder_m1", inp.voxels, inp.num_points, inp.coords, VOXEL, RANGE)
    nx, ny = round((RANGE[3] - RANGE[0]) / VOXEL[0]), round((RANGE[4] - RANGE[1]) / VOXEL[1])
    x = ref.base_bev(sd, "backbone_m1", ref.scatter(pf, inp.coords, inp.num_agents, nx, ny), *BACKBONE_M1)
    x = ref.downsample_conv(sd, "shrinker_m1", x, [2], [1])
    monkeypatch.undo()
    return x[torch.argsort(batch.type_index["m1"])]  # the type's rows back in agent order


def _messages(sd, x):
    return torch.cat([ref.message_extractor(sd, "message_extractor_m1", x[a:a + 1]) for a in range(len(x))])


def _reference_generation(sd, batch, monkeypatch, agents):
    """The reference's term: generate_weight * mean((pred - gt)^2) over ``agents`` (rows of the batch)."""
    x = _features(copy.deepcopy(sd), batch, monkeypatch)
    gen = ref.generate(sd, x[:1].expand_as(x), _messages(sd, x), **UNET)
    return WEIGHT * F.mse_loss(gen[agents], x[agents])


def _native_generation(sd, batch, monkeypatch):
    """This project's native term (warp_before_generation: true): each collaborator's message warped
    to the ego, generated from the ego's feature, enhanced, zero outside its coverage, against its
    real feature warped to the ego, over the covered cells."""
    x = _features(copy.deepcopy(sd), batch, monkeypatch, native=True)
    T = batch.T_world_from_agent.float()
    msgs = ref.warp_to_ego(_messages(sd, x), T, RANGE)[1:]
    got = ref.enhance(sd, ref.generate(sd, x[:1].expand(len(msgs), -1, -1, -1), msgs, **UNET))
    target = ref.warp_to_ego(x, T, RANGE)[1:]
    T_ego = torch.linalg.solve(T[0].double(), T[1:].double()).float()
    valid = warp_mask(T_ego, RANGE, tuple(x.shape[-2:]))
    return WEIGHT * ((got * valid - target) ** 2 * valid).sum() / (valid.sum() * x.shape[1])


def _ours(protocol, warp_before, drop=0.0, seed=5):
    batch = _batch(["m1"], "all:m1")
    sd = _checkpoint(_shapes(["m1"], True), seed=seed)
    link = {**GENCOMM_LINK, "warp_before_generation": warp_before, "generation_weight": WEIGHT}
    model = _model(["m1"], link, protocol=protocol)
    _load(model, sd)
    model.train_message_drop = drop
    model.train()
    return model, model(batch), batch, sd


def _rel(a, b):
    return abs(float(a.detach()) - float(b.detach())) / abs(float(b.detach()))


def test_reference_generation_loss_is_the_references_term(no_noise, monkeypatch):
    model, out, batch, sd = _ours("reference", False)
    assert batch.num_agents == 3
    want = _reference_generation(sd, batch, monkeypatch, slice(None))
    assert _rel(out.losses["generation"], want) < 1e-5, (float(out.losses["generation"]), float(want))
    # every agent's own feature is a target, not detached: the encoder learns from the term itself
    model.zero_grad()
    out.losses["generation"].backward()
    grad = model.encoders["m1"].encoder.pfn.layers[0]["linear"].weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0
    assert _rel(_native_generation(sd, batch, monkeypatch), want) > 1e-2  # the two terms differ here


def test_reference_generation_loss_covers_an_ego_that_received_nothing(no_noise, monkeypatch):
    _, out, batch, sd = _ours("reference", False, drop=1.0)  # every collaborator's message lost
    want = _reference_generation(sd, batch, monkeypatch, slice(0, 1))
    assert _rel(out.losses["generation"], want) < 1e-5, (float(out.losses["generation"]), float(want))


def test_native_generation_loss_is_unchanged(no_noise, monkeypatch):
    _, out, batch, sd = _ours("native", True)
    want = _native_generation(sd, batch, monkeypatch)
    assert _rel(out.losses["generation"], want) < 1e-5, (float(out.losses["generation"]), float(want))
    assert _rel(_reference_generation(sd, batch, monkeypatch, slice(None)), want) > 1e-2
    _, alone, _, _ = _ours("native", True, drop=1.0)
    assert "generation" not in alone.losses  # native: a loss on received messages only


@pytest.mark.parametrize("protocol", ["reference", "native"])
def test_pillar_vfe_in_training(protocol, monkeypatch):
    """Output and running statistics of the PFN BatchNorm after one training-mode forward: the
    reference's over every slot under reference, over the real points under native."""
    batch = _batch(["m1"], "all:m1")
    sd = _checkpoint(_shapes(["m1"], True), seed=6)
    model = _model(["m1"], GENCOMM_LINK, protocol=protocol)
    _load(model, sd)
    encoder = model.encoders["m1"].encoder
    encoder.train()
    inp = batch.inputs["m1"]
    ours = encoder.pfn(inp.voxels, inp.num_points, inp.coords, padding_slots=protocol == "reference").detach()
    norm = encoder.pfn.layers[0]["norm"]

    want_sd = copy.deepcopy(sd)
    real = torch.arange(inp.voxels.shape[1])[None, :] < inp.num_points[:, None]
    padded = bool((~real).any(dim=1).any())
    monkeypatch.setattr(ref, "_bn", _train_bn(None if protocol == "reference" else real))
    want = ref.pillar_vfe(want_sd, "encoder_m1", inp.voxels, inp.num_points, inp.coords, VOXEL, RANGE)
    monkeypatch.undo()
    assert padded and ours.shape == want.shape
    assert float((ours - want).abs().max() / want.abs().max()) < 1e-5
    p = "encoder_m1.pillar_vfe.pfn_layers.0.norm"
    for stat in ("running_mean", "running_var"):
        got, expect = getattr(norm, stat), want_sd[f"{p}.{stat}"]
        assert float((got - expect).abs().max() / expect.abs().max()) < 1e-5, stat
        assert float((got - sd[f"{p}.{stat}"]).abs().max()) > 0  # one step moved it
    # the other protocol's statistics are not these (the padding slots weigh)
    other = copy.deepcopy(sd)
    monkeypatch.setattr(ref, "_bn", _train_bn(real if protocol == "reference" else None))
    ref.pillar_vfe(other, "encoder_m1", inp.voxels, inp.num_points, inp.coords, VOXEL, RANGE)
    monkeypatch.undo()
    assert float((other[f"{p}.running_mean"] - norm.running_mean).abs().max()) > 1e-4
