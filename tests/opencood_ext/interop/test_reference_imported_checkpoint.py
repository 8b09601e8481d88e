"""Issue 50's "done when": a GenComm stage-1 and a stage-2 checkpoint in the reference's layout,
imported as a user imports them (the published yaml through the config importer, the checkpoint
through ``interop.runs.import_weights``) and evaluated on a real frame read back from disk as OPV2V,
give the reference's boxes (same count, centres within 1 cm, scores within 1e-4), its AP and its
targets.

The reference's side is restated independently of our model: its forward (tests/helpers/reference_forward.py,
numbers read from the yaml), its anchors (tests/opencood_ext/models/test_reference_anchors.py: ``generate_anchor_box``),
its targets (tests/opencood_ext/models/test_reference_model.py: ``generate_label``), its post-processing
(tests/opencood_ext/test_reference_eval.py: ``VoxelPostprocessor.post_process``) and its ego (tests/opencood_ext/data/test_reference_ego.py:
``reorder_cav_list``). The AP of both box lists is computed by our AP code (tests/opencood_ext/eval/test_ap.py checks it).

The yamls are the published ones with two edits a user would make: ``cav_lidar_range`` cropped and
centred (the CPU restatement of SECOND is dense), and the stage-2 assignment pointing at the frame's
own (agent 4279, the real scan, is m4 -> m3 after the mapping, so the reference's ego is 9000, the
m2 -> m1 agent, not the first agent). Random weights, as tests/opencood_ext/models/test_reference_e2e_predictions.py
(classification bias lowered, regression scaled down, so boxes stay car-sized and some match).
"""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import torch

import reference_forward as ref
import test_reference_e2e as e2e
import test_reference_e2e_predictions as pred
import test_reference_eval as ev
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.formats import write_opv2v_frame
from opencood_ext.experiment import build_dataset
from opencood_ext.interop import convert_hypes_file
from opencood_ext.interop.hypes_reader import read_yaml
from opencood_ext.interop.runs import import_weights
from reference_keys import (base_bev, diffusion_unet, downsample_conv, enhancer, gencomm_schedule, heads,
                            message_extractor, pillar_vfe)
from test_reference_anchors import HWL, reference_anchor_box
from test_reference_e2e import no_noise  # noqa: F401  (diffusion noise zero on both sides)
from test_reference_ego import reference_ego
from test_reference_model import _generate_label

GENCOMM = e2e.Path(__file__).parents[2] / "assets/hypes/GenComm/opencood/hypes_yaml/opv2v/GenComm_yamls/gencomm"
CROP1 = [-38.4, -19.2, -3, 38.4, 19.2, 1]   # stage 1 (PointPillars): 2,304 anchors
CROP2 = [-25.6, -12.8, -3, 25.6, 12.8, 1]   # stage 2 (SECOND at 0.1 m, restated densely): 1,024 anchors
ASSIGNMENT = {"4279": "m4", "9000": "m2", "9001": "m3"}  # raw types; the stage-2 yaml maps m2 -> m1, m4 -> m3


def _edited_yaml(tmp_path, src, crop, assignment=None):
    text = src.read_text()
    text, n = re.subn(r"cav_lidar_range: &cav_lidar \[[^\]]*\]", f"cav_lidar_range: &cav_lidar {crop}", text)
    assert n == 1
    if assignment is not None:
        text, n = re.subn(r'assignment_path: "[^"]*"', f'assignment_path: "{assignment}"', text)
        assert n == 1
    path = tmp_path / src.name
    path.write_text(text)
    return path, read_yaml(path)[0]


def _write_frame(root, scenario_types):
    """The fixture's scan (agent 4279) and its two placed collaborators, as OPV2V files (a 32-beam copy
    of each scan for m3, OPV2V-H's); -> the scenario's name."""
    frame = e2e._frame()
    agents = [dataclasses.replace(a, lidar_beams={32: a.lidar}) for a in frame.agents]
    frame = dataclasses.replace(frame, agents=agents)
    write_opv2v_frame(root, "test", frame, write_cameras=False, bev_visibility=False)
    return frame.scenario


