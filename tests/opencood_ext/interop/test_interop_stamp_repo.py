"""STAMP's own repository (taco-group/STAMP ``collab_w_adapter``): its yamls convert and build, and a
checkpoint in its key layout imports and computes what STAMP computes.

STAMP's model holds, per agent type ``m``, a whole model (``encoder_m``, ``backbone_m``, ``aligner_m``,
``pyramid_backbone_m``, ``shrink_conv_m``, ``cls/reg/dir_head_m``) and an AdapterConvNext adapter /
reverter (``adapter_m.adapter``, ``reverter_m.reverter``). Read from its ``forward`` and
``forward_adapter_and_reverter`` and its inference's ``output_dict[agent_modality_list[0]]``: for an
ego of type E, stage ``infer``, an E agent's feature is fused as it is, another type s's as
``reverter_E(adapter_s(f))`` (in the sender's frame), by E's pyramid, shrink_conv and heads; the
adapter stages with outputs fuse every agent's ``reverter_E(adapter_E(f))``, the ego's included.

State dicts are written here in STAMP's key layout (random weights, BatchNorm statistics random:
tests/opencood_ext/models/test_reference_e2e.py's ``_checkpoint``; the pyramid's from tests/opencood_ext/models/test_pyramid_fusion.py's
``heal_state``, renamed per type) and imported with the weight importer; the maps are compared with a
functional restatement of that forward (below, with reference_forward's PillarVFE / scatter and
test_pyramid_fusion's restated HEAL pyramid levels and fusion) on the real V2XSet fixture frame.
"""
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import opencood_ext.methods  # noqa: F401  (registers the stamp_collab link)
import reference_forward as ref
from opencood_ext.experiment import build_model
from opencood_ext.interop import HypesError, convert_hypes_file
from opencood_ext.interop.weights import import_reference_state
from opencood_ext.models.detector import CooperativeDetector
from reference_keys import bn, pillar_vfe
from test_pyramid_fusion import FUSION, _bn_eval, _heal_levels, _heal_weighted_fuse, heal_state, heal_upsample_shrink
import test_reference_e2e as e2e
from test_reference_e2e import RANGE, VOXEL, _batch, _checkpoint

torch.set_num_threads(1)
STAMP = Path(__file__).parents[2] / "assets" / "hypes" / "STAMP" / "opencood" / "hypes_yaml"
ADAPTER_STAGE = STAMP / "opv2v/object_detection/local_adapter/convnext/m4/config.yaml"
INFER = STAMP / "v2v4real/MoreModality/OURS_4Agents_Heter_Simple/final_infer/convnext_crop/m4/config.yaml"
GENCOMM_INFER = (STAMP.parents[2] / "GenComm/opencood/hypes_yaml/dairv2x/GenComm_yamls/baselines/stage2/STAMP"
                 / "m1m3_att_infer.yaml")
C = 8  # the agents' feature width (test_pyramid_fusion's heal_state is built for it)
HEAD_IN = 16  # FUSION's shrink width
HIDDEN, BLOCKS, KERNEL = 16, 2, 7
PARTS = ("pyramid_backbone", "shrink_conv", "cls_head", "reg_head", "dir_head")


# ---------------------------------------------------------------- the yamls
def test_adapter_stage_yaml_converts_to_the_ego_types_collaboration():
    """STAMP's OPV2V detection adapter stage (m0 protocol, m4 new, stage train_adapter_w_output): m4's own
    pyramid and heads read every agent's m4 -> protocol -> m4 round trip."""
    conv = convert_hypes_file(ADAPTER_STAGE)
    model = conv.config["model"]
    assert (model["fusion"], model["fusion_op"]) == ("pyramid", "pyramid")
    assert model["link"] == {"type": "stamp_collab", "ego": "m4", "hidden_channels": 64, "blocks": 3,
                             "kernel_size": 7, "cycle_own": True}
    assert conv.config["data"]["modality"] == "all:m4"  # its mapping_dict maps every agent to m4
    built = build_model(conv.experiment())
    assert sorted(built.link.adapter) == ["m4"] and sorted(built.link.reverter) == ["m4"]
    assert built.channels == 64 and built.fuse.out_channels == 256 and built.head.cls.in_channels == 256
    # AdapterConvNext at dim 64, 3 blocks, without its never-applied 3x3 smoothing conv
    block = 49 * 64 + 64 + 2 * 64 + 64 * 256 + 256 + 256 * 64 + 64 + 64
    assert sum(p.numel() for p in built.link.adapter["m4"].parameters()) == 2 * (64 * 64 + 64) + 3 * block


