"""A GenComm-reference stage-1 checkpoint (heter_model_baseline_w_gencomm_stage1: PointPillars m1,
BaseBEVBackbone, DownsampleConv shrink header, MessageExtractorv2, the GenComm generator and the
Enhancer, shared heads) imports into the model the config importer builds from its hypes yaml, round
trips bit-identically, and tools/inference.py evaluates its run folder.

The checkpoint's keys are written out by hand from the public source (tests/helpers/reference_keys.py)."""
import copy
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gencomm  # noqa: F401  (registers the GenComm link and its layouts)
from opencood_ext.data.augment import AugmentConfig
from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.interop.hypes import convert_hypes_file
from opencood_ext.interop.runs import load_any_run
from opencood_ext.interop.weights import WeightImportError, export_reference_state, import_reference_state
from opencood_ext.models.detector import CooperativeDetector
from opencood_ext.training.checkpoint import load_model_state
from reference_keys import (base_bev, diffusion_unet, downsample_conv, enhancer, enhancer_unread, gencomm_schedule,
                            heads, message_extractor, pillar_vfe, random_state)
from opencood_ext.data.synthetic import SyntheticReader
from tiny_runs import tiny_dataset

ROOT = Path(__file__).resolve().parents[3]
ASSET = Path(__file__).parents[2] / "assets" / "interop" / "saved_run_gencomm_stage1_tiny.yaml"
sys.path.insert(0, str(ROOT / "tools"))

import import_weights  # noqa: E402
import inference  # noqa: E402
import train  # noqa: E402

torch.set_num_threads(1)


def stage_keys(types=("m1",)):
    """{key: shape} of what the reference saves for the tiny asset's model (widths 8, pillar net 10 -> 8,
    backbone levels 8 and 16 -> 8 + 8, shrink 16 -> 8 stride 2, UNet ch 8 x (1, 1), 2 blocks)."""
    shapes = {}
    for m in types:
        shapes.update({**pillar_vfe(f"encoder_{m}", 10, 8),
                       **base_bev(f"backbone_{m}", [(8, 8, 1, 1, 8), (8, 16, 1, 2, 8)]),
                       **downsample_conv(f"shrinker_{m}", [(16, 8, 3)]),
                       **message_extractor(f"message_extractor_{m}", 8)})
    shapes.update({**diffusion_unet("gencomm.denoiser", 8, (1, 1), 2, 10, 8),
                   **{k: tuple(v.shape) for k, v in gencomm_schedule("gencomm").items()},
                   **enhancer("enhancer", 8), **heads(8)})
    return shapes


def reference_checkpoint(seed, types=("m1",)):
    """A checkpoint as the reference writes it: every key above, the schedule buffers at their values."""
    schedule = gencomm_schedule("gencomm")
    return {**random_state({k: s for k, s in stage_keys(types).items() if k not in schedule}, seed), **schedule}


def _model_args(types=("m1",)):
    cfg = convert_hypes_file(ASSET).experiment()
    model = copy.deepcopy(cfg.model)
    model["agent_types"] = {t: copy.deepcopy(model["agent_types"]["m1"]) for t in types}
    return {**model, "lidar_range": list(cfg.data.lidar_range)}


def _randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.is_floating_point():
                t.copy_(torch.rand(t.shape, generator=g) * 0.6 - 0.3 + (0.8 if name.endswith("running_var") else 0))
    return model


def _batch(model):
    cfg = DataConfig(lidar_range=tuple(model.lidar_range), augment=AugmentConfig(enabled=False), modality="all:m1",
                     agent_types={"m1": AgentTypeData(lidar_beams=64)})
    ds = CooperativeDataset(SyntheticReader(1, types=("m1", "m1", "m1")), cfg, model.voxel_sizes(), train=False,
                            cooperation="all")
    return collate_samples([ds[0]])


def test_the_converted_model_saves_the_reference_keys_and_shapes():
    model = CooperativeDetector(**_model_args())
    ref, skipped = export_reference_state(model)
    want = {k: s for k, s in stage_keys().items() if k not in enhancer_unread(stage_keys())}
    assert skipped == [] and {k: tuple(v.shape) for k, v in ref.items()} == want
    for k, v in gencomm_schedule("gencomm").items():  # the schedule buffers, computed as the reference does
        torch.testing.assert_close(ref[k], v, rtol=1e-6, atol=0)


def test_train_cli_builds_the_reference_structure_from_the_hypes_yaml(tmp_path):
    """tools/train.py -y on the reference yaml trains the reference-structured model; its weights export to
    the keys the reference loads."""
    data = tiny_dataset(tmp_path / "data")
    hypes = tmp_path / "hypes.yaml"
    hypes.write_text(ASSET.read_text().replace("ROOT", str(data)))
    run = tmp_path / "run"
    assert train.main(["-y", str(hypes), "--model_dir", str(run), "--set", "train.max_steps_per_epoch=1",
                       "--set", "train.progress_bar=false", "--set", "train.val_every=0"]) == 0
    _, model = load_any_run(run, echo=False)
    ref, _ = export_reference_state(model)
    assert {k: tuple(v.shape) for k, v in ref.items()} == {
        k: s for k, s in stage_keys().items() if k not in enhancer_unread(stage_keys())}


