"""Every published LiDAR hypes yaml of the model families issue 32 names converts and builds, or is
refused naming the key whose computation this project does not have.

The files are copied unchanged under tests/assets/hypes/<repo>/ (their header names the repository,
commit and path; tests/assets/hypes/README.md): ``heter_model_baseline`` (GenComm reference and
HEAL), ``heter_model_baseline_w_gencomm_stage1`` / ``_stage2`` and STAMP (the GenComm reference's
STAMP baseline, ``heter_model_baseline_w_stamp[_infer]``, and STAMP's own repository,
``collab_w_adapter[_inference]``), every file whose agent types are all LiDAR (camera files are
tests/test_interop_lss*.py's). A file converts (the converted config validates through our schema,
runs ``protocol: reference``, and :func:`build_model` builds it, the widths the file states checked
against the model) unless :data:`REFUSED` names why it cannot run here; then the refusal must name
that key. So "the importer refuses nothing reference mode can run" is checked file by file.
"""
from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

import gencomm  # noqa: F401  (registers the GenComm link, as gencomm-import-config does)
from opencood_ext import experiment
from opencood_ext.interop import HypesError, convert_hypes_file
from opencood_ext.models.second import SecondEncoder

ASSETS = Path(__file__).parents[2] / "assets" / "hypes"
FILES = sorted(p.relative_to(ASSETS).as_posix() for repo in ("GenComm", "HEAL", "STAMP")
               for p in (ASSETS / repo).rglob("*.yaml"))

# (path pattern, what the refusal must say, a key as a rule): why the reference's run of such a file is not one here
REFUSED = [
    # STAMP's own repository (collab_w_adapter: the ego type's model converts, opencood_ext/methods/stamp_collab.py):
    # stage train_adapter: the adapters' alignment alone, no output to detect with
    (r"^STAMP/.*/(convnext_f_only|local_adapter/convnext_crop)/", "key 'model.args.stage'"),
    # the task-agnostic files' m1 / m2 are BEV segmentation models (bev_seg_head; AdapterConv and AdapterAtt
    # convert, opencood_ext/methods/stamp_adapters.py, but these heads are not built here)
    (r"^STAMP/.*/task_agnostic/.*/m[12]/", "head_method'"),
    # their m4 adapts a 0.4 m grid of another range to the protocol's (a resizing adapter)
    (r"^STAMP/.*/task_agnostic/.*/m4/", "out_feature_shape'"),
    # V2V4Real: no reader here (one file names fusion.dataset opv2v and converts)
    (r"^STAMP/.*/v2v4real/.*/(final_infer|convnext_crop/|convnext_crop_w_output_(only_)?wholemap/(m4|protocol_./m4))",
     "key 'fusion.dataset'"),
    # SECOND's spconv input width 64 (HEAL issue 20: MeanVFE gives 4 features)
    (r"^STAMP/.*/m2/config\.yaml$", "spconv.num_features_in'"),
    # the GenComm reference's STAMP inference (stamp_collab, ego_of_any_type) on DAIR-V2X drops 20% of the
    # collaborators' cells at random in evaluation (missing_message: True)
    (r"/dairv2x/.*/STAMP/m1m3_(att|v2xvit)_infer\.yaml$", "key 'model.args.missing_message'"),
    # fusion modules that are not fusion ops here (V2X-ViT's, CoBEVT, DiscoNet, V2VNet, Where2comm)
    (r"(v2xvit|cobevt|disco|v2vnet|where2comm)", "fusion_method'"),
    # V2X-Sim 2: no reader for its files here
    (r"/v2xsim2/", "key 'fusion.dataset'"),
    # V2X-Real's m4 (backbone_args: identity, a stride-1 shrink header) ends on 0.4 m cells while its
    # anchors (feature_stride 4) and the other types' features lie on 1.6 m cells: the reference's head
    # map and anchors disagree, and m4's feature cannot be fused with the others'
    (r"/v2xreal/GenComm_yamls/(baseline/stage1/m4|gencomm/stage1/m4)_",
     "key 'postprocess.anchor_args.feature_stride'"),
    (r"/v2xreal/GenComm_yamls/(gencomm/stage2/m1m4|gencomm/stage2/m1m2m3m4|baseline/stage2/STAMP/m0m4|"
     r"baseline/stage2/STAMP/m1m2m3m4)",
     "type m4 ends on BEV grid"),
    # SECOND on DAIR-V2X's 5 m z range: the reference's sparse grid has one more z layer and its conv4
    # does not pad z (2 layers of 64 = 128 channels); a SECOND encoder without that layout gives 3 layers
    # (192): refused by map2bev's width until the encoder computes the reference's (its protocol argument)
    *([] if "protocol" in inspect.signature(SecondEncoder).parameters else
      [(r"/dairv2x/GenComm_yamls/baselines/stage1/m3_att\.yaml$", "map2bev.feature_num'")]),
    # an OPV2V file naming V2X-Real's dataset class ('intermediatev2xrealheter'): the reference's
    # build_dataset asserts on that name, so the reference cannot run it either
    (r"^GenComm/opencood/hypes_yaml/opv2v/LiDAROnly/lidar_attfuse\.yaml$", "key 'fusion.core_method'"),
]


def expected_refusal(rel: str):
    return next((key for pattern, key in REFUSED if re.search(pattern, rel)), None)


_BUILT: dict = {}


def _cached_build(build):
    """build_model once per distinct (model, data, protocol): many files share one architecture."""
    def wrapped(cfg):
        key = json.dumps([cfg.model, repr(cfg.data.lidar_range), repr(cfg.data.agent_types), cfg.protocol],
                         sort_keys=True, default=repr)
        if key not in _BUILT:
            _BUILT[key] = build(cfg)
        return _BUILT[key]
    return wrapped