def _infer_text(dataset="v2v4real", features_in=64):
    text = INFER.read_text()
    return text.replace("dataset: 'v2v4real'", f"dataset: '{dataset}'").replace(
        "num_features_in: 64", f"num_features_in: {features_in}")


def test_final_inference_yaml_is_refused_for_its_dataset_and_second_input_and_builds_without_them(tmp_path):
    """The final collaboration (stage infer, m2 SECOND + m4 PointPillars, ego m4) is V2V4Real's, which has
    no reader here, and states SECOND's input width 64 (the reference's conv_input would then not take
    MeanVFE's 4 features): both refused by key. With those two keys changed, it builds m4's model:
    m2's adapter and m4's reverter, m4's pyramid and heads, m4 on every ego."""
    with pytest.raises(HypesError) as err:
        convert_hypes_file(INFER)
    assert "key 'fusion.dataset'" in str(err.value) and "spconv.num_features_in'" in str(err.value)
    path = tmp_path / "infer.yaml"
    path.write_text(_infer_text("opv2v", 4))
    conv = convert_hypes_file(path)
    assert conv.config["model"]["link"]["ego"] == "m4" and not conv.config["model"]["link"]["cycle_own"]
    assert conv.config["data"]["modality"] == "cycle:m4,m2"
    built = build_model(conv.experiment())
    assert sorted(built.link.adapter) == ["m2"] and sorted(built.link.reverter) == ["m4"]
    assert built.encoders["m2"].out_channels == built.encoders["m4"].out_channels == 64


# ---------------------------------------------------------------- a checkpoint in STAMP's layout
def _stack():
    return {"encoder": {"type": "pointpillars", "voxel_size": list(VOXEL), "num_filters": [C]},
            "backbone": {"type": "resnet_bev", "layer_nums": [1], "layer_strides": [2], "num_filters": [C],
                         "upsample_strides": [], "num_upsample_filters": [], "norm_eps": 1e-5},
            "shrink": {"type": "none"}}


def _model(types, ego, cycle=False):
    link = {"type": "stamp_collab", "ego": ego, "hidden_channels": HIDDEN, "blocks": BLOCKS, "kernel_size": KERNEL,
            "cycle_own": cycle}
    return CooperativeDetector({t: _stack() for t in types}, RANGE, fusion="pyramid", fusion_op="pyramid",
                               fusion_args=FUSION, link=link, protocol="reference").eval()


def _adapter_shapes(p, C=C, HIDDEN=HIDDEN, BLOCKS=BLOCKS, KERNEL=KERNEL):
    """AdapterConvNext below ``p`` on ``C`` channels: channel_convert1, ConvNeXt blocks conv.model.<k>,
    channel_convert2, and the 3x3 smoothing conv it builds and never applies."""
    shapes = {f"{p}.channel_convert1.weight": (HIDDEN, C, 1, 1), f"{p}.channel_convert1.bias": (HIDDEN,),
              f"{p}.channel_convert2.weight": (C, HIDDEN, 1, 1), f"{p}.channel_convert2.bias": (C,),
              f"{p}.smoothing.weight": (C, C, 3, 3), f"{p}.smoothing.bias": (C,)}
    for k in range(BLOCKS):
        b = f"{p}.conv.model.{k}"
        shapes.update({f"{b}.dwconv.weight": (HIDDEN, 1, KERNEL, KERNEL), f"{b}.dwconv.bias": (HIDDEN,),
                       f"{b}.norm.weight": (HIDDEN,), f"{b}.norm.bias": (HIDDEN,),
                       f"{b}.pwconv1.weight": (4 * HIDDEN, HIDDEN), f"{b}.pwconv1.bias": (4 * HIDDEN,),
                       f"{b}.pwconv2.weight": (HIDDEN, 4 * HIDDEN), f"{b}.pwconv2.bias": (HIDDEN,),
                       f"{b}.gamma": (HIDDEN,)})
    return shapes


