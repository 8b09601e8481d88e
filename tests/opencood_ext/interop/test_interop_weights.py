"""Reference (HEAL / GenComm) state_dict layout <-> ours (opencood_ext.interop.weights).

Reference key names are written out by hand from the public modules
(pillar_vfe.py, sparse_backbone_3d.py, base_bev_backbone_resnet.py + resblock.py,
heter_model_baseline*.py, downsample_conv.py, message_extractor_v2.py). A run folder of the
reference's heter_model_baseline (BaseBEVBackbone, DownsampleConv) imports and evaluates; GenComm's
own modules: tests/opencood_ext/interop/test_interop_gencomm.py."""
import copy
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.interop.runs import load_any_run
from opencood_ext.interop.weights import (LAYOUTS, WeightImportError, export_reference_state, import_reference_state,
                                          read_reference_checkpoint)
from opencood_ext.models.backbone import DownsampleConv
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.training.checkpoint import load_model_state
from opencood_ext.data.synthetic import SyntheticReader
import tiny_runs
from tiny_runs import TINY, tiny_dataset

ROOT = Path(__file__).resolve().parents[3]
ASSETS = Path(__file__).parents[2] / "assets" / "interop"
sys.path.insert(0, str(ROOT / "tools"))

import import_weights  # noqa: E402
import inference  # noqa: E402

torch.set_num_threads(1)
RANGE = tuple(TINY["data"]["lidar_range"])
BACKBONE = {**tiny_runs.BACKBONE, "layer_nums": [2, 1]}  # level 0 also has a block without a shortcut conv
PP = {**tiny_runs.PP, "backbone": BACKBONE}
# the reference SECOND (VoxelBackBone8x) layout: widths 16, 32, 64, 64 with 1, 2, 2, 2 SubM blocks
SECOND = {"encoder": {"type": "second", "voxel_size": [0.4, 0.4, 0.125], "channels": [16, 32, 64, 64],
                      "blocks": [1, 2, 2, 2], "out_z_channels": 8},
          "backbone": {**BACKBONE, "upsample_strides": [4, 8]}, "shrink_channels": 8}
BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def bn(prefix):
    return [f"{prefix}.{p}" for p in BN]


PP_REF = ["encoder_m1.pillar_vfe.pfn_layers.0.linear.weight", *bn("encoder_m1.pillar_vfe.pfn_layers.0.norm")]
SECOND_REF = ["encoder_m3.spconv_block.conv_input.0.weight", *bn("encoder_m3.spconv_block.conv_input.1"),
              "encoder_m3.spconv_block.conv1.0.0.weight", *bn("encoder_m3.spconv_block.conv1.0.1")]
for _level in (2, 3, 4):
    for _block in range(3):
        SECOND_REF += [f"encoder_m3.spconv_block.conv{_level}.{_block}.0.weight",
                       *bn(f"encoder_m3.spconv_block.conv{_level}.{_block}.1")]
SECOND_REF += ["encoder_m3.spconv_block.conv_out.0.weight", *bn("encoder_m3.spconv_block.conv_out.1")]
RESNET_REF = []
for _layer, _blocks in ((0, 2), (1, 1)):
    for _b in range(_blocks):
        p = f"backbone_m1.resnet.layer{_layer}.{_b}"
        RESNET_REF += [f"{p}.conv1.weight", *bn(f"{p}.bn1"), f"{p}.conv2.weight", *bn(f"{p}.bn2")]
    RESNET_REF += [f"backbone_m1.resnet.layer{_layer}.0.downsample.0.weight",
                   *bn(f"backbone_m1.resnet.layer{_layer}.0.downsample.1")]
RESNET_REF += ["backbone_m1.deblocks.0.0.weight", *bn("backbone_m1.deblocks.0.1"),
               "backbone_m1.deblocks.1.0.weight", *bn("backbone_m1.deblocks.1.1")]
