"""HEAL / GenComm-reference hypes yamls -> our experiment config (opencood_ext.interop.hypes).

The assets under tests/assets/interop are hand-written with the key structure
of the public HEAL and GenComm hypes files."""
import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch

from opencood_ext.config import load_config
from opencood_ext.experiment import ExperimentConfig, build_model, load_experiment
from opencood_ext.interop import HypesError, convert_hypes_file, is_hypes
from opencood_ext.interop.hypes_keys import KEYS, rule_for
from opencood_ext.interop.hypes_reader import HypesReader, read_yaml
from tiny_runs import tiny_dataset

ROOT = Path(__file__).resolve().parents[3]
ASSETS = Path(__file__).parents[2] / "assets" / "interop"
sys.path.insert(0, str(ROOT / "tools"))

import import_config  # noqa: E402
import train  # noqa: E402


def _edited(tmp_path, asset, old, new, name="edited.yaml"):
    text = (ASSETS / asset).read_text()
    assert old in text, old
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


def test_gencomm_stage1_pointpillars_converts_loads_and_builds(tmp_path, capsys):
    out = tmp_path / "m1.yaml"
    assert import_config.main([str(ASSETS / "gencomm_stage1_m1_pointpillars.yaml"), "-o", str(out)]) == 0
    # nothing approximate: heter.ego_modality (m1, the only type) is the ego rule itself, not a note
    assert "carried over approximately" not in capsys.readouterr().out
    cfg = load_experiment(out)  # the written file goes through our schema as it is
    assert isinstance(cfg, ExperimentConfig)
    d = cfg.data
    assert (d.format, d.root, d.train_split, d.val_split, d.test_split) == (
        "opv2v", "dataset/OPV2V", "train", "validate", "test")
    assert d.lidar_range == (-102.4, -51.2, -3.0, 102.4, 51.2, 1.0)
    assert (d.comm_range, d.max_agents, d.modality, d.augment.enabled) == (70.0, 5, "all:m1", False)
    assert (d.agent_types["m1"].max_voxels, d.agent_types["m1"].max_points_per_voxel) == (70000, 32)
    m = cfg.model
    assert m["agent_types"]["m1"]["encoder"] == {"type": "pointpillars", "voxel_size": [0.4, 0.4, 4],
                                                 "num_filters": [64]}
    # the reference's structures: BaseBEVBackbone, a stride-2 DownsampleConv (the grid is the reference's 1.6 m)
    assert m["agent_types"]["m1"]["backbone"] == {
        "type": "base_bev", "layer_nums": [3, 5, 8], "layer_strides": [2, 2, 2], "num_filters": [64, 128, 256],
        "upsample_strides": [1, 2, 4], "num_upsample_filters": [128, 128, 128]}
    assert m["agent_types"]["m1"]["shrink"] == {"type": "downsample_conv", "kernel_size": [3], "stride": [2],
                                                "padding": [1], "dims": [128]}
    # the reference GenComm ignores diffusion.beta_start / beta_end (5e-3 .. 5e-2 hard-coded): our defaults
    assert m["link"]["generator"] == {"variant": "reference", "num_steps": 3, "base_channels": 8,
                                      "channel_mult": [1, 1], "num_res_blocks": 2}
    assert m["link"]["message"] == {"variant": "reference", "message_channels": 2}
    assert m["link"]["enhancer"] == {"variant": "reference"} and m["link"]["generation_weight"] == 1.0
    assert m["anchors"]["rotations"] == [0.0, math.pi / 2]
    assert m["loss"]["smooth_l1_beta"] == pytest.approx(1 / 9) and m["loss"]["pos_cls_weight"] == 2.0
    t = cfg.train
    assert (t.epochs, t.batch_size, t.lr, t.weight_decay, t.milestones, t.gamma, t.val_every) == (
        20, 2, 0.002, 1e-4, [10, 15], 0.1, 2)
    model = build_model(cfg)
    assert model.grid.shape == (64, 128) and model.grid.cell == (1.6, 1.6) and model.channels == 128
    assert model.link.dme["m1"].out_channels == 2
    assert sum(p.numel() for p in model.link.dme["m1"].parameters()) == 103_028  # MessageExtractorv2's
    assert sum(p.numel() for p in model.link.safg["m1"].parameters()) == 43_176
    assert sum(p.numel() for p in model.encoders["m1"].backbone.parameters()) == 6_577_408


