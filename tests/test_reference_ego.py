"""Under ``protocol: reference`` a stage-2 sample's ego is the reference's: the agent of the
``ego_modality`` type the data assigns, found as the reference's ``Adaptor.reorder_cav_list``
finds it; under ``native`` / ``equalized`` the first agent stays the ego.

The reference's rule, restated from its source (GenComm ``opencood/utils/heter_utils.py``
``Adaptor.reorder_cav_list`` and ``opencood/data_utils/datasets/basedataset/opv2v_basedataset.py``
``reinitialize``): the scenario's agent folders sorted as strings, a leading roadside unit (negative
id) moved last; in evaluation, when the first agent's type is not in ``ego_modality``, the first
agent in the assignment's own key order whose MAPPED type is leads and the assignment's other ids
follow, sorted; the first is the ego. Checked on the published OPV2V and V2XSet assignments
(tests/assets/hypes/GenComm/opencood/modality_assign/, copied unchanged), where about half of the
scenarios (33 of 68, 30 of 58) begin with an agent mapped to m3, with the published OPV2V stage-2
yaml converted by the importer and its dataset built by ``build_dataset`` as a run builds it.
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
from opencood_ext.data.frame import AgentObs, Frame
from opencood_ext.interop import convert_hypes_file

ASSETS = Path(__file__).parent / "assets" / "hypes" / "GenComm" / "opencood"
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


# The reference tests the first agent's type BEFORE the mapping (its raw assignment: "m2" is not in
# "m1") and searches the others after it; the importer writes the assignment already mapped (m2 -> m1),
# so ours keeps a first agent whose mapped type is m1. They differ only where a roadside unit "-1" of
# type m1 sorts first among the assignment's keys while the first vehicle is an m2: there the
# reference's ego is the roadside unit. docs/protocol.md (agent order) states it.
RAW_TYPE_GAP = {"v2xset": {"2021_08_23_16_42_39", "2021_08_23_22_31_01", "2021_09_09_19_27_35",
                           "2021_09_09_23_21_21"}}


def _table(name):
    return json.loads((ASSETS / "modality_assign" / f"{name}_4modality.json").read_text())


def _frames(table):
    """One frame per scenario: its agents with the mapped types, all at one spot (in range)."""
    frames = []
    for scenario, cavs in table.items():
        agents = [AgentObs(int(cav), MAPPING[t], np.eye(4), np.zeros((0, 4), np.float32)) for cav, t in cavs.items()]
        frames.append(Frame(scenario, 0, agents, []))
    return frames


class _Reader(list):
    pass


@pytest.fixture
def stage2(tmp_path, monkeypatch):
    """The published stage-2 yaml converted (its assignment remapped beside it)."""
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


@pytest.mark.parametrize("name, scenarios, m3_first", [("opv2v", 68, 33), ("v2xset", 58, 30)])
def test_every_scenario_gets_the_reference_ego(stage2, monkeypatch, name, scenarios, m3_first):
    table = _table(name)
    frames = _frames(table)
    by_string = [sorted(f.agents, key=lambda a: str(a.agent_id)) for f in frames]
    lead = [(a[1:] + a[:1])[0] if a[0].agent_id < 0 else a[0] for a in by_string]
    assert len(frames) == scenarios and sum(a.agent_type == "m3" for a in lead) == m3_first
    egos = _egos(stage2, frames, monkeypatch)
    want = [int(reference_ego(cavs)) for cavs in table.values()]
    differ = {s for s, e, w in zip(table, egos, want) if e.agent_id != w}
    assert differ == RAW_TYPE_GAP.get(name, set()), sorted(differ)
    has_m1 = [any(a.agent_type == "m1" for a in f.agents) for f in frames]
    assert all(e.agent_type == "m1" for e, h in zip(egos, has_m1) if h)
    # the first-agent rule would have chosen another ego wherever an m3 agent leads and an m1 one exists
    moved = [e.agent_id != f.agent_id for e, f in zip(egos, lead)]
    assert moved == [f.agent_type == "m3" and h for f, h in zip(lead, has_m1)] and sum(moved) > scenarios // 4


def test_training_under_reference_also_leads_with_the_ego_type(stage2, monkeypatch):
    """The reference's training gives its first (shuffled) agent an ego_modality type; ours leads with
    the ego-type agent its evaluation would pick, so a training sample's ego is of type m1 wherever the
    assignment has an m1 agent (ours types agents by the assignment in training too, the reference at
    random: a scenario without one keeps an m3 ego here)."""
    frames = _frames(_table("opv2v"))
    egos = _egos(stage2, frames, monkeypatch, train=True)
    has_m1 = [any(a.agent_type == "m1" for a in f.agents) for f in frames]
    assert all(e.agent_type == "m1" for e, h in zip(egos, has_m1) if h) and sum(has_m1) > 50


def test_native_and_equalized_keep_the_first_agent(stage2, monkeypatch):
    frames = _frames(_table("opv2v"))
    for protocol in ("native", "equalized"):
        cfg = dataclasses.replace(stage2, protocol=protocol, data=dataclasses.replace(stage2.data, ego_types=None))
        assert experiment.reference_ego_types(cfg) is None
        egos = _egos(cfg, frames, monkeypatch)
        assert [e.agent_id for e in egos] == [f.agents[0].agent_id for f in frames]  # the reader's first


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
