"""Anchors against the reference's own rule: every config this project ships under ``protocol:
reference`` and every published reference yaml the importer converts builds the anchors (centres,
sizes, rotations, count and order) that the reference's anchor generator builds from that yaml.

The reference's rule, restated here from its source and nothing else (GenComm, HEAL and STAMP
``opencood/data_utils/post_processor/voxel_postprocessor.py`` ``generate_anchor_box``, with
``anchor_args`` completed by ``opencood/hypes_yaml/yaml_utils.py`` ``load_general_params``, the
parser of every published yaml here):

* ``W = ceil((xmax - xmin) / vw)``, ``H = ceil((ymax - ymin) / vh)``, ``vw, vh`` the top-level
  ``preprocess.args.voxel_size`` (a STAMP type's ``postprocess.voxel_size``; its parser runs per type);
* centres ``x = linspace(xmin + vw, xmax - vw, W // feature_stride)`` and likewise y, float64;
  ``meshgrid(x, y)``, z -1, sizes ``(h, w, l)``, one anchor per rotation ``radians(r)``;
* V2X-Real's ``generate_anchor_box_v2xreal`` (``align_center``): tests/opencood_ext/models/test_reference_v2xreal.py's
  restatement.

The model's side is what the experiment builds (:func:`build_model`), never this file's formula;
the sim configs (``protocol: equalized``) keep anchors at the feature cells' centres.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

import gencomm  # noqa: F401  (registers the GenComm link, as the tools do)
import test_interop_hypes_mirrors as mirrors
from opencood_ext import experiment
from opencood_ext.interop import convert_hypes_file
from opencood_ext.interop.hypes_reader import read_yaml
from test_reference_v2xreal import reference_anchors as reference_anchors_v2xreal

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"
ASSETS = ROOT / "tests" / "assets" / "hypes"
GENCOMM = "GenComm/opencood/hypes_yaml"
HWL = [0, 1, 2, 5, 4, 3, 6]  # the reference's box order <-> ours (its own inverse)


# ----------------------------------------------------------------------------- the restatement
def _anchor_inputs(hypes: dict):
    """(postprocess section, voxel size) the reference's generator reads for a parsed yaml: the
    top-level postprocess and preprocess voxel size, or (STAMP, a post-processor per type) the ego
    type's, whose heads the converted model holds."""
    if "postprocess" in hypes:
        return hypes["postprocess"], hypes["preprocess"]["args"]["voxel_size"]
    setting = hypes["heter"]["modality_setting"]
    ego = (hypes.get("model", {}).get("args", {}).get("ego_modality") or hypes["heter"].get("ego_modality"))
    post = setting[ego]["postprocess"] if "postprocess" in setting.get(ego, {}) else next(
        s["postprocess"] for s in setting.values() if "postprocess" in s)
    return post, post["voxel_size"]


def _adapter_stage(hypes: dict) -> bool:
    """The GenComm reference's STAMP adapter stage and STAMP's own train_adapter: no detection output."""
    args = hypes.get("model", {}).get("args", {})
    return hypes.get("model", {}).get("core_method") == "heter_model_baseline_w_stamp" or \
        args.get("stage") == "train_adapter"


