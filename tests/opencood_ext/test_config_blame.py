"""A config error names the file that SET the value, through ``base:`` includes, also for the
checks a dataclass runs on itself (``__post_init__``); and every closed choice (wire dtype,
modality types, fusion, link, classes, lr, layer sizes) is checked when the config loads, not
when a model is built or a message first sent. The layout is configs/sim's: an experiment
including base.yaml and types/*.yaml."""
import shutil
from pathlib import Path

import pytest

import gencomm  # noqa: F401  (registers the GenComm link, as the tools do)
from opencood_ext.config import MAX_CONFIG_BYTES, ConfigError, FieldError, load_config
from opencood_ext.experiment import ExperimentConfig, load_experiment

SIM = Path(__file__).resolve().parents[2] / "configs" / "sim"


@pytest.fixture
def sim(tmp_path):
    """A copy of configs/sim's base and type files (so a test may edit them) and an intermediate
    experiment including them."""
    shutil.copy(SIM / "base.yaml", tmp_path / "base.yaml")
    shutil.copytree(SIM / "types", tmp_path / "types")
    (tmp_path / "exp.yaml").write_text(
        "name: x\nbase: [base.yaml, types/m1.yaml, types/m3.yaml]\ndata: {modality: 'cycle:m1,m3'}\n"
        "model: {fusion: intermediate, link: {type: full_feature, wire_dtype: float32}}\n")
    return tmp_path


def _error(path, overrides=()):
    with pytest.raises(ConfigError) as err:
        load_experiment(path, overrides)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_the_copied_layout_loads(sim):
    cfg = load_experiment(sim / "exp.yaml")
    assert cfg.train.lr == 0.002 and set(cfg.model["agent_types"]) == {"m1", "m3"}


@pytest.mark.parametrize("key,value", [("lr", -1), ("epochs", -1), ("batch_size", 0)])
def test_train_values_set_in_the_including_file_blame_it_not_base(sim, key, value):
    """base.yaml sets the train section; the experiment overrides one value: the error is the
    experiment's (it named base.yaml, the file that set the section)."""
    exp = sim / "exp.yaml"
    exp.write_text(exp.read_text() + f"train: {{{key}: {value}}}\n")
    msg = _error(exp)
    assert msg.startswith(f"{exp}: key 'train.{key}': ") and "base.yaml" not in msg


def test_a_value_set_in_a_base_blames_that_base(sim):
    base = sim / "base.yaml"
    base.write_text(base.read_text().replace("epochs: 8", "epochs: -3"))
    assert _error(sim / "exp.yaml").startswith(f"{base}: key 'train.epochs': ")


def test_comm_range_in_the_first_types_file_blames_it_not_the_last(sim):
    """types/m1.yaml sets a negative data.comm_range; types/m3.yaml (included after it) also
    sets data: the error named m3.yaml."""
    m1 = sim / "types" / "m1.yaml"
    m1.write_text(m1.read_text().replace("data:\n", "data:\n  comm_range: -5.0\n", 1))
    msg = _error(sim / "exp.yaml")
    assert msg.startswith(f"{m1}: key 'data.comm_range': ") and "m3.yaml" not in msg


def test_set_overrides_and_their_old_provenance(sim):
    msg = _error(sim / "exp.yaml", ["train.lr=-1"])
    assert msg.startswith("--set: key 'train.lr': ")
    # a --set mapping replaces what the files set below it: a default inside it is not blamed on them
    msg = _error(sim / "exp.yaml", ["data={comm_range: -1.0}"])
    assert msg.startswith("--set: key 'data.comm_range'")


def test_field_error_names_its_key_and_a_second_key_with_its_file(tmp_path):
    (tmp_path / "types.yaml").write_text("data: {agent_types: {m1: {}, m3: {sensor: lidar}}}\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: x\nbase: types.yaml\nmodel:\n  fusion: none\n  agent_types:\n"
                   "    m1: {encoder: {type: pointpillars}, backbone: {}}\n")
    msg = _error(exp)
    assert msg.startswith(f"{exp}: key 'model.agent_types': ")
    assert f"key 'data.agent_types' from {tmp_path / 'types.yaml'}" in msg
    with pytest.raises(FieldError) as err:  # a direct construction gets the plain ValueError
        ExperimentConfig(name="x/y")
    assert err.value.keys == [("name",)] and isinstance(err.value, ValueError)