def _stamp_state(types, seed, c=C, fusion=FUSION, head_in=HEAD_IN, blocks=1, adapters=True):
    """Every key of STAMP's model for ``types``: each type's encoder, ResNet backbone (``blocks`` BasicBlocks,
    the first with stride 2), adapter, reverter, pyramid, shrink_conv and heads."""
    shapes = {}
    for t in types:
        shapes.update(pillar_vfe(f"encoder_{t}", 10, c))
        for j in range(blocks):
            bb = f"backbone_{t}.resnet.layer0.{j}"
            shapes.update({f"{bb}.conv1.weight": (c, c, 3, 3), **bn(f"{bb}.bn1", c), f"{bb}.conv2.weight": (c, c, 3, 3),
                           **bn(f"{bb}.bn2", c)})
        shapes.update({f"backbone_{t}.resnet.layer0.0.downsample.0.weight": (c, c, 1, 1),
                       **bn(f"backbone_{t}.resnet.layer0.0.downsample.1", c)})
        if adapters:
            shapes.update({**_adapter_shapes(f"adapter_{t}.adapter", c),
                           **_adapter_shapes(f"reverter_{t}.reverter", c)})
    sd = _checkpoint(shapes, seed)
    for i, t in enumerate(types):
        for k, v in heal_state(seed + 1 + i, fusion, cin=c, head_in=head_in).items():
            head, rest = k.split(".", 1)
            sd[f"{head}_{t}.{rest}"] = v
    return sd


def _resnet(sd, p, x):
    """HEAL's ResNetBEVBackbone with one level of one BasicBlock (stride 2, no deblocks): its output."""
    b = f"{p}.resnet.layer0.0."
    y = F.relu(_bn_eval(F.conv2d(x, sd[b + "conv1.weight"], stride=2, padding=1), sd, b + "bn1.", 1e-5))
    y = _bn_eval(F.conv2d(y, sd[b + "conv2.weight"], padding=1), sd, b + "bn2.", 1e-5)
    return F.relu(y + _bn_eval(F.conv2d(x, sd[b + "downsample.0.weight"], stride=2), sd, b + "downsample.1.", 1e-5))