def test_round_trip_ours_reference_ours_is_bit_identical_with_identical_output():
    a = _randomise(CooperativeDetector(**_model_args()), 1).eval()
    ref, _ = export_reference_state(a)
    b = _randomise(CooperativeDetector(**_model_args()), 2).eval()
    mapping = import_reference_state(ref, b)
    assert mapping.unmatched == {} and mapping.unused == [] and mapping.dropped == []
    b.load_state_dict(mapping.state)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    again, _ = export_reference_state(b)
    assert all(torch.equal(v, again[k]) for k, v in ref.items()) and set(again) == set(ref)
    batch = _batch(a)
    with torch.no_grad():
        torch.manual_seed(0)  # the generator draws its noise from the global generator
        out_a = a(batch).head
        torch.manual_seed(0)
        out_b = b(batch).head
    assert out_a.cls.abs().sum() > 0
    for x, y in ((out_a.cls, out_b.cls), (out_a.reg, out_b.reg), (out_a.dir, out_b.dir)):
        assert torch.equal(x, y)


def test_one_reference_generator_and_enhancer_serve_every_receiver_type():
    model = CooperativeDetector(**_model_args(("m1", "m2")))
    ckpt = reference_checkpoint(4, ("m1", "m2"))
    mapping = import_reference_state(ckpt, model)
    model.load_state_dict(mapping.state)
    link = model.link
    for k, v in link.safg["m1"].state_dict().items():
        assert torch.equal(v, link.safg["m2"].state_dict()[k])
    assert torch.equal(link.dme["m2"].deform.bias, ckpt["message_extractor_m2.bev_extractor.dcn1.bias"])
    export_reference_state(model)  # equal copies export as the one reference module
    with torch.no_grad():
        link.enhancer["m2"].reference.linear2.bias.add_(1.0)
    with pytest.raises(WeightImportError, match=r"link.enhancer.m1.reference.linear2.bias and "
                                                r"link.enhancer.m2.reference.linear2.bias both map to the reference's "
                                                r"single enhancer.block_1.mlp.linear2.0.bias"):
        export_reference_state(model)


def test_stage1_reference_run_imports_and_evaluates(tmp_path, capsys):
    data = tiny_dataset(tmp_path / "data")
    run = tmp_path / "gencomm_stage1_run"
    run.mkdir()
    (run / "config.yaml").write_text(ASSET.read_text().replace("ROOT", str(data)))
    ckpt = reference_checkpoint(3)
    torch.save(ckpt, run / "net_epoch_bestval_at1.pth")
    cfg, model = load_any_run(run, echo=False)
    link, stack = model.link, model.encoders["m1"]
    assert torch.equal(link.dme["m1"].se.fc1.weight, ckpt["message_extractor_m1.bev_extractor.attn.1.weight"][:, :, 0, 0])
    unet = link.safg["m1"].unet  # its up path runs deepest level first: up_blocks[0] is the reference's up.1
    assert torch.equal(unet.up_blocks[0][2].skip.weight, ckpt["gencomm.denoiser.up.1.block.2.nin_shortcut.weight"])
    assert torch.equal(unet.upsample[0].bias, ckpt["gencomm.denoiser.up.1.upsample.conv.bias"])
    assert torch.equal(link.enhancer["m1"].reference.gate_norm.bias, ckpt["enhancer.split_attn.bn1.bias"])
    assert torch.equal(stack.backbone.ups[0][0].weight, ckpt["backbone_m1.deblocks.0.0.weight"].transpose(0, 1))
    assert torch.equal(stack.shrink.layers[0][2].bias, ckpt["shrinker_m1.layers.0.double_conv.2.bias"])
    assert torch.equal(model.head.reg.bias[[3, 4, 5]], ckpt["reg_head.bias"][[5, 4, 3]])  # h w l -> l w h
    out = tmp_path / "imported"
    assert import_weights.main([str(run), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "link.dme.m1, link.safg.m1, link.enhancer.m1, head" in printed
    assert "reference keys its forward never reads, dropped (43):" in printed
    report = json.loads((out / "import_report.json").read_text())
    assert report["unused_reference_keys"] == [] and len(report["dropped_unread_reference_keys"]) == 43
    again = CooperativeDetector(**{**cfg.model, "lidar_range": list(cfg.data.lidar_range)})
    load_model_state(again, out / "checkpoints" / "best.pth")
    for k, v in model.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k
    for folder in (out, run):
        assert inference.main(["--model_dir", str(folder), "--max_frames", "2", "--plot_every", "0"]) == 0
    assert capsys.readouterr().out.count("AP@0.5") == 2
    ours, theirs = (json.loads((d / "eval_intermediate.json").read_text()) for d in (out, run))
    assert ours["ap"] == theirs["ap"] and ours["num_pred"] == theirs["num_pred"] > 0
    assert ours["frames"] == theirs["frames"] == 2
    a, b = (np.load(d / "eval_intermediate_frames.npz") for d in (out, run))
    assert np.array_equal(a["scores"], b["scores"])  # the same detections, score by score
