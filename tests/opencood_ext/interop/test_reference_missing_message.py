"""The reference's ``missing_message`` inference (issue 50 item 3): GenComm's reference models, in
evaluation with ``model.args.missing_message: True``, multiply every collaborator's message by a
fresh random mask before generation, ``torch.rand(C, H, W) > p`` per agent after the first (the
ego), each element kept independently; ``p`` is 0.4 in ``heter_model_baseline_w_gencomm_stage1``
and 0.1 in ``..._stage2`` (its comment says 20 %, its code keeps ``rand > 0.1``). The ego's own
message is not masked; training is not masked.

Ours: the converted config's ``model.link.missing_message`` (0.4 / 0.1), applied by the GenComm link
to each received message in evaluation. Checked: the importer's values, the share and independence
of the zeroed elements, training and the ego untouched, and, with the same random draws on both
sides, the head maps of the reference's forward (tests/helpers/reference_forward.py) to 1e-4.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import reference_forward as ref
import test_reference_e2e as e2e
from opencood_ext.interop import HypesError, convert_hypes_file
from test_reference_e2e import no_noise  # noqa: F401  (diffusion noise zero on both sides)

ASSETS = Path(__file__).parents[2] / "assets" / "hypes"
INFER = ASSETS / "gencomm_stage2_m1m2m3m4_att_infer.yaml"
STAGE1 = ASSETS / "GenComm/opencood/hypes_yaml/opv2v/GenComm_yamls/gencomm/stage1/m1_att.yaml"
BACKALIGN_INFER_KEY = "key 'model.args.missing_message'"


@pytest.fixture
def in_assets(monkeypatch):
    monkeypatch.chdir(ASSETS / "GenComm")  # the yamls' assignment path resolves from here


def test_the_importer_carries_the_rate_of_each_reference_model(in_assets, tmp_path):
    conv = convert_hypes_file(INFER)
    assert conv.config["model"]["link"]["missing_message"] == 0.1  # heter_model_baseline_w_gencomm_stage2
    text = STAGE1.read_text()
    assert "    ego_modality: *ego_modality\n" in text
    on = tmp_path / "stage1_missing.yaml"
    on.write_text(text.replace("    ego_modality: *ego_modality\n",
                               "    ego_modality: *ego_modality\n    missing_message: True\n"))
    assert convert_hypes_file(on).config["model"]["link"]["missing_message"] == 0.4  # ..._stage1
    assert "missing_message" not in convert_hypes_file(STAGE1).config["model"]["link"]  # absent: off
    bad = tmp_path / "stage1_bad.yaml"
    bad.write_text(on.read_text().replace("missing_message: True", "missing_message: 0.3"))
    with pytest.raises(HypesError, match=f"{bad}.*{BACKALIGN_INFER_KEY}.*true or false"):
        convert_hypes_file(bad)


def test_another_models_missing_message_is_refused(in_assets, tmp_path):
    """heter_model_baseline (HEAL, the BackAlign inference file) zeroes collaborators' FEATURES: refused."""
    text = (ASSETS / "GenComm/opencood/hypes_yaml/opv2v/GenComm_yamls/baselines/stage1/m1_att.yaml").read_text()
    path = tmp_path / "baseline_missing.yaml"
    anchor = "  core_method: heter_model_baseline\n  args:\n"
    assert anchor in text
    path.write_text(text.replace(anchor, anchor + "    missing_message: True\n"))
    with pytest.raises(HypesError, match=f"{BACKALIGN_INFER_KEY}: true: model 'heter_model_baseline'"):
        convert_hypes_file(path)


def _model(p):
    link = {**e2e.GENCOMM_LINK, "missing_message": p}
    return e2e._model(["m1"], link)


def _recording_rand(monkeypatch, seed=0):
    """torch.rand drawn from a seeded generator and kept, so the restatement applies the same draws."""
    g = torch.Generator().manual_seed(seed)
    draws = []
    real = torch.rand

    def rand(*shape, device=None, **kw):
        out = real(*shape, generator=g, **kw).to(device or "cpu")
        draws.append(out)
        return out
    monkeypatch.setattr(torch, "rand", rand)
    return draws