def _import(tmp_path, yaml_path, sd, root, modality=None):
    """gencomm-import-config then gencomm-import-weights' model, and the dataset its config reads."""
    conv = convert_hypes_file(yaml_path, remap_to=tmp_path / "ours.modality.json")
    for path, text in conv.files.items():
        path.write_text(text)
    overrides = [f"data.root={root}"] + ([f"data.modality={modality}"] if modality else [])
    cfg = conv.experiment(overrides)
    torch.save(sd, tmp_path / "net_epoch_bestval_at1.pth")
    model, mapping = import_weights(cfg, tmp_path / "net_epoch_bestval_at1.pth")
    assert not mapping.unused and not mapping.unmatched
    ds = build_dataset(cfg, cfg.eval.split, train=False)
    return cfg, model.eval(), collate_samples([ds[0]])


def _stack(sd, hypes, t, inp, rng):
    """The reference's encoder, backbone and shrink header of type ``t`` -> (rows of the type, C, H, W)."""
    setting, args = hypes["heter"]["modality_setting"][t], hypes["model"]["args"][t]
    voxel = setting["preprocess"]["args"]["voxel_size"]
    if setting["core_method"] == "point_pillar":
        nx, ny = round((rng[3] - rng[0]) / voxel[0]), round((rng[4] - rng[1]) / voxel[1])
        x = ref.scatter(ref.pillar_vfe(sd, f"encoder_{t}", inp.voxels, inp.num_points, inp.coords, voxel, rng),
                        inp.coords, inp.num_agents, nx, ny)
    else:
        grid = [round((rng[k + 3] - rng[k]) / voxel[k]) for k in (2, 1, 0)]
        x = ref.voxel_backbone_8x(sd, f"encoder_{t}", inp.voxels, inp.num_points, inp.coords, inp.num_agents, grid)
    b = args["backbone_args"]
    x = ref.base_bev(sd, f"backbone_{t}", x, b["layer_nums"], b["layer_strides"], b["upsample_strides"])
    s = args["shrink_header"]
    return ref.downsample_conv(sd, f"shrinker_{t}", x, s["stride"], s["padding"])


def reference_forward(sd, hypes, batch, rng):
    """heter_model_baseline_w_gencomm_stage1/2.forward for one sample (agents in the batch's order, the
    ego first): per type its stack, per agent its type's message, every agent's feature generated from
    the ego's and its own message, enhanced, warped, fused by attention, the heads."""
    by_type = {t: _stack(sd, hypes, t, inp, rng) for t, inp in batch.inputs.items()}
    rows = [int((batch.type_index[t] == a).nonzero()[0, 0]) for a, t in enumerate(batch.agent_types)]
    x = torch.stack([by_type[t][r] for t, r in zip(batch.agent_types, rows)])
    msgs = torch.cat([ref.message_extractor(sd, f"message_extractor_{t}", x[a:a + 1])
                      for a, t in enumerate(batch.agent_types)])
    unet = hypes["model"]["args"]["gencomm"]["model"]
    x = ref.enhance(sd, ref.generate(sd, x[:1].expand_as(x), msgs, unet["ch"], tuple(unet["ch_mult"]),
                                     unet["num_res_blocks"]))
    return ref.heads(sd, ref.att_fusion(ref.warp_to_ego(x, batch.T_world_from_agent, rng))[None])


def _checkpoint(hypes, seed):
    """Reference-layout keys at the yaml's widths (PointPillars, SECOND, BaseBEVBackbone, DownsampleConv,
    message extractor, UNet, enhancer, heads), random weights scaled by fan-in, then pred._edit."""
    shapes = {}
    for t in hypes["model"]["args"]:
        if not re.fullmatch(r"m\d+", t):
            continue
        args = hypes["model"]["args"][t]
        b = args["backbone_args"]
        if hypes["heter"]["modality_setting"][t]["core_method"] == "point_pillar":
            cin = args["encoder_args"]["pillar_vfe"]["num_filters"][-1]
            shapes.update(pillar_vfe(f"encoder_{t}", 10, cin))
        else:
            cin = args["encoder_args"]["map2bev"]["feature_num"]
            shapes.update(e2e._second_keys(f"encoder_{t}"))
        ins = [cin] + list(b["num_filters"][:-1])
        shapes.update(base_bev(f"backbone_{t}", list(zip(ins, b["num_filters"], b["layer_nums"], b["upsample_strides"],
                                                         b["num_upsample_filter"]))))
        s = args["shrink_header"]
        shapes.update(downsample_conv(f"shrinker_{t}", [(s["input_dim"], s["dim"][0], s["kernal_size"][0])]))
        shapes.update(message_extractor(f"message_extractor_{t}", s["dim"][0]))
    c = hypes["model"]["args"]["in_head"]
    unet = hypes["model"]["args"]["gencomm"]["model"]
    shapes.update({**diffusion_unet("gencomm.denoiser", unet["ch"], tuple(unet["ch_mult"]), unet["num_res_blocks"],
                                    c + 2, c), **enhancer("enhancer", c), **heads(c)})
    sd = e2e._checkpoint(shapes, seed)
    sd.update(gencomm_schedule("gencomm"))
    return pred._edit(sd)