@pytest.fixture
def where(tmp_path, monkeypatch):
    """Convert from a folder holding a V2X-Real modality assignment (the reference repository does
    not ship its opencood/modality_assign/v2xreal_4modality.json; this one is hand-written); OPV2V's
    is found above the copied files, as in the reference's layout."""
    folder = tmp_path / "opencood" / "modality_assign"
    folder.mkdir(parents=True)
    (folder / "v2xreal_4modality.json").write_text(json.dumps({"scenario_a": {"1": "m1", "2": "m2", "3": "m3"},
                                                               "scenario_b": {"4": "m4", "5": "m1"}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(experiment, "build_model", _cached_build(experiment.build_model))
    return tmp_path


def test_the_assets_cover_every_family():
    repos = {f.split("/")[0] for f in FILES}
    assert repos == {"GenComm", "HEAL", "STAMP"} and len(FILES) == 124
    text = {f: (ASSETS / f).read_text() for f in FILES}
    for family in ("heter_model_baseline", "heter_model_baseline_w_gencomm_stage1",
                   "heter_model_baseline_w_gencomm_stage2", "heter_model_baseline_w_stamp", "collab_w_adapter"):
        assert any(f"(model {family};" in t for t in text.values()), family
    assert all(t.startswith("# Copied unchanged from github.com/") for t in text.values())


# one file per family and dataset, and one per kind of refusal: the default run (parsing all 124 with
# PyYAML's pure-Python loader and building 34 models takes minutes on a loaded machine: -m slow runs all)
SAMPLE = [
    "GenComm/opencood/hypes_yaml/opv2v/GenComm_yamls/baselines/stage1/m1_att.yaml",
    "GenComm/opencood/hypes_yaml/opv2v/GenComm_yamls/gencomm/stage2/m1m3_att.yaml",
    "GenComm/opencood/hypes_yaml/dairv2x/GenComm_yamls/gencomm/stage2/m1m3_att.yaml",
    "GenComm/opencood/hypes_yaml/v2xreal/GenComm_yamls/gencomm/stage1/m1_att.yaml",
    "GenComm/opencood/hypes_yaml/v2xreal/GenComm_yamls/gencomm/stage2/m1m3_att.yaml",
    "GenComm/opencood/hypes_yaml/opv2v/GenComm_yamls/baselines/stage2/STAMP/m0m3_att.yaml",
    "GenComm/opencood/hypes_yaml/dairv2x/GenComm_yamls/baselines/stage1/m3_att.yaml",
    "GenComm/opencood/hypes_yaml/dairv2x/GenComm_yamls/baselines/stage2/STAMP/m1m3_att_infer.yaml",
    "STAMP/opencood/hypes_yaml/opv2v/task_agnostic/local_adapter/convnext/m1/config.yaml",
    "STAMP/opencood/hypes_yaml/opv2v/object_detection/local_adapter/convnext/m4/config.yaml",
    "STAMP/opencood/hypes_yaml/v2v4real/MoreModality/OURS_4Agents_Heter_Simple/final_infer/convnext_crop/m4/"
    "config.yaml",
]


def test_identity_backbone_and_the_v2xreal_classes(where):
    """The OPV2V baseline m3 (SECOND, backbone_args: identity): no backbone, the encoder's 128 channels
    straight into the stride-2 shrink header; V2X-Real's three classes from anchor_generator_config."""
    base = ASSETS / "GenComm/opencood/hypes_yaml"
    cfg = convert_hypes_file(base / "opv2v/GenComm_yamls/baselines/stage1/m3_att.yaml").experiment()
    assert cfg.model["agent_types"]["m3"]["backbone"] == {"type": "identity"}
    model = experiment.build_model(cfg)
    assert sum(p.numel() for p in model.encoders["m3"].backbone.parameters()) == 0
    assert model.encoders["m3"].backbone.out_channels == 128 and model.grid.cell == (1.6, 1.6)
    cfg = convert_hypes_file(base / "v2xreal/GenComm_yamls/gencomm/stage1/m1_att.yaml").experiment()
    assert cfg.model["anchors"]["sizes"] == [[3.9, 1.6, 1.56], [0.8, 0.6, 1.73], [8.0, 3.0, 3.0]]
    assert cfg.model["anchors"]["z_center"] == [-1.78, -0.6, -1.78] and cfg.model["pos_iou"] == [0.6, 0.5, 0.6]
    assert cfg.data.reader_options == {"mode": "vc", "intensity": "raw"}
    assert list(cfg.data.class_groups) == ["vehicle", "pedestrian", "truck"] and cfg.model["loss"]["dir_weight"] == 0


def test_the_sample_is_in_the_assets():
    assert set(SAMPLE) <= set(FILES)


@pytest.mark.parametrize("rel", SAMPLE)
def test_mirror_yaml_sample(rel, where):
    check_mirror_yaml(rel, where)


@pytest.mark.slow
@pytest.mark.parametrize("rel", FILES)
def test_mirror_yaml(rel, where):
    check_mirror_yaml(rel, where)


def check_mirror_yaml(rel, where):
    path = ASSETS / rel
    key = expected_refusal(rel)
    if key is not None:
        with pytest.raises(HypesError) as err:
            convert_hypes_file(path, remap_to=where / "remapped.json")
        assert str(path) in str(err.value) and key in str(err.value), str(err.value)
        return
    conv = convert_hypes_file(path, remap_to=where / "remapped.json")
    cfg = conv.experiment()
    assert cfg.protocol == "reference"
    for line in conv.warnings():  # one line per key not read, naming the file
        assert line.startswith(f"WARNING: {path}: key '") and ": not read by this project: " in line
        assert "\n" not in line