def test_second_stage1_keeps_the_grid_and_the_32_beam_scans():
    conv = convert_hypes_file(ASSETS / "gencomm_stage1_m3_second.yaml")
    cfg = conv.experiment()
    assert cfg.data.agent_types["m3"].lidar_beams == 32 and cfg.data.modality == "all:m3"
    enc = cfg.model["agent_types"]["m3"]["encoder"]
    assert enc["channels"] == [16, 32, 64, 64] and enc["blocks"] == [1, 2, 2, 2] and enc["out_z_channels"] == 64
    model = build_model(cfg)
    assert model.encoders["m3"].encoder.out_channels == 128  # map2bev.feature_num, checked on conversion
    assert model.grid.shape == (64, 128) and model.grid.cell == (1.6, 1.6)


def test_stage2_remaps_the_assignment_and_names_the_new_type(tmp_path):
    src = ASSETS / "gencomm_stage2_m1m3.yaml"
    with pytest.raises(HypesError, match=r"heter.mapping_dict.*import_config.py"):
        convert_hypes_file(src)  # a remap needs somewhere to copy the assignment
    out = tmp_path / "cfg" / "stage2.yaml"
    assert import_config.main([str(src), "-o", str(out)]) == 0
    cfg = load_experiment(out)
    copied = Path(cfg.data.modality)
    assert copied == out.with_suffix(".modality.json").resolve()
    # the assignment as the reference reads it (its ego rule tests the first agent's type before the
    # mapping), the mapping beside it: m4 runs as m3, m2 as m1
    table = json.loads(copied.read_text())
    assert table["2021_08_18_19_48_05"] == {"1045": "m3", "1054": "m1", "1063": "m4"}
    assert table["2021_08_20_21_10_24"] == {"214": "m2", "223": "m1"}
    assert cfg.data.type_mapping == {"m1": "m1", "m2": "m1", "m3": "m3", "m4": "m3"}
    assert cfg.stage.new_types == ["m3"] and cfg.model["link"]["generation_weight"] == 0.0
    assert (cfg.train.lr_scheduler, cfg.train.milestones, cfg.train.lr) == ("multistep", [5], 0.0005)
    assert build_model(cfg).grid.shape == (64, 128)


def test_heal_lidar_camera_baseline(tmp_path):
    conv = convert_hypes_file(ASSETS / "heal_lidar_camera_attfuse.yaml", remap_to=tmp_path / "m.json")
    cfg = conv.experiment()
    cam = cfg.data.agent_types["m2"]
    assert (cam.sensor, cam.image_size, cam.use_depth) == ("camera", (384, 512), True)
    enc = cfg.model["agent_types"]["m2"]["encoder"]
    assert enc == {"type": "lss_reference", "trunk": "efficientnet_b0", "img_downsample": 8,
                   "depth_discretization": [2, 50, 48], "depth_mode": "LID", "xbound": [-51.2, 51.2, 0.4],
                   "ybound": [-51.2, 51.2, 0.4], "zbound": [-10, 10, 20.0], "context_channels": 128}
    assert cfg.model["link"] == {"type": "full_feature", "wire_dtype": "float32"}
    assert cfg.name == "HeterBaseline_lidar_camera_attfuse" and not cfg.data.augment.enabled
    approx = dict(conv.approximations)
    assert "heter.modality_setting.m2.data_aug_conf.bot_pct_lim" in approx
    assert "ImageNet" in approx["model.args.m2.encoder_args.camera_encoder"]  # the trunk by name, not its weights
    assert "data_augment" in dict(conv.dropped)
    model = build_model(cfg)
    assert model.channels == 256 and model.grid.cell == (0.8, 0.8)
    # the +-51.2 m camera grid (128 cells of 0.8 m after the backbone) is zero-padded to the +-102.4 m range
    assert model.encoders["m2"].crop == (256, 256) and model.encoders["m2"].grid == model.encoders["m1"].grid
    assert "camera" in conv.report() and conv.yaml().startswith("name:")