def _reference_masked(sd, batch, masks, p):
    """e2e._reference's GenComm forward for one all-m1 sample, every collaborator's message times
    ``masks[i - 1] > p`` (the reference's draw for agent i >= 1) before generation."""
    feats = []
    for t, inp in batch.inputs.items():
        pf = ref.pillar_vfe(sd, f"encoder_{t}", inp.voxels, inp.num_points, inp.coords, e2e.VOXEL, e2e.RANGE)
        nx, ny = round((e2e.RANGE[3] - e2e.RANGE[0]) / e2e.VOXEL[0]), round((e2e.RANGE[4] - e2e.RANGE[1]) / e2e.VOXEL[1])
        nums, strides, _, ups, _ = e2e.BACKBONES[t]
        x = ref.base_bev(sd, f"backbone_{t}", ref.scatter(pf, inp.coords, inp.num_agents, nx, ny), nums, strides, ups)
        feats = ref.downsample_conv(sd, f"shrinker_{t}", x, [2], [1])[torch.argsort(batch.type_index[t])]
    msgs = ref.message_extractor(sd, "message_extractor_m1", feats)
    msgs = torch.cat([msgs[:1]] + [msgs[i:i + 1] * (masks[i - 1] > p) for i in range(1, len(msgs))])
    x = ref.enhance(sd, ref.generate(sd, feats[:1].expand_as(feats), msgs, **e2e.UNET))
    fused = ref.att_fusion(ref.warp_to_ego(x, batch.T_world_from_agent, e2e.RANGE))[None]
    return ref.heads(sd, fused)


def test_evaluation_masks_each_collaborator_message_as_the_reference(monkeypatch, no_noise):  # noqa: F811
    batch = e2e._batch(["m1"], "all:m1")
    assert batch.num_agents == 3
    sd = e2e._checkpoint(e2e._shapes(["m1"], True), seed=0)
    p = 0.1
    model = _model(p)
    e2e._load(model, sd)
    draws = _recording_rand(monkeypatch)
    with torch.no_grad():
        ours = model(batch).head
    assert len(draws) == 1 and draws[0].shape[0] == 2  # one draw per forward: the two collaborators' messages
    masks = list(draws[0])
    want = _reference_masked(sd, batch, masks, p)
    hwl = torch.tensor([a * 7 + j for a in range(2) for j in (0, 1, 2, 5, 4, 3, 6)])
    errors = [float((a - b).abs().max() / b.abs().max()) for a, b in
              ((ours.cls, want[0]), (ours.reg, want[1][:, hwl]), (ours.dir, want[2]))]
    assert max(errors) < 1e-4, errors
    # the masks change the maps: without them the reference's maps differ
    plain = _reference_masked(sd, batch, [torch.ones_like(m) for m in masks], p)
    assert float((plain[0] - want[0]).abs().max() / want[0].abs().max()) > 1e-3
    # every element of every collaborator's message drawn on its own: the share zeroed is p
    dropped = torch.stack([(m <= p).float() for m in masks])
    assert abs(float(dropped.mean()) - p) < 0.02 and dropped.numel() > 4000  # 4.5 sigma
    assert not torch.equal(dropped[0, 0], dropped[0, 1]) and not torch.equal(dropped[0], dropped[1])


def test_training_and_a_model_without_it_draw_no_mask(monkeypatch, no_noise):  # noqa: F811
    batch = e2e._batch(["m1"], "all:m1")
    sd = e2e._checkpoint(e2e._shapes(["m1"], True), seed=3)
    model = _model(0.4)
    e2e._load(model, sd)
    draws = _recording_rand(monkeypatch)
    model.train()
    model(batch)
    off = _model(0.0)
    e2e._load(off, sd)
    with torch.no_grad():
        off(batch)
    assert draws == []


def test_bad_rate_is_refused():
    with pytest.raises(ValueError, match=r"model.link.missing_message must be a probability in \[0, 1\]"):
        _model(1.5)
