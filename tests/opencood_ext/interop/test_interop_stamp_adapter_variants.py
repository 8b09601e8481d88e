"""STAMP's other adapter variants (taco-group/STAMP ``fuse_modules/adapter.py``): ``adapterconv`` (AdapterConv,
one 1x1 conv) and ``adapteratt`` (AdapterAtt: 1x1 conv, patch embedding, position table, pre-norm attention
blocks, LayerNorm, bilinear upsampling, 1x1 conv), opencood_ext/methods/stamp_adapters.py.

Beside tests/opencood_ext/interop/test_interop_stamp_repo.py (whose helpers build the rest of STAMP's collab_w_adapter checkpoint
and restate its pyramid, shrink_conv and heads): a state dict in STAMP's key layout with each variant imports
with every key used or dropped with its reason, and the maps equal a restatement of STAMP's forward. The
attention is restated with torch's own ``nn.MultiheadAttention`` (sequence-first, as STAMP calls it with
(n, N, dim)): its sequence is the rows passed together, so the restatement groups rows as STAMP's
``forward_adapter_and_reverter`` does: adapter_s on every agent of type s at once, the ego type's reverter on
each sending type's protocol features at once.
"""
import pytest
import torch
import torch.nn.functional as F

import opencood_ext.methods  # noqa: F401  (registers the stamp_collab link)
import reference_forward as ref
from opencood_ext.experiment import build_model
from opencood_ext.interop import HypesError, convert_hypes_file
from opencood_ext.methods.stamp_adapters import AttentionAdapter, build_adapter
from opencood_ext.models.detector import CooperativeDetector
from test_interop_stamp_repo import C, FUSION, PARTS, STAMP, _errors, _import, _infer_text, _resnet, _stack, \
    _stamp_detect, _stamp_state
from test_reference_e2e import RANGE, VOXEL, _batch, _checkpoint

torch.set_num_threads(1)
CONV_STAGE = STAMP / "opv2v/object_detection/local_adapter/conv/m4/config.yaml"
HIDDEN, DEPTH, HEADS = 16, 2, 4
GRID = (48, 96)  # the fixture range at 0.4 m pillars, after the backbone's stride 2


def _conv_shapes(p, c=C):
    return {f"{p}.conv.weight": (c, c, 1, 1), f"{p}.conv.bias": (c,)}