def test_unsupported_keys_are_all_listed_with_file_and_path():
    src = ASSETS / "unsupported.yaml"
    with pytest.raises(HypesError) as err:
        convert_hypes_file(src)
    msg = str(err.value)
    for key in ("box_align.train_result", "heter.modality_setting.m1.preprocess.cav_lidar_range",
                "postprocess.order", "model.args.compressor.input_dim", "model.args.compressor.compress_ratio",
                "model.args.num_class", "loss.core_method", "fusion.dataset",
                "model.core_method", "model.args.fusion_method", "lr_scheduler.core_method"):
        assert f"{src}: key '{key}'" in msg, key
    assert "v2xvit" in msg and "heter_model_baseline_ms" in msg and "cosineannealwarm" in msg
    assert "CoAlign" in msg and "NaiveCompressor" in msg
    # keys no converted model reads are warned about, not refused (the file is refused for the keys above)
    for key in ("lr_scheduler.warmup_lr", "lr_scheduler.lr_min"):
        assert f"key '{key}'" not in msg, key


@pytest.mark.parametrize("old,new,key", [
    ("att: {feat_dim: 128}", "att: {feat_dim: 256}", "model.args.att.feat_dim"),
    ("feature_stride: 4", "feature_stride: 2", "postprocess.anchor_args.feature_stride"),
    ("input_dim: 384}", "input_dim: 256}", "model.args.m1.shrink_header.input_dim"),
    ("dir_args: &dir {dir_offset: 0.7853", "dir_args: &dir {dir_offset: 0.5", "postprocess.dir_args.dir_offset"),
    ("lidar_range: *range\n        pillar", "lidar_range: [-51.2, -51.2, -3, 51.2, 51.2, 1]\n        pillar",
     "model.args.m1.encoder_args.lidar_range"),
    # attention at the reference UNet's level 1 (nominal resolution 64): our reference UNet has none
    ("attn_resolutions: [16]", "attn_resolutions: [16, 64]", "model.args.gencomm.model.attn_resolutions"),
    ("resamp_with_conv: true", "resamp_with_conv: false", "model.args.gencomm.model.resamp_with_conv"),
])
def test_inconsistent_values_are_refused(tmp_path, old, new, key):
    path = _edited(tmp_path, "gencomm_stage1_m1_pointpillars.yaml", old, new)
    with pytest.raises(HypesError, match=f"key '{key}'"):
        convert_hypes_file(path)


def test_second_input_width_of_the_known_bug_is_refused(tmp_path):
    path = _edited(tmp_path, "gencomm_stage1_m3_second.yaml", "num_features_in: 4", "num_features_in: 64")
    with pytest.raises(HypesError, match=r"spconv.num_features_in.*HEAL issue 20"):
        convert_hypes_file(path)


def test_saved_run_config_with_python_tags_and_a_repeated_key():
    data, dups = read_yaml(ASSETS / "saved_run_config_tiny.yaml")
    assert is_hypes(data) and dups == ["in_head (line 106)"]
    conv = convert_hypes_file(ASSETS / "saved_run_config_tiny.yaml")
    dropped = dict(conv.dropped)
    assert "model.args.m1.encoder_args.point_pillar_scatter.grid_size" in dropped
    assert "postprocess.anchor_args.W" in dropped and "in_head (line 106)" in dropped
    assert conv.experiment().model["fusion_op"] == "max"