HEAD_REF = [f"{h}_head.{p}" for h in ("cls", "reg", "dir") for p in ("weight", "bias")]
# GenComm reference modules our structure does not match
GENCOMM_ONLY_REF = ["shrinker_m1.layers.0.double_conv.0.weight", "shrinker_m1.layers.0.double_conv.0.bias",
                    "shrinker_m1.layers.0.double_conv.2.weight", "shrinker_m1.layers.0.double_conv.2.bias",
                    "message_extractor_m1.bev_extractor.offset1.weight",
                    "message_extractor_m1.bev_extractor.dcn1.weight",
                    "message_extractor_m1.bev_extractor.dcn1.bias",
                    "message_extractor_m1.bev_extractor.fuse.0.weight"]


def _randomise(model, seed):
    """Random weights AND BatchNorm statistics, so a misplaced tensor shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.is_floating_point():
                t.copy_(torch.rand(t.shape, generator=g) + (0.5 if name.endswith("running_var") else -0.5))
    return model


def _model(types=None, seed=0):
    return _randomise(CooperativeDetector(types or {"m1": PP, "m3": SECOND}, RANGE,
                                          link={"type": "full_feature"}), seed).eval()


def _batch(model):
    cfg = DataConfig(lidar_range=RANGE, agent_types={t: AgentTypeData(lidar_beams=64) for t in model.encoders},
                     augment=AugmentConfig(enabled=False), modality="cycle:m1,m3")
    ds = CooperativeDataset(SyntheticReader(1, types=("m1", "m3", "m1")), cfg, model.voxel_sizes(), train=False,
                            cooperation="all")
    return collate_samples([ds[0]])


def test_exported_keys_are_the_public_reference_names():
    ref, skipped = export_reference_state(_model(), partial=True)
    assert sorted(k for k in ref if k.startswith("encoder_m1.")) == sorted(PP_REF)
    assert sorted(k for k in ref if k.startswith("encoder_m3.")) == sorted(SECOND_REF)
    assert sorted(k for k in ref if k.startswith("backbone_m1.")) == sorted(RESNET_REF)
    assert sorted(k for k in ref if k.endswith(("head.weight", "head.bias"))) == sorted(HEAD_REF)
    assert skipped == ["encoders.m1.shrink", "encoders.m3.shrink"]
    with pytest.raises(WeightImportError, match=r"encoders.m1.shrink \(ours: 3x3 conv.*DownsampleConv"):
        export_reference_state(_model())


def test_round_trip_ours_reference_ours_is_bit_identical_with_identical_output():
    a = _model(seed=1)
    ref, _ = export_reference_state(a, partial=True)
    b = copy.deepcopy(a)
    _randomise(b, seed=2)
    mapping = import_reference_state(ref, b, partial=True)
    assert mapping.unused == [] and set(mapping.unmatched) == {"encoders.m1.shrink", "encoders.m3.shrink"}
    shrinks = {k: v for k, v in a.state_dict().items() if ".shrink." in k}
    b.load_state_dict({**mapping.state, **shrinks})
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    batch = _batch(a)
    with torch.no_grad():
        out_a, out_b = a(batch).head, b(batch).head
    for x, y in ((out_a.cls, out_b.cls), (out_a.reg, out_b.reg), (out_a.dir, out_b.dir)):
        assert torch.equal(x, y)


def test_head_regression_follows_the_reference_hwl_order():
    model = _model({"m1": PP})
    ref, _ = export_reference_state(model, partial=True)
    x = torch.randn(1, 8, 5, 5)
    ours = model.head(x).reg
    theirs = F.conv2d(x, ref["reg_head.weight"], ref["reg_head.bias"])
    for k in range(2):  # per anchor: x y z h w l yaw (reference) vs x y z l w h yaw (ours)
        for j_ref, j_ours in ((0, 0), (1, 1), (2, 2), (3, 5), (4, 4), (5, 3), (6, 6)):
            assert torch.equal(theirs[:, 7 * k + j_ref], ours[:, 7 * k + j_ours])
    assert torch.equal(F.conv2d(x, ref["cls_head.weight"], ref["cls_head.bias"]), model.head(x).cls)


def test_stride_one_upsample_is_the_reference_transposed_conv():
    model = _model({"m1": PP})
    ref, _ = export_reference_state(model, partial=True)
    x = torch.randn(1, 8, 6, 6)
    ours = model.encoders["m1"].backbone.ups[0][0](x)
    torch.testing.assert_close(F.conv_transpose2d(x, ref["backbone_m1.deblocks.0.0.weight"]), ours)
    assert ref["backbone_m1.deblocks.0.0.weight"].shape == (8, 8, 1, 1)


def test_pillar_net_is_the_reference_computation_on_full_pillars():
    model = _model({"m1": PP})
    ref, _ = export_reference_state(model, partial=True)
    pfn = model.encoders["m1"].encoder.pfn
    v, p = 6, 5
    voxels = torch.randn(v, p, 4)
    coords = torch.tensor([[0, 0, y, x] for y, x in ((1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12))])
    num = torch.full((v,), p)
    feats = pfn.augment(voxels, num, coords)  # x y z i, minus the pillar mean, minus the pillar centre
    w = ref["encoder_m1.pillar_vfe.pfn_layers.0.linear.weight"]
    norm = {k.rsplit(".", 1)[1]: t for k, t in ref.items() if ".norm." in k}
    h = F.batch_norm((feats @ w.T).reshape(v * p, -1), norm["running_mean"], norm["running_var"],
                     norm["weight"], norm["bias"], training=False, eps=1e-3).relu()
    torch.testing.assert_close(pfn(voxels, num, coords), h.reshape(v, p, -1).amax(dim=1))


def test_spconv1_weight_layout_is_permuted():
    model = _model()
    ref, _ = export_reference_state(model, partial=True)
    key = "encoder_m3.spconv_block.conv2.0.0.weight"  # (out, k, k, k, in) in spconv 2
    ref[key] = ref[key].permute(1, 2, 3, 4, 0).contiguous()  # (k, k, k, in, out) as spconv 1 saved it
    mapping = import_reference_state(ref, _model(seed=5), partial=True)
    assert torch.equal(mapping.state["encoders.m3.encoder.stages.1.0.0.weight"],
                       model.state_dict()["encoders.m3.encoder.stages.1.0.0.weight"])


def test_gencomm_layout_is_refused_naming_the_keys():
    model = _model({"m1": PP})
    ref, _ = export_reference_state(model, partial=True)
    ref.update({k: torch.zeros(1) for k in GENCOMM_ONLY_REF})
    with pytest.raises(WeightImportError) as err:
        import_reference_state(ref, model)
    msg = str(err.value)
    assert "not mapped: encoders.m1.shrink: ShrinkConv has no reference layout" in msg
    assert "shrinker_m1.* (4 keys, e.g. shrinker_m1.layers.0.double_conv.0.weight): DownsampleConv" in msg
    assert "message_extractor_m1.* (4 keys" in msg and "MessageExtractorv2" in msg
    # GenComm's per-type backbone is BaseBEVBackbone: its keys are not ResNetBEVBackbone's
    based = {k.replace("resnet.layer0.0.conv1", "blocks.0.1"): v for k, v in ref.items()}
    mapping = import_reference_state(based, model, partial=True)
    assert "backbone_m1.resnet.layer0.0.conv1.weight" in mapping.unmatched["encoders.m1.backbone"]
    assert "encoders.m1.encoder" in mapping.matched and "head" in mapping.matched
    wrong = dict(ref, **{"cls_head.weight": torch.zeros(4, 8, 1, 1)})
    assert "shape (4, 8, 1, 1)" in import_reference_state(wrong, model, partial=True).unmatched["head"]


def test_read_reference_checkpoint(tmp_path):
    t = torch.arange(3.0)
    torch.save({"state_dict": {"module.cls_head.bias": t}}, tmp_path / "a.pth")
    assert torch.equal(read_reference_checkpoint(tmp_path / "a.pth")["cls_head.bias"], t)
    torch.save({"epoch": 3}, tmp_path / "b.pth")
    with pytest.raises(WeightImportError, match="expected a state_dict"):
        read_reference_checkpoint(tmp_path / "b.pth")
    with pytest.raises(WeightImportError, match="not found"):
        read_reference_checkpoint(tmp_path / "missing.pth")


def _reference_run(tmp_path, data):
    """A reference run folder: its hypes config.yaml and a net_epoch state_dict of a random model."""
    run = tmp_path / "reference_run"
    run.mkdir()
    text = (ASSETS / "saved_run_config_tiny.yaml").read_text().replace("ROOT", str(data))
    (run / "config.yaml").write_text(text)
    from opencood_ext.interop.hypes import convert_hypes_file
    original = _randomise(CooperativeDetector(**_model_args(convert_hypes_file(run / "config.yaml"))), 3).eval()
    ref, _ = export_reference_state(original)
    torch.save(ref, run / "net_epoch_bestval_at1.pth")
    torch.save({k: v * 0 for k, v in ref.items()}, run / "net_epoch1.pth")  # not the best: must not be picked
    return run, original


def _model_args(conv):
    cfg = conv.experiment()
    return {**cfg.model, "lidar_range": list(cfg.data.lidar_range)}


def test_reference_run_folder_imports_and_evaluates(tmp_path, capsys):
    data = tiny_dataset(tmp_path / "data")
    run, original = _reference_run(tmp_path, data)
    cfg, model = load_any_run(run, echo=False)
    for k, v in original.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    out = tmp_path / "imported"
    assert import_weights.main([str(run), "-o", str(out)]) == 0
    assert "mapped: encoders.m1.encoder" in capsys.readouterr().out
    again = CooperativeDetector(**{**cfg.model, "lidar_range": list(cfg.data.lidar_range)})
    load_model_state(again, out / "checkpoints" / "best.pth")
    for k, v in original.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k
    # the converted config runs protocol: reference, whose post-processing drops this random model's
    # oversized boxes; the native rules keep predictions to compare
    native = ["--set", "protocol=native"]
    assert inference.main(["--model_dir", str(out), "--max_frames", "2", "--plot_every", "0", *native]) == 0
    assert inference.main(["--model_dir", str(run), "--max_frames", "2", "--plot_every", "0", *native]) == 0
    printed = capsys.readouterr().out
    assert printed.count("AP@0.5") == 2
    ours, theirs = (json.loads((d / "eval_intermediate.json").read_text()) for d in (out, run))
    assert ours["ap"] == theirs["ap"] and ours["num_pred"] == theirs["num_pred"] > 0
    assert ours["frames"] == theirs["frames"] == 2


def test_reference_run_folder_with_an_unmatched_module_is_refused(tmp_path, monkeypatch, capsys):
    data = tiny_dataset(tmp_path / "data")
    run, _ = _reference_run(tmp_path, data)
    monkeypatch.delitem(LAYOUTS, DownsampleConv)  # as if our shrink header did not match the reference's
    assert inference.main(["--model_dir", str(run), "--max_frames", "1"]) == 2
    err = capsys.readouterr().err
    assert "net_epoch_bestval_at1.pth" in err and "encoders.m1.shrink: DownsampleConv has no reference layout" in err
    assert "shrinker_m1.* (4 keys, e.g. shrinker_m1.layers.0.double_conv.0.weight)" in err
    assert import_weights.main([str(run / "net_epoch_bestval_at1.pth"), "--config", str(run / "config.yaml"),
                                "-o", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()
    shutil.rmtree(run)
