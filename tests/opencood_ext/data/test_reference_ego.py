"""Under ``protocol: reference`` a stage-2 sample's ego is the reference's: the agent of the
``ego_modality`` type the data assigns, found as the reference's ``Adaptor.reorder_cav_list``
finds it; under ``native`` / ``equalized`` the first agent stays the ego.

The reference's rule, restated from its source (GenComm ``opencood/utils/heter_utils.py``
``Adaptor.reorder_cav_list`` and ``opencood/data_utils/datasets/basedataset/opv2v_basedataset.py``
``reinitialize``): the scenario's agent folders sorted as strings, a leading roadside unit (negative
id) moved last; in evaluation, when the first agent's type is not in ``ego_modality``, the first
agent in the assignment's own key order whose MAPPED type is leads and the assignment's other ids
follow, sorted; the first is the ego. The first agent's type is tested as the assignment names it
(BEFORE ``heter.mapping_dict``: an m2 mapped to m1 is not of ego type "m1"), the others' mapped: the
importer keeps the assignment as it is and writes the mapping as ``data.type_mapping``, which the
dataset applies after the ego rule. Checked on the published OPV2V and V2XSet assignments
(tests/assets/hypes/GenComm/opencood/modality_assign/, copied unchanged), where about half of the
scenarios (33 of 68, 30 of 58) begin with an agent mapped to m3, with the published OPV2V stage-2
yaml converted by the importer and its dataset built by ``build_dataset`` as a run builds it: every
scenario of both, the 4 V2XSet ones among them where the first vehicle is an m2 and the reference's
ego is a roadside unit "-1" of type m1.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import gencomm  # noqa: F401  (registers the GenComm link)
from opencood_ext import experiment
from opencood_ext.config import ConfigError
from opencood_ext.data.data_config import DataConfig
from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.formats import write_modality_json, write_opv2v_frame
from opencood_ext.data.frame import AgentObs, Frame
from opencood_ext.interop import convert_hypes_file

ASSETS = Path(__file__).parents[2] / "assets" / "hypes" / "GenComm" / "opencood"
STAGE2 = ASSETS / "hypes_yaml/opv2v/GenComm_yamls/gencomm/stage2/m1m3_att.yaml"
MAPPING = {"m1": "m1", "m2": "m1", "m3": "m3", "m4": "m3"}  # the stage-2 yaml's heter.mapping_dict


def reference_ego(assignment: dict, ego_modality: str = "m1", mapping=MAPPING) -> str:
    """The id the reference's evaluation makes the ego of one scenario (module docstring)."""
    cav_list = sorted(assignment)  # folder names, as strings
    if int(cav_list[0]) < 0:
        cav_list = cav_list[1:] + [cav_list[0]]
    if assignment[cav_list[0]] in ego_modality:  # its raw type, as the reference tests it
        return cav_list[0]
    for cav_id, modality in assignment.items():
        if mapping[modality] in ego_modality:
            return cav_id
    return cav_list[0]


# V2XSet scenarios whose first vehicle is assigned m2 (mapped to m1) while a roadside unit "-1" of type
# m1 sorts first among the assignment's keys: the reference's ego is the roadside unit, where a rule
# reading the mapped types would keep the vehicle
RAW_TYPE_SCENARIOS = {"v2xset": {"2021_08_23_16_42_39", "2021_08_23_22_31_01", "2021_09_09_19_27_35",
                                 "2021_09_09_23_21_21"}}


def _table(name):
    return json.loads((ASSETS / "modality_assign" / f"{name}_4modality.json").read_text())


def _frames(table):
    """One frame per scenario: its agents with the assigned types, as the reader gives them, all at one
    spot (in range)."""
    frames = []
    for scenario, cavs in table.items():
        agents = [AgentObs(int(cav), t, np.eye(4), np.zeros((0, 4), np.float32)) for cav, t in cavs.items()]
        frames.append(Frame(scenario, 0, agents, []))
    return frames


class _Reader(list):
    pass


@pytest.fixture
def stage2(tmp_path, monkeypatch):
    """The published stage-2 yaml converted (its assignment copied beside it, the mapping data.type_mapping)."""
    monkeypatch.chdir(ASSETS.parent)
    conv = convert_hypes_file(STAGE2, remap_to=tmp_path / "remapped.modality.json")
    (tmp_path / "remapped.modality.json").write_text(conv.files[tmp_path / "remapped.modality.json"])
    return conv.experiment()