# ---------------------------------------------------------------- accepted wrongly before

@pytest.mark.parametrize("overrides,key,words", [
    (["model.link.wire_dtype=float64"], "model.link.wire_dtype", "float64"),
    (["model.link={type: gencomm, wire_dtype: float64}"], "model.link.wire_dtype", "float64"),
    (["model.link={type: codefilling, wire_dtype: float16}"], "model.link.wire_dtype", "not an argument"),
    (["model.link={type: full_featur}"], "model.link.type", "did you mean 'full_feature'"),
    (["data.modality=cycle:m1,m5"], "data.modality", "['m5']"),
    (["data.classes=[]"], "data.classes", "empty"),
    (["data.class_groups={car: []}"], "data.class_groups.car", "empty"),
    (["train.lr=0"], "train.lr", "> 0"),
    (["model.fusion=null"], "model.fusion", "required"),
    (["model.fusion=intermediat"], "model.fusion", "did you mean 'intermediate'"),
    (["model.link=null"], "model.link", "required"),
    (["model.fusion_op=maxx"], "model.fusion_op", "did you mean 'max'"),
    (["model.agent_types.m1.encoder.type=pointpilars"], "model.agent_types.m1.encoder.type", "pointpillars"),
    (["model.agent_types.m1.encoder.num_filters=[-64]"], "model.agent_types.m1.encoder.num_filters", "> 0"),
    (["model.agent_types.m3.backbone.layer_strides=[0, 2]"], "model.agent_types.m3.backbone.layer_strides", "> 0"),
    (["model.agent_types.m3.backbone.layer_nums=[-1, 2]"], "model.agent_types.m3.backbone.layer_nums", ">= 0"),
])
def test_closed_choices_are_refused_at_load(sim, overrides, key, words):
    msg = _error(sim / "exp.yaml", overrides)
    assert msg.startswith(f"--set: key '{key}': ") and words in msg, msg


def test_a_missing_fusion_or_link_in_a_file_names_the_file(sim):
    exp = sim / "exp.yaml"
    exp.write_text(exp.read_text().replace("fusion: intermediate, ", ""))
    assert _error(exp).startswith(f"{exp}: key 'model.fusion': model.fusion is required")
    exp.write_text(exp.read_text().replace("model: {", "model: {fusion: intermediate, ").replace(
        ", link: {type: full_feature, wire_dtype: float32}", ""))
    assert _error(exp).startswith(f"{exp}: key 'model.link': model.link is required")


def test_every_shipped_experiment_names_its_fusion_and_link():
    """No shipped config relies on a default fusion or link (which is why a missing one is refused)."""
    from opencood_ext.config import load_yaml_tree
    from opencood_ext.models.fusion_methods import FUSION_METHODS
    seen = 0
    for path in sorted((SIM.parent).rglob("*.yaml")):
        data, _ = load_yaml_tree(path)
        if "name" not in data:
            continue  # an include
        model = data["model"]
        assert model.get("fusion"), path
        assert not FUSION_METHODS[model["fusion"]].needs_link or model.get("link"), path
        seen += 1
    assert seen > 40


def test_fusion_none_alone_may_name_types_outside_the_alliance():
    """configs/sim/m1_none.yaml: the m1 ego of the m1+m3 world, whose m3 agents take no part."""
    cfg = load_experiment(SIM / "m1_none.yaml")
    assert cfg.data.modality == "cycle:m1,m3" and list(cfg.data.agent_types) == ["m1"]
    msg = _error(SIM / "m1_none.yaml", ["model.fusion=late"])
    assert "['m3']" in msg and "data.modality" in msg
    msg = _error(SIM / "m1_none.yaml", ["data.modality=all:m3"])  # not even the ego's type
    assert "['m3']" in msg


