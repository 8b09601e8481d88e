"""protocol: reference datasets on the real V2XSet fixture frame: the reference's agent order and
selection (max_cav before the range check), ground truth from the selected agents' labels only,
the agents' own-vehicle points removed; native unchanged."""
import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.data.dataset import AgentTypeData, CooperativeDataset, DataConfig
from opencood_ext.data.formats import OPV2VReader
from opencood_ext.data.frame import AgentObs, sort_agent_ids
from opencood_ext.data.reference import OWN_VEHICLE_BOX
from opencood_ext.geometry import boxes_inside_range, invert_transform, objects_to_boxes

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "v2xset_real"
RANGE = (-102.4, -51.2, -3.0, 102.4, 51.2, 1.0)
VOXELS = {"m1": (0.4, 0.4, 4.0), "m3": (0.4, 0.4, 4.0)}
# id -> (dx, dy) metres from the recorded agent 4279, in its axes. String order of the ids:
# "-1" "1041" "4279" "650" "99"; the reference moves the leading RSU last: 1041 is its ego.
OFFSETS = {4279: (0.0, 0.0), 1041: (10.0, 0.0), 650: (25.0, 5.0), 99: (-40.0, 0.0), -1: (10.0, 20.0)}
# a new object labelled by one agent only, at (dx, dy) from 4279
OWN_OBJECT = {1041: (18.0, -3.0), 650: (33.0, 9.0), 99: (-45.0, 4.0), -1: (14.0, 26.0)}


def _fixture():
    if not FIXTURES.exists():
        pytest.skip("../shared/fixtures is not present (a user's clone)")
    return OPV2VReader(FIXTURES, "validate", load_cameras=False)[0]


def _shift(T, dx, dy):
    S = np.eye(4)
    S[:2, 3] = dx, dy
    return T @ S


@pytest.fixture(scope="module")
def frame():
    """The fixture frame with four more agents (copies of 4279's scan at other poses) and one
    object each that only that agent labels."""
    f = _fixture()
    real = f.agents[0]
    template = f.objects[real.visible_ids[0]]
    agents = [real]
    for k, (aid, (dx, dy)) in enumerate(OFFSETS.items()):
        if aid == real.agent_id:
            continue
        oid = 9000 + k
        world = _shift(real.T_world_from_lidar, *OWN_OBJECT[aid])[:3, 3]
        f.objects[oid] = dataclasses.replace(copy.deepcopy(template), object_id=oid,
                                             location=np.r_[world[:2], template.location[2]])
        pose = _shift(real.T_world_from_lidar, dx, dy)
        agents.append(AgentObs(agent_id=aid, agent_type="m1", T_world_from_lidar=pose, lidar=real.lidar,
                               visible_ids=[oid, *real.visible_ids[:3]]))
    order = sort_agent_ids([a.agent_id for a in agents])  # as a reader lists them: vehicles by id, RSUs last
    return dataclasses.replace(f, agents=sorted(agents, key=lambda a: order.index(a.agent_id)))


def _dataset(frame, protocol, modality="all:m1", types=("m1",), cooperation="all"):
    cfg = DataConfig(modality=modality, lidar_range=RANGE, comm_range=30.0, max_agents=3,
                     agent_types={t: AgentTypeData() for t in types})
    return CooperativeDataset([frame], cfg, VOXELS, train=False, protocol=protocol, cooperation=cooperation)


def _expected_reference_selection(frame, comm_range=30.0, max_cav=3):
    """The reference's rule restated: string order, a leading RSU last, the first max_cav agents,
    then those within comm_range of the first."""
    ids = sorted((str(a.agent_id) for a in frame.agents))
    if ids[0].startswith("-"):
        ids = ids[1:] + ids[:1]
    taken = [frame.agent(int(i)) for i in ids[:max_cav]]
    ego = taken[0]
    return [a.agent_id for a in taken
            if np.linalg.norm(a.T_world_from_lidar[:2, 3] - ego.T_world_from_lidar[:2, 3]) <= comm_range]


def _gt_ids(frame, ego_id, labelled):
    ids = sorted({i for a in frame.agents if a.agent_id in labelled for i in a.visible_ids})
    T = invert_transform(frame.agent(ego_id).T_world_from_lidar)
    boxes = objects_to_boxes([frame.objects[i] for i in ids], T)
    return sorted(np.asarray(ids)[boxes_inside_range(boxes, RANGE)].tolist())