def _adapter(sd, p, x):
    """AdapterConvNext.forward at feature ratio 1 (its bilinear resize by 1 is the identity)."""
    x = F.conv2d(x, sd[f"{p}.channel_convert1.weight"], sd[f"{p}.channel_convert1.bias"])
    for k in range(BLOCKS):
        b = f"{p}.conv.model.{k}"
        y = F.conv2d(x, sd[f"{b}.dwconv.weight"], sd[f"{b}.dwconv.bias"], padding=KERNEL // 2, groups=HIDDEN)
        y = F.layer_norm(y.permute(0, 2, 3, 1), (HIDDEN,), sd[f"{b}.norm.weight"], sd[f"{b}.norm.bias"], 1e-6)
        y = F.linear(F.gelu(F.linear(y, sd[f"{b}.pwconv1.weight"], sd[f"{b}.pwconv1.bias"])),
                     sd[f"{b}.pwconv2.weight"], sd[f"{b}.pwconv2.bias"])
        x = x + (sd[f"{b}.gamma"] * y).permute(0, 3, 1, 2)
    return F.conv2d(x, sd[f"{p}.channel_convert2.weight"], sd[f"{p}.channel_convert2.bias"])


def _affine(T_world_from_agent):
    """normalize_pairwise_tfm's row of the ego (row 0): T_{agent <- ego}, its BEV part normalised by the range."""
    return ref.ego_row_affine(T_world_from_agent, RANGE)


def _stamp_forward(sd, batch, ego, cycle):
    """collab_w_adapter.forward's output of type ``ego`` for the batch's one sample (ego row first)."""
    by_type = {}
    nx, ny = round((RANGE[3] - RANGE[0]) / VOXEL[0]), round((RANGE[4] - RANGE[1]) / VOXEL[1])
    for t, inp in batch.inputs.items():
        x = ref.scatter(ref.pillar_vfe(sd, f"encoder_{t}", inp.voxels, inp.num_points, inp.coords, VOXEL, RANGE),
                        inp.coords, inp.num_agents, nx, ny)
        by_type[t] = _resnet(sd, f"backbone_{t}", x)
    e = int(batch.ego_index[0])
    order = [e] + [a for a in range(batch.num_agents) if a != e]
    rows = []
    for a in order:
        t = batch.agent_types[a]
        f = by_type[t][int((batch.type_index[t] == a).nonzero()[0, 0])][None]
        if cycle:  # the adapter stages: cur_feature_dict[E][E] = reverter_E(adapter_E(f))
            f = _adapter(sd, f"reverter_{ego}.reverter", _adapter(sd, f"adapter_{ego}.adapter", f))
        elif t != ego:  # cur_feature_dict[E][s] = reverter_E(adapter_s(f_s)); an E agent's as it is
            f = _adapter(sd, f"reverter_{ego}.reverter", _adapter(sd, f"adapter_{t}.adapter", f))
        rows.append(f)
    return _stamp_detect(sd, torch.cat(rows), batch, order, ego)


def _stamp_detect(sd, x, batch, order, ego):
    """Type ``ego``'s PyramidFusion, shrink_conv and heads on the rows ``x`` (agents ``order``, ego first)."""
    own = {p + k[len(f"{p}_{ego}"):]: v for k, v in sd.items() for p in PARTS if k.startswith(f"{p}_{ego}.")}
    affine = _affine(batch.T_world_from_agent[order])
    fused = []
    for i, f in enumerate(_heal_levels(x, own)):
        o = F.conv2d(f, own[f"pyramid_backbone.single_head_{i}.weight"], own[f"pyramid_backbone.single_head_{i}.bias"])
        fused.append(_heal_weighted_fuse(f, torch.sigmoid(o) + 1e-4, [len(order)], affine))
    y = heal_upsample_shrink(fused, own)
    return tuple(F.conv2d(y, own[f"{h}_head.weight"], own[f"{h}_head.bias"]) for h in ("cls", "reg", "dir"))


def _import(model, sd):
    mapping = import_reference_state(sd, model)
    model.load_state_dict(mapping.state)
    assert not mapping.unused and not mapping.unmatched  # every key taken, or dropped with its reason
    return mapping


def _errors(model, sd, batch, ego, cycle, forward=None):
    """Max |ours - STAMP's| / max |STAMP's| per map (cls, reg, dir); ``forward`` (sd, batch) -> STAMP's maps,
    by default :func:`_stamp_forward`'s."""
    with torch.no_grad():
        ours = model(batch).head
        want = forward(sd, batch) if forward else _stamp_forward(sd, batch, ego, cycle)
    hwl = torch.tensor([a * 7 + j for a in range(ours.reg.shape[1] // 7) for j in (0, 1, 2, 5, 4, 3, 6)])
    errors = []
    for name, a, b in (("cls", ours.cls, want[0]), ("reg", ours.reg, want[1][:, hwl]), ("dir", ours.dir, want[2])):
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert float(b.abs().max()) > 1e-2, name  # a map that is not all but zero
        errors.append(float((a - b).abs().max() / b.abs().max()))
    return errors


def test_final_collaboration_checkpoint_imports_and_is_stamps_forward():
    """Ego m2; collaborators m4 (adapted, reverted into m2's space) and m2 (as it is)."""
    types = ["m2", "m4"]
    sd = _stamp_state(types, seed=5)
    model = _model(types, "m2")
    mapping = _import(model, sd)
    unread = {k for k in sd if k.startswith(tuple(f"{p}_m4." for p in PARTS))
              or k.startswith(("adapter_m2.", "reverter_m4.")) or ".smoothing." in k}
    assert set(mapping.dropped) == unread
    batch = _batch(types, "cycle:m2,m4")
    assert batch.agent_types[int(batch.ego_index[0])] == "m2" and sorted(batch.agent_types) == ["m2", "m2", "m4"]
    assert max(_errors(model, sd, batch, "m2", cycle=False)) < 1e-4
    with torch.no_grad():  # the messages as bytes, as gencomm-infer runs it: the same detections
        got, want = model.predict(batch).detections[0], model.decode(model(batch).head)[0]
    assert len(got.boxes) == len(want.boxes) > 0 and torch.equal(got.scores, want.scores)


def test_adapter_stage_checkpoint_imports_and_is_stamps_forward():
    """Every agent m4, each (the ego's included) through m4's adapter and reverter; the protocol m0's whole
    model is in the checkpoint: its stack is built (its loss's input), its fusion and heads dropped."""
    types = ["m0", "m4"]
    sd = {k: v for k, v in _stamp_state(types, seed=9).items() if not k.startswith(("adapter_m0.", "reverter_m0."))}
    model = _model(types, "m4", cycle=True)
    mapping = _import(model, sd)
    assert set(mapping.dropped) == {k for k in sd if k.startswith(tuple(f"{p}_m0." for p in PARTS))
                                    or ".smoothing." in k}
    batch = _batch(["m4"], "all:m4")
    assert max(_errors(model, sd, batch, "m4", cycle=True)) < 1e-4


def test_an_ego_of_another_type_is_refused_in_one_line():
    types = ["m2", "m4"]
    model = _model(types, "m2")
    batch = _batch(types, "cycle:m4,m2")
    with pytest.raises(ValueError, match=r"holds type m2's fusion and heads \(model.link.ego\); an ego of type m4"):
        model(batch)


# ---------------------------------------------------------------- the GenComm reference's STAMP inference
def _gencomm_infer_state(types, ego, seed):
    """heter_model_baseline_w_stamp_infer's keys: per type encoder, BaseBEVBackbone, shrinker, adapter and
    reverter (every type builds both); ONE head set, named after its ego_modality."""
    shapes = e2e._shapes(types, False)
    for t in types:
        shapes.update({**_adapter_shapes(f"adapter_{t}.adapter", e2e.C), **_adapter_shapes(f"reverter_{t}.reverter",
                                                                                              e2e.C)})
    sd = _checkpoint(shapes, seed)
    return {(f"{k.split('.')[0]}_{ego}.{k.split('.', 1)[1]}" if k.startswith(("cls_head.", "reg_head.", "dir_head."))
             else k): v for k, v in sd.items()}


def _gencomm_infer_forward(sd, batch, ego):
    """Its forward: each type's stack; every agent of another type than ego_modality (whichever agent is
    the ego) through its adapter and ego_modality's reverter; warp, AttFusion, the heads."""
    by_type = {}
    for t, inp in batch.inputs.items():
        x = ref.scatter(ref.pillar_vfe(sd, f"encoder_{t}", inp.voxels, inp.num_points, inp.coords, VOXEL, RANGE),
                        inp.coords, inp.num_agents, *(round((RANGE[3 + i] - RANGE[i]) / VOXEL[i]) for i in (0, 1)))
        nums, strides, _, ups, _ = e2e.BACKBONES[t]
        by_type[t] = ref.downsample_conv(sd, f"shrinker_{t}", ref.base_bev(sd, f"backbone_{t}", x, nums, strides, ups),
                                         [2], [1])
    rows = []
    for a, t in enumerate(batch.agent_types):
        f = by_type[t][int((batch.type_index[t] == a).nonzero()[0, 0])][None]
        if t != ego:
            f = _adapter(sd, f"reverter_{ego}.reverter", _adapter(sd, f"adapter_{t}.adapter", f))
        rows.append(f)
    fused = ref.att_fusion(ref.warp_to_ego(torch.cat(rows), batch.T_world_from_agent, RANGE))[None]
    return tuple(F.conv2d(fused, sd[f"{h}_head_{ego}.weight"], sd[f"{h}_head_{ego}.bias"])
                 for h in ("cls", "reg", "dir"))


@pytest.mark.parametrize("modality", ["cycle:m1,m3", "cycle:m3,m1"], ids=["ego_m1", "ego_m3"])
def test_gencomm_reference_stamp_inference_is_its_forward(modality):
    """heter_model_baseline_w_stamp_infer (ego_modality m1, m3 adapted): its one fusion and head serve an
    ego of either type; an m3 ego's own feature goes through m3's adapter and m1's reverter too."""
    types = ["m1", "m3"]
    sd = _gencomm_infer_state(types, "m1", seed=3)
    link = {"type": "stamp_collab", "ego": "m1", "hidden_channels": HIDDEN, "blocks": BLOCKS, "kernel_size": KERNEL,
            "ego_of_any_type": True}
    model = e2e._model(types, link)
    mapping = _import(model, sd)
    assert set(mapping.dropped) == {k for k in sd if k.startswith(("adapter_m1.", "reverter_m3."))
                                    or ".smoothing." in k}
    batch = _batch(types, modality)
    assert batch.agent_types[0] == modality[6:8] and batch.ego_index.tolist() == [0]
    with torch.no_grad():
        ours = model(batch).head
        want = _gencomm_infer_forward(sd, batch, "m1")
    hwl = torch.tensor([a * 7 + j for a in range(ours.reg.shape[1] // 7) for j in (0, 1, 2, 5, 4, 3, 6)])
    for a, b in ((ours.cls, want[0]), (ours.reg, want[1][:, hwl]), (ours.dir, want[2])):
        assert a.shape == b.shape and float(b.abs().max()) > 1e-2
        assert float((a - b).abs().max() / b.abs().max()) < 1e-4


def test_gencomm_reference_stamp_inference_yaml_converts_without_missing_message(tmp_path):
    """The GenComm reference's DAIR-V2X m1m3_att_infer.yaml is refused for missing_message: True (random
    dropping of collaborators' cells at evaluation); without it, it builds m1's model serving any ego."""
    path = GENCOMM_INFER
    with pytest.raises(HypesError, match="key 'model.args.missing_message'"):
        convert_hypes_file(path)
    (tmp_path / "infer.yaml").write_text(path.read_text().replace("missing_message: True", "missing_message: False"))
    conv = convert_hypes_file(tmp_path / "infer.yaml")
    assert conv.config["model"]["link"] == {"type": "stamp_collab", "ego": "m1", "hidden_channels": 64, "blocks": 3,
                                            "kernel_size": 7, "ego_of_any_type": True}
    assert (conv.config["model"]["fusion_op"], conv.config["data"]["modality"]) == ("att", "cycle:m1,m3")


def test_import_weights_takes_a_stamp_checkpoint_at_the_yamls_widths(tmp_path, capsys):
    """tools/import_weights.py with the real adapter-stage yaml and a checkpoint of its full widths (m0 and m4:
    64-wide PointPillars, 3 residual blocks, [3, 5, 8] ResNeXt pyramids to 256, AdapterConvNext dim 64 x 3,
    m0 without adapters as STAMP builds it): every key mapped or dropped with its reason."""
    from opencood_ext.cli.import_weights import main

    heal = dict(FUSION, layer_nums=[3, 5, 8], num_filters=[64, 128, 256], num_upsample_filters=[128, 128, 128])
    sd = _stamp_state(["m0", "m4"], 2, c=64, fusion=heal, head_in=256, blocks=3, adapters=False)
    for part in ("adapter", "reverter"):
        sd.update(_checkpoint(_adapter_shapes(f"{part}_m4.{part}", 64, 64, 3, 7), 4))
    torch.save(sd, tmp_path / "net_epoch_bestval_at3.pth")
    assert main([str(tmp_path / "net_epoch_bestval_at3.pth"), "--config", str(ADAPTER_STAGE),
                 "-o", str(tmp_path / "run")]) == 0
    report = json.loads((tmp_path / "run" / "import_report.json").read_text())
    assert not report["unused_reference_keys"] and not report["not_mapped"]
    assert {"fuse", "head", "link.adapter.m4", "link.reverter.m4", "encoders.m0.encoder"} <= set(report["mapped"])
    dropped = set(report["dropped_unread_reference_keys"])
    assert dropped == {k for k in sd if k.startswith(tuple(f"{p}_m0." for p in PARTS)) or ".smoothing." in k}
    out = capsys.readouterr().out
    assert f"reference keys its forward never reads, dropped ({len(dropped)})" in out
    assert "pyramid_backbone_m0.resnet.* (" in out and "type m0's own fusion and heads: the reference runs them" in out