def test_python_object_in_a_carried_key_is_refused(tmp_path):
    path = _edited(tmp_path, "saved_run_config_tiny.yaml", "comm_range: 70",
                   "comm_range: !!python/object/apply:numpy.float64 [70]")
    with pytest.raises(HypesError, match=r"key 'comm_range': holds a python object"):
        convert_hypes_file(path)


def test_our_own_configs_are_not_hypes():
    for path in (ROOT / "configs").rglob("*.yaml"):
        assert not is_hypes(read_yaml(path)[0]), path


def test_overrides_apply_in_our_key_space():
    conv = convert_hypes_file(ASSETS / "gencomm_stage1_m1_pointpillars.yaml")
    cfg = conv.experiment(["data.root=/data/OPV2V", "model.link.warp_before_generation=false"])
    assert cfg.data.root == "/data/OPV2V" and cfg.model["link"]["warp_before_generation"] is False
    with pytest.raises(ValueError, match="--set: key 'data.roots'.*did you mean 'root'"):
        conv.experiment(["data.roots=x"])


def test_key_table_is_consistent():
    for pattern in KEYS:
        concrete = re.sub(r"<\w+:(\w+)[^>]*>", r"\1", pattern)  # a choice: its first option
        concrete = concrete.replace("<m>", "m7").replace("<k>", "xbound").replace("<rest>", "anchor_args.l")
        assert rule_for(concrete) is not None, pattern
    reader = HypesReader({"name": "x"}, "f.yaml")
    with pytest.raises(KeyError, match="not in hypes_keys.KEYS"):
        reader.get("nonexistent.key")
    reader.get("cav_lidar_range")
    assert reader.problems == ["f.yaml: key 'cav_lidar_range': missing (required)"]


def test_train_cli_takes_a_hypes_yaml(tmp_path, capsys):
    torch.set_num_threads(1)
    data = tiny_dataset(tmp_path / "data")
    hypes = _edited(tmp_path, "saved_run_config_tiny.yaml", "ROOT", str(data), "hypes.yaml")
    run = tmp_path / "run"
    assert train.main(["-y", str(hypes), "--model_dir", str(run), "--set", "train.max_steps_per_epoch=1",
                       "--set", "train.progress_bar=false"]) == 0
    assert "hypes yaml; converted config" in capsys.readouterr().out
    saved = load_config(run / "config.yaml", ExperimentConfig)  # our schema, as every run folder
    assert saved.model["fusion_op"] == "max" and saved.data.root == str(data)
    assert (run / "checkpoints" / "latest.pth").exists()


def test_dairv2x_splits_are_json_lists_under_data_dir(tmp_path):
    text = (ASSETS / "gencomm_stage1_m1_pointpillars.yaml").read_text()
    dair = "dataset/my_dair_v2x/v2x_c/cooperative-vehicle-infrastructure"
    for old, new in (('root_dir: "dataset/OPV2V/train"', f"data_dir: {dair}\nroot_dir: {dair}/train.json"),
                     ('validate_dir: "dataset/OPV2V/validate"', f"validate_dir: {dair}/val.json"),
                     ('test_dir: "dataset/OPV2V/test"', f"test_dir: {dair}/val.json"),
                     ("dataset: opv2v", "dataset: dairv2x"),
                     ('assignment_path: "opencood/modality_assign/opv2v_4modality.json"', "assignment_path: null"),
                     ("mapping_dict: {m1: m1, m2: m1, m3: m1, m4: m1}", "mapping_dict: {m1: m1, m2: m1}")):
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "dair.yaml").write_text(text)
    d = convert_hypes_file(tmp_path / "dair.yaml").experiment().data
    assert (d.format, d.root, d.train_split, d.test_split, d.modality) == (
        "dairv2x", dair, f"{dair}/train.json", f"{dair}/val.json", "all:m1")