def test_reference_agent_order_and_selection(frame):
    selected = _expected_reference_selection(frame)
    assert selected == [1041, 4279, 650]  # the RSU is in range but past max_cav
    ref = _dataset(frame, "reference")[0]
    assert [a.agent_id for a in ref.agents] == selected and ref.ego_id == 1041
    native = _dataset(frame, "native")[0]
    assert native.ego_id == 99 and [a.agent_id for a in native.agents] == [99]  # nobody within 30 m of 99
    # an out-of-range agent still takes its place among the max_cav: with 4 places the fourth in
    # the reference's order (99, 50 m from the ego) is dropped and the RSU still is not reached
    wider = dataclasses.replace(_dataset(frame, "reference").cfg, max_agents=4)
    ds = CooperativeDataset([frame], wider, VOXELS, train=False, protocol="reference")
    assert [a.agent_id for a in ds[0].agents] == [1041, 4279, 650]


def test_reference_cycle_assignment_follows_its_order(frame):
    ds = _dataset(frame, "reference", modality="cycle:m1,m3", types=("m1", "m3"))
    assert {a.agent_id: a.agent_type for a in ds.read_frame(0).agents} == \
        {1041: "m1", 4279: "m3", 650: "m1", 99: "m3", -1: "m1"}
    # native: vehicles by id, then the RSU
    ds = _dataset(frame, "native", modality="cycle:m1,m3", types=("m1", "m3"))
    assert [(a.agent_id, a.agent_type) for a in ds.read_frame(0).agents] == \
        [(99, "m1"), (650, "m3"), (1041, "m1"), (4279, "m3"), (-1, "m1")]
    assert [a.agent_id for a in frame.agents] == [99, 650, 1041, 4279, -1]  # the reader's frame as it was


@pytest.mark.parametrize("cooperation", ["all", "ego_only"])
def test_reference_ground_truth_is_the_selected_agents_labels(frame, cooperation):
    ref = _dataset(frame, "reference", cooperation=cooperation)[0]
    expected = _gt_ids(frame, 1041, _expected_reference_selection(frame))
    assert sorted(ref.gt_ids.tolist()) == expected
    assert {9000 + k for k, aid in enumerate(OFFSETS) if aid in (1041, 650)} <= set(expected)
    # the labels of 99 (out of range) and of the RSU (past max_cav) are not ground truth
    assert not {9000 + k for k, aid in enumerate(OFFSETS) if aid in (99, -1)} & set(expected)
    native = _dataset(frame, "native", cooperation=cooperation)[0]
    assert sorted(native.gt_ids.tolist()) == _gt_ids(frame, 99, [a.agent_id for a in frame.agents])
    assert len(native.gt_ids) > len(ref.gt_ids)


def test_reference_removes_each_agents_own_points(frame):
    pts = frame.agents[0].lidar
    x0, x1, y0, y1 = OWN_VEHICLE_BOX
    own = (pts[:, 0] >= x0) & (pts[:, 0] <= x1) & (pts[:, 1] >= y0) & (pts[:, 1] <= y1)
    assert own.sum() > 100  # the recorded scan hits its own car
    ref = _dataset(frame, "reference")
    for a in ref[0].agents:  # every agent here carries the same scan in its own frame
        assert a.num_points == len(pts) - own.sum()
    kept = ref.lidar_points(frame.agents[0], 64)
    np.testing.assert_array_equal(kept, pts[~own])
    native = _dataset(frame, "native")
    assert native[0].agents[0].num_points == len(pts)
    np.testing.assert_array_equal(native.lidar_points(frame.agents[0], 64), pts)


def test_single_agent_fixture_is_the_same_ground_truth_under_both():
    """On the unaltered fixture (one agent) both rules give its 21 labels within the range."""
    f = _fixture()
    ref, native = _dataset(f, "reference")[0], _dataset(f, "native")[0]
    assert sorted(ref.gt_ids.tolist()) == sorted(native.gt_ids.tolist()) and len(ref.gt_ids) == 21


def test_protocol_is_checked():
    with pytest.raises(ValueError, match="protocol"):
        CooperativeDataset([], DataConfig(), VOXELS, train=False, protocol="heal")
