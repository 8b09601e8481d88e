"""OPV2V-H ships both m3 stacks of the GenComm reference (issue 50 item 5), each named for what it
loads: ``gencomm_stage1_m3.yaml`` (types/m3_stage1.yaml) is the published stage-1 yaml's m3
(three-level backbone) and takes a reference stage-1 m3 checkpoint; ``gencomm_stage1_m3_for_stage2.yaml``
(types/m3_stage2.yaml, which the stage-2 configs use) is the published stage-2 yamls' one-level m3.

Checked against the importer's conversion of the published yamls (copied under tests/assets/hypes),
and with a checkpoint in the reference's layout, its keys written out by hand from the stage-1 yaml
(tests/helpers/reference_keys.py, tests/opencood_ext/models/test_reference_e2e.py's SECOND keys): every key maps into the first,
and the second refuses it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import gencomm  # noqa: F401  (registers the GenComm link and its layouts)
from opencood_ext.experiment import build_model, load_experiment
from opencood_ext.interop import convert_hypes_file
from opencood_ext.interop.weights import import_reference_state
from reference_keys import (base_bev, diffusion_unet, downsample_conv, enhancer, gencomm_schedule, heads,
                            message_extractor, random_state)
from test_reference_e2e import _second_keys

ROOT = Path(__file__).resolve().parents[2]
HYPES = ROOT / "tests/assets/hypes"
GENCOMM = HYPES / "GenComm/opencood/hypes_yaml/opv2v/GenComm_yamls/gencomm"
STAGE1, FOR_STAGE2 = ROOT / "configs/opv2v_h/gencomm_stage1_m3.yaml", ROOT / "configs/opv2v_h/gencomm_stage1_m3_for_stage2.yaml"


def _shapes(stack):
    return {k: tuple(v.shape) for k, v in stack.state_dict().items()}


@pytest.fixture(scope="module")
def shipped():
    return {p.name: build_model(load_experiment(p)) for p in (STAGE1, FOR_STAGE2)}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    out = {}
    for name, path in (("stage1", GENCOMM / "stage1/m3_att.yaml"), ("stage2", GENCOMM / "stage2/m1m3_att.yaml"),
                       ("infer", HYPES / "gencomm_stage2_m1m2m3m4_att_infer.yaml")):
        remap = tmp_path_factory.mktemp(name) / "remapped.json"
        out[name] = convert_hypes_file(path, remap_to=remap, check=False).experiment()
    return out


def test_each_shipped_m3_is_the_published_yamls_m3(shipped, published, monkeypatch):
    monkeypatch.chdir(HYPES / "GenComm")
    stage1, for_stage2 = shipped[STAGE1.name].encoders["m3"], shipped[FOR_STAGE2.name].encoders["m3"]
    assert _shapes(stage1) == _shapes(build_model(published["stage1"]).encoders["m3"])
    for name in ("stage2", "infer"):
        assert _shapes(for_stage2) == _shapes(build_model(published[name]).encoders["m3"]), name
    assert _shapes(stage1) != _shapes(for_stage2)
    # the figures the configs' headers state
    assert sum(p.numel() for p in stage1.parameters()) == 7_903_808
    assert sum(p.numel() for p in for_stage2.parameters()) == 1_187_904
    assert sum(p.numel() for p in shipped[STAGE1.name].parameters()) == 8_196_848
    assert sum(p.numel() for p in shipped[FOR_STAGE2.name].parameters()) == 1_480_944


def test_the_stage2_configs_onboard_the_one_level_m3():
    """Every OPV2V-H experiment that onboards m3 (stage.new_types) builds the stage-2 yamls' m3, so its
    --new run is a gencomm_stage1_m3_for_stage2 run (HEAL's pyramid stage 2 has its own m3)."""
    one_level = load_experiment(FOR_STAGE2).model["agent_types"]["m3"]
    onboarding = []
    for path in sorted((ROOT / "configs/opv2v_h").rglob("*.yaml")):
        if "name" not in path.read_text() or "pyramid" in path.stem:
            continue
        cfg = load_experiment(path)
        if "m3" in cfg.stage.new_types:
            onboarding.append(path.name)
            assert cfg.model["agent_types"]["m3"] == one_level, path
    assert len(onboarding) == 5, onboarding  # GenComm, BackAlign, CodeFilling, MPDA, STAMP


def _reference_stage1_m3_checkpoint():
    """heter_model_baseline_w_gencomm_stage1 with the published stage-1 yaml's m3: SECOND (spconv 2.x
    layout), BaseBEVBackbone [3, 5, 8] at strides [1, 2, 2] and widths [64, 128, 256] upsampled to
    3 x 128, DownsampleConv 384 -> 128, the message extractor, UNet (ch 8, mult (1, 1), 2 blocks),
    enhancer and heads at 128."""
    levels = [(128, 64, 3, 1, 128), (64, 128, 5, 2, 128), (128, 256, 8, 4, 128)]
    shapes = {**_second_keys("encoder_m3"), **base_bev("backbone_m3", levels),
              **downsample_conv("shrinker_m3", [(384, 128, 3)]), **message_extractor("message_extractor_m3", 128),
              **diffusion_unet("gencomm.denoiser", 8, (1, 1), 2, 130, 128), **enhancer("enhancer", 128), **heads(128)}
    return {**random_state(shapes, seed=7), **gencomm_schedule("gencomm")}


def test_a_reference_stage1_m3_checkpoint_imports_into_gencomm_stage1_m3_only(shipped):
    pytest.importorskip("spconv")
    sd = _reference_stage1_m3_checkpoint()
    model = shipped[STAGE1.name]
    mapping = import_reference_state(sd, model)
    model.load_state_dict(mapping.state, strict=False)
    missing = set(model.state_dict()) - set(mapping.state)
    assert not missing and not mapping.unused, (sorted(missing)[:5], mapping.unused[:5])
    with pytest.raises(ValueError, match="backbone_m3"):
        import_reference_state(sd, shipped[FOR_STAGE2.name])
