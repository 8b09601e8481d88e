"""HEAL's stage-1 Pyramid Fusion yaml (tests/assets/hypes/heal_stage1_m1_pyramid.yaml, copied unchanged)
converts into model.fusion: pyramid, builds HEAL's structure and trains a step on synthetic frames; the
foreground loss reaches the pyramid's occupancy heads."""
from pathlib import Path

import pytest
import torch

from opencood_ext.data.batch import collate_samples
from opencood_ext.data.dataset import CooperativeDataset
from opencood_ext.data.synthetic import SyntheticReader
from opencood_ext.experiment import build_model
from opencood_ext.interop.hypes import convert_hypes_file
from opencood_ext.interop.hypes_reader import HypesError
from opencood_ext.models import voxel_sizes

HEAL_M1 = Path(__file__).parents[2] / "assets" / "hypes" / "heal_stage1_m1_pyramid.yaml"
HEAL_FINAL = Path(__file__).parents[2] / "assets" / "hypes" / "heal_final_infer_m1m2m3m4.yaml"
# a smaller detection area (same architecture) keeps the CPU step short: 64 x 32 pillars
SMALL = ["data.lidar_range=[-12.8,-6.4,-3,12.8,6.4,1]"]


def test_heal_stage1_pyramid_yaml_converts_to_heal_structure():
    conv = convert_hypes_file(HEAL_M1)
    model = conv.config["model"]
    assert (model["fusion"], model["fusion_op"]) == ("pyramid", "pyramid")
    assert model["link"]["type"] == "full_feature"
    fa = model["fusion_args"]
    assert fa["layer_nums"] == [3, 5, 8] and fa["resnext"] is True and fa["shrink"]["dims"] == [256]
    assert fa["occupancy_weights"] == [0.4, 0.2, 0.1] and fa["occupancy_pos_weight"] == 2.0
    stack = model["agent_types"]["m1"]
    assert stack["backbone"]["type"] == "resnet_bev" and stack["backbone"]["upsample_strides"] == []
    assert stack["shrink"] == {"type": "none"}
    built = build_model(conv.experiment())
    assert built.channels == 64 and built.fuse.out_channels == 256 and built.grid.cell == (0.8, 0.8)
    # HEAL's level widths: ResNeXt bottlenecks of width 2 x planes in 32 groups; deblocks to 128 each
    assert built.fuse.backbone.levels[1][0].conv2.groups == 32 and built.fuse.backbone.levels[1][0].conv2.in_channels == 256
    assert built.head.cls.in_channels == 256


# the same file with narrower layers (--set over the converted config): the fast variant of the step below
NARROW = SMALL + ["model.agent_types.m1.backbone.layer_nums=[1]", "model.fusion_args.layer_nums=[1,1,1]",
                  "model.fusion_args.num_filters=[16,32,64]", "model.fusion_args.num_upsample_filters=[8,8,8]",
                  "model.fusion_args.shrink.dims=[16]"]


@pytest.mark.parametrize("overrides", [
    NARROW,
    # HEAL's full-width ResNeXt pyramid forward + backward on the CPU: 30-60 s on a busy machine
    pytest.param(SMALL, marks=pytest.mark.slow)], ids=["narrow", "heal_widths"])
def test_converted_heal_pyramid_trains_one_step_on_synthetic_frames(overrides):
    torch.manual_seed(0)
    cfg = convert_hypes_file(HEAL_M1).experiment(overrides)
    model = build_model(cfg).train()
    ds = CooperativeDataset(SyntheticReader(1, types=("m1", "m1", "m1")), cfg.data, voxel_sizes(cfg.model),
                            train=True, cooperation="all")
    batch = collate_samples([ds[0]])
    loss = model.loss(model(batch), batch)
    assert set(loss.parts) >= {"cls", "box", "dir", "occupancy"}
    assert torch.isfinite(loss.total) and float(loss.parts["occupancy"].detach()) > 0
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss.total.backward()
    for i in range(3):
        assert model.fuse.occupancy[i].weight.grad.abs().sum() > 0
    before = model.fuse.occupancy[0].weight.detach().clone()
    opt.step()
    assert not torch.equal(before, model.fuse.occupancy[0].weight)


def test_a_relative_downsample_other_than_the_levels_is_refused(tmp_path):
    text = HEAL_M1.read_text().replace("relative_downsample: [1, 2, 4]", "relative_downsample: [1, 2, 2]")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(HypesError, match=r"bad.yaml: key 'loss.args.pyramid.relative_downsample'"):
        convert_hypes_file(bad)


def test_heal_final_inference_yaml_of_four_types_converts_and_builds():
    """HEAL's final inference file: the m1 base's pyramid with m2 (LSS EfficientNet), m3 (SECOND) and m4
    (LSS ResNet-101), each new type with its ConvNeXt aligner."""
    conv = convert_hypes_file(HEAL_FINAL)
    model = conv.config["model"]
    assert model["fusion"] == "pyramid" and sorted(model["agent_types"]) == ["m1", "m2", "m3", "m4"]
    assert "aligner" not in model["agent_types"]["m1"]
    for t in ("m2", "m3", "m4"):
        assert model["agent_types"][t]["aligner"] == {"type": "convnext", "num_blocks": 3, "kernel_size": 7}
    built = build_model(conv.experiment())
    assert built.channels == 64 and {s.out_channels for s in built.encoders.values()} == {64}
    assert sum(p.numel() for p in built.encoders["m3"].aligner.parameters()) == 3 * (49 * 64 + 64 + 2 * 64 + 2 * 64 * 256
                                                                                        + 256 + 64 + 64)