def reference_anchor_box(hypes: dict) -> np.ndarray:
    """generate_anchor_box for a parsed reference yaml -> (ny, nx, K, 7) float64, the reference's
    ``[x, y, z, h, w, l, yaw]``."""
    post, voxel = _anchor_inputs(hypes)
    args = post["anchor_args"]
    rng = args["cav_lidar_range"]
    vw, vh = voxel[0], voxel[1]
    W, H = math.ceil((rng[3] - rng[0]) / vw), math.ceil((rng[4] - rng[1]) / vh)
    stride = args.get("feature_stride", 2)
    x = np.linspace(rng[0] + vw, rng[3] - vw, W // stride)
    y = np.linspace(rng[1] + vh, rng[4] - vh, H // stride)
    cx, cy = np.meshgrid(x, y)
    rots = [math.radians(r) for r in args["r"]]
    assert args.get("num", len(rots)) == len(rots) and post.get("order", "hwl") == "hwl"
    out = np.zeros((*cx.shape, len(rots), 7))
    out[..., 0] = cx[..., None]
    out[..., 1] = cy[..., None]
    out[..., 2] = -1.0
    out[..., 3:6] = (args["h"], args["w"], args["l"])
    out[..., 6] = rots
    return out


def reference_flat(hypes: dict) -> np.ndarray:
    """(N, 7) float64 in OUR box order and the head's anchor order, for any reference yaml."""
    if "anchor_generator_config" in hypes.get("postprocess", {}).get("anchor_args", {}):
        per_class = np.stack(reference_anchors_v2xreal(hypes)[0])  # (C, ny, nx, R, 7), stacked as its post-process
        return per_class.transpose(1, 2, 0, 3, 4).reshape(-1, 7)[:, HWL]
    return reference_anchor_box(hypes).reshape(-1, 7)[:, HWL]


def _model_anchors(model) -> np.ndarray:
    """The anchors the model decodes with (float32) and assigns targets with (float64, where kept)."""
    return model.anchor_gen.flat64().numpy()


def _compare(model, hypes, what):
    ours64, ours32 = _model_anchors(model), model.anchors.numpy()
    want = reference_flat(hypes)
    assert ours64.shape == want.shape, (what, ours64.shape, want.shape)
    # centres: the float64 values the reference computes (numpy's linspace / arange), to rounding
    np.testing.assert_allclose(ours64[:, :2], want[:, :2], rtol=0, atol=1e-9, err_msg=what)
    np.testing.assert_allclose(ours64[:, 2:], want[:, 2:], rtol=0, atol=1e-6, err_msg=what)
    np.testing.assert_allclose(ours32, want.astype(np.float32), rtol=0, atol=1e-5, err_msg=what)


# ----------------------------------------------------------------------------- shipped configs
# which published yaml's anchors each shipped reference config reproduces (first match wins)
SHIPPED = [
    (r"^opv2v_h/gencomm_stage1_m2\.yaml$", "gencomm_stage1_m2_att.yaml"),
    (r"^opv2v_h/gencomm_stage1_m4\.yaml$", "gencomm_stage1_m4_att.yaml"),
    (r"pyramid", "heal_stage1_m1_pyramid.yaml"),
    (r"^opv2v_h/", f"{GENCOMM}/opv2v/GenComm_yamls/gencomm/stage1/m1_att.yaml"),
    (r"^dairv2x/", f"{GENCOMM}/dairv2x/GenComm_yamls/gencomm/stage1/m1_att.yaml"),
    (r"^v2xreal/", f"{GENCOMM}/v2xreal/GenComm_yamls/gencomm/stage1/m1_att.yaml"),
]
EXPERIMENTS = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml")
                     if "name" in (yaml.safe_load(p.read_text()) or {}))


def _parsed(rel: str) -> dict:
    return read_yaml(ASSETS / rel)[0]


@pytest.mark.parametrize("rel", EXPERIMENTS)
def test_shipped_config_anchors(rel):
    cfg = experiment.load_experiment(CONFIGS / rel)
    model = experiment.build_model(cfg)
    if cfg.protocol != "reference":  # our own rule: the feature cells' centres
        assert rel.startswith("sim/"), f"{rel}: a config outside configs/sim not under protocol reference"
        (h, w), a = model.grid.shape, model.anchor_gen.anchors64
        xmin, ymin, _, xmax, ymax, _ = cfg.data.lidar_range
        np.testing.assert_allclose(a[0, :, 0, 0].numpy(), xmin + (np.arange(w) + 0.5) * (xmax - xmin) / w, atol=1e-5)
        np.testing.assert_allclose(a[:, 0, 0, 1].numpy(), ymin + (np.arange(h) + 0.5) * (ymax - ymin) / h, atol=1e-5)
        return
    source = next((src for pattern, src in SHIPPED if re.search(pattern, rel)), None)
    assert source is not None, f"{rel} runs protocol reference: name the published yaml it reproduces in SHIPPED"
    _compare(model, _parsed(source), rel)


def test_the_reference_rule_is_not_the_cell_centres():
    """On GenComm's 1.6 m cells over 0.4 m voxels the two rules differ by up to 0.4 m (the issue's
    635 against 632 boxes); on HEAL's 0.8 m cells they coincide, which is why a missing margin did not
    show there. So the comparison above can fail."""
    def gap(rel):
        a = reference_anchor_box(_parsed(rel))
        ny, nx = a.shape[:2]
        rng = _parsed(rel)["cav_lidar_range"]
        centres = rng[0] + (np.arange(nx) + 0.5) * (rng[3] - rng[0]) / nx
        return float(np.abs(a[0, :, 0, 0] - centres).max())
    assert gap(f"{GENCOMM}/opv2v/GenComm_yamls/gencomm/stage1/m1_att.yaml") == pytest.approx(0.4, abs=1e-9)
    assert gap("heal_stage1_m1_pyramid.yaml") < 1e-9


# ----------------------------------------------------------------------------- imported configs
def _published_voxels():
    """Every published yaml's anchor voxel size (x, y): the margin the reference uses."""
    out = set()
    for rel in mirrors.FILES:
        hypes = _parsed(rel)
        if _adapter_stage(hypes):
            continue
        if "postprocess" in hypes or any("postprocess" in s for s in
                                         (hypes.get("heter") or {}).get("modality_setting", {}).values()):
            out.add(tuple(_anchor_inputs(hypes)[1][:2]))
    return out


def test_every_published_anchor_voxel_is_0_4_m():
    """The shipped configs' margin [0.4, 0.4] is the published yamls' voxel size, every one of them."""
    assert _published_voxels() == {(0.4, 0.4)}


IMPORT_SAMPLE = [
    f"{GENCOMM}/opv2v/GenComm_yamls/gencomm/stage1/m1_att.yaml",
    f"{GENCOMM}/opv2v/GenComm_yamls/gencomm/stage1/m3_att.yaml",
    f"{GENCOMM}/opv2v/GenComm_yamls/gencomm/stage2/m1m3_att.yaml",
    f"{GENCOMM}/dairv2x/GenComm_yamls/gencomm/stage2/m1m3_att.yaml",
    f"{GENCOMM}/v2xreal/GenComm_yamls/gencomm/stage1/m1_att.yaml",
    f"{GENCOMM}/opv2v/GenComm_yamls/baselines/stage1/m1_att.yaml",
    "STAMP/opencood/hypes_yaml/opv2v/object_detection/local_adapter/convnext/m4/config.yaml",
    "heal_stage1_m1_pyramid.yaml",
    "gencomm_stage1_m2_att.yaml",
    "gencomm_stage2_m1m2m3m4_att_infer.yaml",
]


def check_imported(rel, where):
    if mirrors.expected_refusal(rel) is not None:
        pytest.skip("refused by the importer (tests/opencood_ext/interop/test_interop_hypes_mirrors.py checks why)")
    if _adapter_stage(_parsed(rel)):
        pytest.skip("an adapter stage: the reference builds no head and detects nothing with it")
    cfg = convert_hypes_file(ASSETS / rel, remap_to=where / "remapped.json").experiment()
    assert cfg.protocol == "reference"
    _compare(experiment.build_model(cfg), _parsed(rel), rel)


@pytest.mark.parametrize("rel", IMPORT_SAMPLE)
def test_imported_config_anchors(rel, where):
    check_imported(rel, where)


@pytest.mark.slow
@pytest.mark.parametrize("rel", mirrors.FILES)
def test_every_imported_config_anchors(rel, where):
    check_imported(rel, where)


@pytest.fixture
def where(tmp_path, monkeypatch):
    """As the mirrors test: a V2X-Real assignment beside, OPV2V's found above the copied files; models
    of the same architecture built once."""
    folder = tmp_path / "opencood" / "modality_assign"
    folder.mkdir(parents=True)
    (folder / "v2xreal_4modality.json").write_text('{"scenario_a": {"1": "m1", "2": "m3"}}')
    (folder / "opv2v_4modality.json").write_text((ASSETS / "GenComm/opencood/modality_assign/opv2v_4modality.json")
                                                 .read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(experiment, "build_model", mirrors._cached_build(experiment.build_model))
    return tmp_path