def _egos(cfg, frames, monkeypatch, train=False):
    monkeypatch.setattr(experiment, "get_reader", lambda *a, **k: _Reader(frames))
    ds = experiment.build_dataset(cfg, "test", train=train)
    rng = np.random.default_rng(0)
    return [ds.select_agents(ds.read_frame(i), rng)[0] for i in range(len(frames))]


def test_the_converted_stage2_names_its_ego_type(stage2):
    assert stage2.protocol == "reference" and stage2.data.ego_types == ["m1"] and stage2.stage.new_types == ["m3"]
    assert experiment.reference_ego_types(stage2) == ["m1"]
    assert stage2.data.type_mapping == MAPPING  # the assignment's types are kept, mapped by the dataset
    assert json.loads(Path(stage2.data.modality).read_text()) == _table("opv2v")


@pytest.mark.parametrize("name, scenarios, m3_first", [("opv2v", 68, 33), ("v2xset", 58, 30)])
def test_every_scenario_gets_the_reference_ego(stage2, monkeypatch, name, scenarios, m3_first):
    table = _table(name)
    frames = _frames(table)
    by_string = [sorted(f.agents, key=lambda a: str(a.agent_id)) for f in frames]
    lead = [(a[1:] + a[:1])[0] if a[0].agent_id < 0 else a[0] for a in by_string]
    assert len(frames) == scenarios and sum(MAPPING[a.agent_type] == "m3" for a in lead) == m3_first
    egos = _egos(stage2, frames, monkeypatch)
    want = [int(reference_ego(cavs)) for cavs in table.values()]
    differ = {s for s, e, w in zip(table, egos, want) if e.agent_id != w}
    assert not differ, sorted(differ)
    # the scenarios where the first agent's assigned type decides: a rule on the mapped types keeps the vehicle
    by_mapped = {s for s, cavs in table.items()
                 if reference_ego(cavs) != reference_ego({c: MAPPING[t] for c, t in cavs.items()})}
    assert by_mapped == RAW_TYPE_SCENARIOS.get(name, set())
    has_m1 = [any(MAPPING[a.agent_type] == "m1" for a in f.agents) for f in frames]
    assert all(e.agent_type == "m1" for e, h in zip(egos, has_m1) if h)
    # the first-agent rule would have chosen another ego wherever an m3 agent leads and an m1 one exists,
    # or (the scenarios above) an m2 vehicle leads
    moved = [e.agent_id != f.agent_id for e, f in zip(egos, lead)]
    assert moved == [(MAPPING[f.agent_type] == "m3" and h) or s in RAW_TYPE_SCENARIOS.get(name, set())
                     for s, f, h in zip(table, lead, has_m1)] and sum(moved) > scenarios // 4


def test_training_under_reference_also_leads_with_the_ego_type(stage2, monkeypatch):
    """The reference's training gives its first (shuffled) agent an ego_modality type; ours leads with
    the ego-type agent its evaluation would pick, so a training sample's ego is of type m1 wherever the
    assignment has an m1 agent (ours types agents by the assignment in training too, the reference at
    random: a scenario without one keeps an m3 ego here)."""
    frames = _frames(_table("opv2v"))
    egos = _egos(stage2, frames, monkeypatch, train=True)
    has_m1 = [any(MAPPING[a.agent_type] == "m1" for a in f.agents) for f in frames]
    assert all(e.agent_type == "m1" for e, h in zip(egos, has_m1) if h) and sum(has_m1) > 50


def test_native_and_equalized_keep_the_first_agent(stage2, monkeypatch):
    frames = _frames(_table("opv2v"))
    for protocol in ("native", "equalized"):
        cfg = dataclasses.replace(stage2, protocol=protocol, data=dataclasses.replace(stage2.data, ego_types=None))
        assert experiment.reference_ego_types(cfg) is None
        egos = _egos(cfg, frames, monkeypatch)
        assert [e.agent_id for e in egos] == [f.agents[0].agent_id for f in frames]  # the reader's first
        assert [e.agent_type for e in egos] == [MAPPING[f.agents[0].agent_type] for f in frames]  # mapped


def test_stage_new_types_give_the_ego_types_when_unset(stage2, monkeypatch):
    """A shipped stage-2 config (no data.ego_types) under reference: its alliance's old types lead."""
    cfg = dataclasses.replace(stage2, data=dataclasses.replace(stage2.data, ego_types=None))
    assert experiment.reference_ego_types(cfg) == ["m1"]
    table = _table("opv2v")
    assert [e.agent_id for e in _egos(cfg, _frames(table), monkeypatch)] == \
        [int(reference_ego(c)) for c in table.values()]