# ---------------------------------------------------------------- includes and names

def test_name_cannot_leave_the_runs_root(sim):
    for bad in ("../x", "/tmp/x", "a/b", "..", ".", "", "a\\b"):
        msg = _error(sim / "exp.yaml", [f"name={bad!r}"])
        assert msg.startswith("--set: key 'name': ") and "plain name" in msg
    exp = sim / "exp.yaml"
    exp.write_text(exp.read_text().replace("name: x", "name: ../../outside"))
    assert _error(exp).startswith(f"{exp}: key 'name': ")
    assert load_experiment(sim / "exp.yaml", ["name=sim_m1m3-v2.1"]).name == "sim_m1m3-v2.1"


@pytest.mark.timeout(120)  # a hang guard: reading /dev/zero never ends
@pytest.mark.parametrize("target", ["/dev/zero", "DIR", "BIG"])
def test_base_includes_only_small_regular_files(tmp_path, target):
    """/dev/zero grew memory until the process was killed; now it is refused before reading."""
    if target == "DIR":
        (tmp_path / "sub").mkdir()
        target = str(tmp_path / "sub")
    elif target == "BIG":
        big = tmp_path / "big.yaml"
        big.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
        target = str(big)
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"name: x\nbase: [{target}]\n")
    msg = _error(exp)
    assert msg.startswith(f"{exp}: key 'base': ") and target in msg


def test_the_experiment_file_itself_must_be_a_small_regular_file(tmp_path):
    for path, words in (("/dev/zero", "not a regular file"), (str(tmp_path), "is a directory")):
        with pytest.raises(ConfigError, match=words):
            load_config(path, ExperimentConfig)


def test_every_link_with_a_wire_dtype_refuses_an_unknown_one_at_load():
    """The check reads each link's constructor annotation, so a new link gets it too."""
    import inspect

    from opencood_ext.experiment_checks import _LINK_DERIVED, _check_spec
    from opencood_ext.models.links import LINKS
    checked = []
    for name, cls in LINKS.items():
        if "wire_dtype" not in inspect.signature(cls.__init__).parameters:
            continue
        with pytest.raises(FieldError, match="float64") as err:
            _check_spec({"type": name, "wire_dtype": "float64"}, LINKS, ("model", "link"), _LINK_DERIVED)
        assert err.value.keys == [("model", "link", "wire_dtype")]
        assert _check_spec({"type": name, "wire_dtype": "int8"}, LINKS, ("model", "link"), _LINK_DERIVED) is cls
        checked.append(name)
    assert {"full_feature", "gencomm", "stamp", "mpda"} <= set(checked)


@pytest.mark.parametrize("overrides,key", [(["model.fusion=[intermediate]"], "model.fusion"),
                                           (["model.fusion_op={a: 1}"], "model.fusion_op"),
                                           (["model.link.type=[full_feature]"], "model.link.type"),
                                           (["model.agent_types.m1.encoder.voxel_size=[0.5, 0, 4]"],
                                            "model.agent_types.m1.encoder.voxel_size")])
def test_names_of_the_wrong_kind_are_one_line(sim, overrides, key):
    assert _error(sim / "exp.yaml", overrides).startswith(f"--set: key '{key}': ")


def test_a_model_sending_more_boxes_than_the_receiver_accepts_is_refused_at_load(sim):
    """Any model can run late fusion (--fusion_method late): its senders' max_boxes above the receiver's
    bound would have every box message rejected, so the pair is checked when the config loads."""
    msg = _error(sim / "exp.yaml", ["model.max_boxes=1500"])
    assert msg.startswith("--set: key 'model.max_boxes': model.max_boxes 1500 exceeds receiver.max_boxes 1000")
    cfg = load_experiment(sim / "exp.yaml", ["model.max_boxes=1500", "receiver.max_boxes=1500"])
    assert cfg.receiver.max_boxes == 1500