def _att_shapes(p, patch, c=C):
    """AdapterAtt below ``p``: its parameters (MultiheadAttention without biases) and the unused smoothing conv."""
    n = (GRID[0] // patch) * (GRID[1] // patch)
    shapes = {f"{p}.channel_convert1.weight": (HIDDEN, c, 1, 1), f"{p}.channel_convert1.bias": (HIDDEN,),
              f"{p}.channel_convert2.weight": (c, HIDDEN, 1, 1), f"{p}.channel_convert2.bias": (c,),
              f"{p}.smoothing.weight": (c, c, 3, 3), f"{p}.smoothing.bias": (c,),
              f"{p}.patch_embed.weight": (HIDDEN, HIDDEN, patch, patch), f"{p}.patch_embed.bias": (HIDDEN,),
              f"{p}.pos_embed": (1, n, HIDDEN), f"{p}.norm.weight": (HIDDEN,), f"{p}.norm.bias": (HIDDEN,)}
    for k in range(DEPTH):
        b = f"{p}.blocks.{k}"
        shapes.update({f"{b}.norm1.weight": (HIDDEN,), f"{b}.norm1.bias": (HIDDEN,), f"{b}.norm2.weight": (HIDDEN,),
                       f"{b}.norm2.bias": (HIDDEN,), f"{b}.attn.in_proj_weight": (3 * HIDDEN, HIDDEN),
                       f"{b}.attn.out_proj.weight": (HIDDEN, HIDDEN), f"{b}.mlp.0.weight": (4 * HIDDEN, HIDDEN),
                       f"{b}.mlp.0.bias": (4 * HIDDEN,), f"{b}.mlp.3.weight": (HIDDEN, 4 * HIDDEN),
                       f"{b}.mlp.3.bias": (HIDDEN,)})
    return shapes


def _conv(sd, p, x, patch=None):
    """AdapterConv.forward at ratio 1 (its resize by 1 and zero pad of 0 are the identity)."""
    return F.conv2d(x, sd[f"{p}.conv.weight"], sd[f"{p}.conv.bias"])


def _att(sd, p, x, patch):
    """AdapterAtt.forward at ratio 1 on the rows ``x`` (n, C, H, W) passed together."""
    y = F.conv2d(F.conv2d(x, sd[f"{p}.channel_convert1.weight"], sd[f"{p}.channel_convert1.bias"]),
                 sd[f"{p}.patch_embed.weight"], sd[f"{p}.patch_embed.bias"], stride=patch)
    n, d, h, w = y.shape
    t = y.flatten(2).transpose(1, 2) + sd[f"{p}.pos_embed"]
    for k in range(DEPTH):
        b = f"{p}.blocks.{k}"
        mha = torch.nn.MultiheadAttention(d, HEADS, bias=False).eval()  # sequence-first, as STAMP's AttBlock
        mha.load_state_dict({"in_proj_weight": sd[f"{b}.attn.in_proj_weight"],
                             "out_proj.weight": sd[f"{b}.attn.out_proj.weight"]})
        z = F.layer_norm(t, (d,), sd[f"{b}.norm1.weight"], sd[f"{b}.norm1.bias"])
        t = t + mha(z, z, z, need_weights=False)[0]
        z = F.layer_norm(t, (d,), sd[f"{b}.norm2.weight"], sd[f"{b}.norm2.bias"])
        t = t + F.linear(F.gelu(F.linear(z, sd[f"{b}.mlp.0.weight"], sd[f"{b}.mlp.0.bias"])),
                         sd[f"{b}.mlp.3.weight"], sd[f"{b}.mlp.3.bias"])
    t = F.layer_norm(t, (d,), sd[f"{p}.norm.weight"], sd[f"{p}.norm.bias"])
    y = F.interpolate(t.transpose(1, 2).reshape(n, d, h, w), scale_factor=patch, mode="bilinear",
                      align_corners=False)
    return F.conv2d(y, sd[f"{p}.channel_convert2.weight"], sd[f"{p}.channel_convert2.bias"])


VARIANTS = {"adapterconv": (_conv_shapes, _conv), "adapteratt": (_att_shapes, _att)}


def _forward(sd, batch, ego, variant, patch):
    """collab_w_adapter.forward (stage infer) of type ``ego``: each type's stack; adapter_s on all agents of
    type s together, reverter_ego on each type's protocol features together; an ego-type agent as it is."""
    adapt = VARIANTS[variant][1]
    by_type, rows = {}, {}
    nx, ny = round((RANGE[3] - RANGE[0]) / VOXEL[0]), round((RANGE[4] - RANGE[1]) / VOXEL[1])
    for t, inp in batch.inputs.items():
        x = ref.scatter(ref.pillar_vfe(sd, f"encoder_{t}", inp.voxels, inp.num_points, inp.coords, VOXEL, RANGE),
                        inp.coords, inp.num_agents, nx, ny)
        by_type[t] = _resnet(sd, f"backbone_{t}", x)
        members = batch.type_index[t].tolist()  # the agents of by_type[t]'s rows
        feats = by_type[t] if t == ego else adapt(sd, f"reverter_{ego}.reverter",
                                                  adapt(sd, f"adapter_{t}.adapter", by_type[t], patch), patch)
        rows.update({a: feats[i:i + 1] for i, a in enumerate(members)})
    e = int(batch.ego_index[0])
    order = [e] + [a for a in range(batch.num_agents) if a != e]
    return _stamp_detect(sd, torch.cat([rows[a] for a in order]), batch, order, ego)


def _state(variant, patch, seed):
    """STAMP's keys for types m2 (ego) and m4, every type with the variant's adapter and reverter."""
    types = ["m2", "m4"]
    sd = _stamp_state(types, seed, adapters=False)
    shapes = {}
    for t in types:
        for part in ("adapter", "reverter"):
            shapes.update(VARIANTS[variant][0](f"{part}_{t}.{part}", patch) if variant == "adapteratt"
                          else VARIANTS[variant][0](f"{part}_{t}.{part}"))
    sd.update(_checkpoint(shapes, seed + 7))
    g = torch.Generator().manual_seed(seed)
    for k in [k for k in sd if k.endswith("pos_embed")]:  # fan-in scaling would make the table ~0
        sd[k] = torch.randn(sd[k].shape, generator=g) * 0.5
    return sd


def _model(variant, patch):
    size = {"hidden_channels": HIDDEN, "blocks": DEPTH, "num_heads": HEADS, "patch_size": patch,
            "feature_shape": list(GRID)} if variant == "adapteratt" else {}
    link = {"type": "stamp_collab", "ego": "m2", "adapter": variant, **size}
    return CooperativeDetector({t: _stack() for t in ("m2", "m4")}, RANGE, fusion="pyramid", fusion_op="pyramid",
                               fusion_args=FUSION, link=link, protocol="reference").eval()


@pytest.mark.parametrize("variant,patch", [("adapterconv", 1), ("adapteratt", 1), ("adapteratt", 4)],
                         ids=["conv", "att_patch1", "att_patch4"])
def test_variant_checkpoint_imports_and_is_stamps_forward(variant, patch):
    """Ego m2, collaborators m4, m4 (two rows of the adapted type: the attention mixes them)."""
    sd = _state(variant, patch, seed=11)
    model = _model(variant, patch)
    mapping = _import(model, sd)
    assert set(mapping.dropped) == {k for k in sd if k.startswith(tuple(f"{p}_m4." for p in PARTS))
                                    or k.startswith(("adapter_m2.", "reverter_m4.")) or ".smoothing." in k}
    batch = _batch(["m2", "m4"], "cycle:m2,m4,m4")
    assert batch.agent_types == ["m2", "m4", "m4"] and batch.ego_index.tolist() == [0]
    assert max(_errors(model, sd, batch, "m2", False, lambda s, b: _forward(s, b, "m2", variant, patch))) < 1e-4


def test_attention_runs_across_the_rows_passed_together():
    """The restatement above would not tell a per-row attention from STAMP's: here they differ, and our
    module equals torch's sequence-first MultiheadAttention over the rows of one call."""
    sd = _state("adapteratt", 2, 5)
    model = _model("adapteratt", 2)
    _import(model, sd)
    ours = model.link.adapter["m4"]
    x = torch.randn(3, C, *GRID)
    with torch.no_grad():
        together, want = ours(x), _att(sd, "adapter_m4.adapter", x, 2)
        apart = torch.cat([ours(x[i:i + 1]) for i in range(3)])
    assert float((together - want).abs().max() / want.abs().max()) < 1e-5
    assert float((apart - together).abs().max() / together.abs().max()) > 1e-2


def test_conv_adapter_stage_yaml_converts_and_builds():
    """STAMP's OPV2V detection adapter stage with AdapterConv (m4 new against the protocol m0): m4's model,
    every agent through m4's 1x1-conv adapter and reverter (64 x 64 + 64 parameters each)."""
    conv = convert_hypes_file(CONV_STAGE)
    assert conv.config["model"]["link"] == {"type": "stamp_collab", "ego": "m4", "adapter": "adapterconv",
                                            "cycle_own": True}
    built = build_model(conv.experiment())
    assert [sum(p.numel() for p in m.parameters()) for m in (built.link.adapter["m4"], built.link.reverter["m4"])] \
        == [64 * 64 + 64] * 2


def test_attention_yaml_converts_for_inference_and_is_refused_for_the_adapter_stage(tmp_path):
    """STAMP's final collaboration yaml with AdapterAtt in place of AdapterConvNext (its OPV2V / SECOND-input
    variant, tests/opencood_ext/interop/test_interop_stamp_repo.py): the attention adapter and its sizes, the grid from
    in_feature_shape; the sizes of the ConvNeXt (num_of_blocks) dropped with a warning. STAMP's attention
    files train the adapter with outputs, where the ego's row is adapted with its collaborators': refused."""
    text = _infer_text("opv2v", 4).replace("core_method: adapterconvnext", "core_method: adapteratt").replace(
        "num_of_blocks: 3", "num_of_blocks: 3\n            depth: 2\n            num_heads: 8\n            patch_size: 2")
    (tmp_path / "att.yaml").write_text(text)
    conv = convert_hypes_file(tmp_path / "att.yaml")
    assert conv.config["model"]["link"] == {"type": "stamp_collab", "ego": "m4", "adapter": "adapteratt",
                                            "hidden_channels": 64, "blocks": 2, "num_heads": 8, "patch_size": 2,
                                            "feature_shape": [128, 256], "cycle_own": False}
    assert any("submodule_args.num_of_blocks': not read by this project: adapteratt" in w for w in conv.warnings())
    built = build_model(conv.experiment())
    assert isinstance(built.link.reverter["m4"], AttentionAdapter) and built.grid.shape == (128, 256)
    (tmp_path / "stage.yaml").write_text(text.replace("stage: infer", "stage: train_adapter_w_output"))
    with pytest.raises(HypesError, match=r"key 'model.args.stage': 'train_adapter_w_output' with adapteratt"):
        convert_hypes_file(tmp_path / "stage.yaml")


def test_link_refuses_sizes_its_variant_does_not_read():
    with pytest.raises(ValueError, match=r"\['kernel_size'\] are not arguments of the adapterconv adapter"):
        build_adapter("adapterconv", C, kernel_size=7)
    with pytest.raises(ValueError, match="model.link.feature_shape"):
        build_adapter("adapteratt", C)
    with pytest.raises(ValueError, match="adapteratt: its attention couples the rows"):
        CooperativeDetector({t: _stack() for t in ("m2", "m4")}, RANGE, fusion="pyramid",
                            fusion_op="pyramid", fusion_args=FUSION, protocol="reference",
                            link={"type": "stamp_collab", "ego": "m2", "adapter": "adapteratt",
                                  "feature_shape": list(GRID), "cycle_own": True})