def test_bad_ego_types_are_refused(stage2, tmp_path):
    with pytest.raises(ValueError, match="ego_types must name one or more of data.agent_types"):
        DataConfig(agent_types=stage2.data.agent_types, ego_types=["m7"])
    with pytest.raises(ValueError, match="names stage.new_types"):
        dataclasses.replace(stage2, data=dataclasses.replace(stage2.data, ego_types=["m3"]))
    conv = convert_hypes_file(STAGE2, remap_to=tmp_path / "remapped.json")
    path = tmp_path / "native.yaml"
    path.write_text(conv.yaml().replace("protocol: reference", "protocol: native"))
    with pytest.raises(ConfigError, match=rf"{path}.*data.ego_types.*under protocol reference"):
        experiment.load_experiment(path)


def _written(root, assignment):
    """One scenario on disk, as the published V2XSet 2021_08_23_16_42_39 begins: vehicles 214 and 223,
    roadside unit -1, each with a few LiDAR points (and the reduced scans m3 reads)."""
    pts = np.array([[5.0, 1.0, 0.0, 0.5], [8.0, -2.0, 0.5, 0.3]], np.float32)
    agents = [AgentObs(aid, "", np.eye(4), pts, lidar_beams={32: pts, 16: pts}, lidar_pose=np.zeros(6))
              for aid in (214, 223, -1)]
    write_opv2v_frame(root, "test", Frame("scn", "000068", agents, {}), write_cameras=False, bev_visibility=False)
    return write_modality_json(root / "assign.json", {"scn": assignment})


def test_a_run_reads_the_assignment_and_maps_it(stage2, tmp_path):
    """Through the real reader: the ego is the roadside unit (the first vehicle is an m2), every agent runs
    its mapped type; an assigned type the mapping lacks is refused when the dataset is built, naming the
    assignment file, scenario, agent and type."""
    path = _written(tmp_path / "data", {"-1": "m1", "214": "m2", "223": "m4"})
    cfg = dataclasses.replace(stage2, data=dataclasses.replace(stage2.data, root=str(tmp_path / "data"),
                                                               modality=str(path)))
    ds = experiment.build_dataset(cfg, "test", train=False)
    agents = ds.select_agents(ds.read_frame(0), np.random.default_rng(0))
    assert [(a.agent_id, a.agent_type) for a in agents] == [(-1, "m1"), (214, "m1"), (223, "m3")]
    native = dataclasses.replace(cfg, protocol="native", data=dataclasses.replace(cfg.data, ego_types=None))
    ds = experiment.build_dataset(native, "test", train=False)
    assert [(a.agent_id, a.agent_type) for a in ds.select_agents(ds.read_frame(0), np.random.default_rng(0))] == \
        [(214, "m1"), (223, "m3"), (-1, "m1")]
    _written(tmp_path / "data", {"-1": "m1", "214": "m5", "223": "m4"})
    with pytest.raises(DataFormatError, match=r"assign\.json.*scn.*agent 214.*m5"):
        experiment.build_dataset(cfg, "test", train=False)


def test_bad_type_mappings_are_refused(stage2, tmp_path):
    types = stage2.data.agent_types
    with pytest.raises(ValueError, match="data.type_mapping maps the types of an OPV2V-format assignment"):
        DataConfig(agent_types=types, modality="cycle:m1,m3", type_mapping=MAPPING)
    with pytest.raises(ValueError, match="maps every type outside data.agent_types"):
        DataConfig(agent_types=types, modality="a.json", type_mapping={"m1": "m7"})
    with pytest.raises(ValueError, match="must map each assigned type"):
        DataConfig(agent_types=types, modality="a.json", type_mapping={})
    conv = convert_hypes_file(STAGE2, remap_to=tmp_path / "remapped.json")
    path = tmp_path / "cycle.yaml"
    text = conv.yaml()
    assert "type_mapping:" in text and f"modality: {tmp_path / 'remapped.json'}" in text
    path.write_text(text.replace(f"modality: {tmp_path / 'remapped.json'}", "modality: cycle:m1,m3"))
    with pytest.raises(ConfigError, match=rf"{path}.*data.type_mapping"):
        experiment.load_experiment(path)