def _compare(model, hypes, batch, sd, rng, monkeypatch, matched_at):
    """Ours (the imported model's decode) against the reference restated: boxes, scores, AP, targets."""
    monkeypatch.setattr(ev, "RANGE", tuple(rng))  # the restatement's final range mask
    anchors = torch.from_numpy(reference_anchor_box(hypes)[..., HWL])  # (H, W, K, 7) in our box order
    with torch.no_grad():
        ours = model.decode(model(batch).head)[0]
        cls, reg, dirs = reference_forward(sd, hypes, batch, rng)
    hwl = torch.tensor([a * 7 + j for a in range(reg.shape[1] // 7) for j in HWL])
    corners, scores, _ = ev.reference_post_process(cls, reg[:, hwl], dirs, anchors, multi_class=False)
    assert len(ours) == len(scores) > 5, (len(ours), len(scores))
    np.testing.assert_allclose(ours.scores.numpy(), scores, rtol=0, atol=1e-4)
    centres = corners[:, :4, :2].mean(axis=1)
    assert float(np.abs(ours.boxes[:, :2].numpy() - centres).max()) < 0.01
    gt = batch.gt_boxes[0]
    ap_ours, ap_ref = pred._ap(ours.boxes, ours.scores, gt), pred._ap(pred._boxes_from_corners(corners), scores, gt)
    assert ap_ours == pytest.approx(ap_ref, abs=1e-9) and ap_ours[matched_at] > 0, (ap_ours, ap_ref)
    # targets: generate_label on the reference's anchors against this frame's ground truth
    t = model.targets([gt], [torch.zeros(len(gt), dtype=torch.long)])
    labels, matched, tied = _generate_label(anchors.reshape(-1, 7).numpy(), gt.double().numpy(), 0.6, 0.45)
    same = (t.labels[0].numpy() == labels) & (t.matched_gt[0].numpy() == matched)
    assert same[~tied].all() and (labels == 1).sum() >= len(gt) > 0


def test_an_imported_stage1_checkpoint_gives_the_reference_boxes_and_ap(tmp_path, monkeypatch, no_noise):  # noqa: F811
    path, hypes = _edited_yaml(tmp_path, GENCOMM / "stage1/m1_att.yaml", CROP1)
    _write_frame(tmp_path / "data", None)
    sd = _checkpoint(hypes, seed=11)
    cfg, model, batch = _import(tmp_path, path, sd, tmp_path / "data")
    assert cfg.model["anchors"]["margin"] == [0.4, 0.4] and batch.num_agents == 3
    assert batch.agent_ids[int(batch.ego_index[0])] == 4279
    _compare(model, hypes, batch, sd, CROP1, monkeypatch, matched_at=0.3)


def test_an_imported_stage2_checkpoint_gives_the_reference_ego_boxes_and_ap(tmp_path, monkeypatch, no_noise):  # noqa: F811
    pytest.importorskip("spconv")
    scenario = _write_frame(tmp_path / "data", None)
    table = tmp_path / "assignment.json"
    table.write_text(json.dumps({scenario: ASSIGNMENT}))
    path, hypes = _edited_yaml(tmp_path, GENCOMM / "stage2/m1m3_att.yaml", CROP2, assignment=table)
    sd = _checkpoint(hypes, seed=12)
    cfg, model, batch = _import(tmp_path, path, sd, tmp_path / "data")
    assert cfg.data.ego_types == ["m1"] and cfg.stage.new_types == ["m3"]
    mapping = hypes["heter"]["mapping_dict"]
    ego = int(reference_ego(ASSIGNMENT, hypes["heter"]["ego_modality"], mapping))
    assert ego == 9000 and batch.agent_ids[int(batch.ego_index[0])] == ego
    assert batch.agent_types == ["m1", "m3", "m3"]  # the ego, then 4279 and 9001 (m4, m3 -> m3)
    _compare(model, hypes, batch, sd, CROP2, monkeypatch, matched_at=0.3)
