"""Road network, town props and traffic of the built-in simulator."""
import numpy as np
import pytest

from opencood_ext.sim.roads import RoadParams, generate_roads
from opencood_ext.sim.town import TownParams, generate_town
from opencood_ext.sim.traffic import Traffic, TrafficParams
from opencood_ext.sim.vehicles import BY_NAME, INSET, vehicle_mesh


def _junction_kinds(net):
    kinds = []
    for jn in net.junctions:
        entries = {ln.road for ln in net.lanes if ln.kind == "drive"
                   and any(net.lanes[s].junction == jn.junction_id for s in ln.successors)}
        kinds.append(len(entries))
    return kinds


def test_road_network_has_x_and_t_junctions_curves_and_multilane_roads():
    kinds, curves, lanes = [], 0, set()
    for seed in range(4):
        net = generate_roads(np.random.default_rng(seed))
        kinds += _junction_kinds(net)
        curves += sum(ln.kind == "curve" for ln in net.lanes)
        lanes |= set(net.lanes_per_edge)
        for ln in net.lanes:  # every lane continues somewhere and starts where its predecessor ends
            for s in ln.successors:
                assert np.linalg.norm(net.lanes[s].points[0] - ln.points[-1]) < 1e-6
    assert 4 in kinds and 3 in kinds, kinds
    assert curves > 0 and lanes == {1, 2}


def test_right_hand_traffic_in_the_left_handed_frame():
    net = generate_roads(np.random.default_rng(0))
    for ln in net.drive_lanes():
        d = ln.points[-1] - ln.points[0]
        d /= np.linalg.norm(d)
        e = net.edges[ln.road]
        mid = (net.nodes[e[0]] + net.nodes[e[1]]) / 2
        right = np.array([-d[1], d[0]])           # yaw + 90 deg: +x turns toward +y
        offset = np.dot((ln.points[0] + ln.points[-1]) / 2 - mid, right)
        assert offset == pytest.approx((ln.index + 0.5) * net.lane_width, abs=1e-6)


def test_town_same_seed_same_town_and_props_exist():
    p = TownParams(raster_res=0.5, roads=RoadParams(grid_nodes=(3, 3)))
    a, b = generate_town(np.random.default_rng(7), p), generate_town(np.random.default_rng(7), p)
    c = generate_town(np.random.default_rng(8), p)
    assert np.array_equal(a.ground.codes, b.ground.codes) and len(a.parts) == len(b.parts)
    assert all(np.array_equal(x.mesh[0], y.mesh[0]) for x, y in zip(a.parts, b.parts))
    assert a.ground.codes.shape != c.ground.codes.shape or not np.array_equal(a.ground.codes, c.ground.codes)
    classes = {q.cls for q in a.parts}
    assert {"building", "pole", "vegetation"} <= classes
    # props stand off the road: every prop vertex at ground level is on a raised (non-road) cell
    for part in a.parts:
        v = part.mesh[0]
        foot = v[v[:, 2] < 0.2]
        for x, y, _ in foot[:4]:
            j, i = a.cell((x, y))
            assert a.raised[j, i], (part.cls, x, y)


def test_vehicle_meshes_stay_inside_their_label_boxes():
    for name, cls in BY_NAME.items():
        size = np.array([np.mean(cls.length), np.mean(cls.width), np.mean(cls.height)])
        v, t, part = vehicle_mesh(name, size)
        assert (np.abs(v[:, 0]) <= size[0] / 2 - INSET + 0.02).all()
        assert (np.abs(v[:, 1]) <= size[1] / 2 - INSET + 0.02).all()
        assert v[:, 2].min() >= 0.0 and v[:, 2].max() <= size[2]
        assert len(t) == len(part) and set(np.unique(part)) == {0, 1, 2}


def _sat_overlap(a, b) -> bool:
    for poly in (a, b):
        for k in range(4):
            e = poly[(k + 1) % 4] - poly[k]
            n = np.array([-e[1], e[0]])
            pa, pb = a @ n, b @ n
            if pa.max() < pb.min() or pb.max() < pa.min():
                return False
    return True


def _town_with_traffic(seed, moving):
    """A generated road network with ``moving`` vehicles on it plus the parked ones."""
    rng = np.random.default_rng(seed)
    net = generate_roads(rng)
    tr = Traffic(net, rng, TrafficParams(vehicles=(moving, moving)))
    tr.spawn_moving(moving)
    tr.spawn_parked()
    return net, tr


@pytest.mark.parametrize("seed", [0, 4])
def test_traffic_moves_without_collisions(seed):
    net, tr = _town_with_traffic(seed, 40)
    moving = tr.moving()
    assert len(moving) == 40 and len(tr.vehicles) > 40
    start = np.array([[v.x, v.y] for v in moving])
    classes = {v.cls for v in tr.vehicles}
    for cls in classes:
        for v in tr.vehicles:
            if v.cls == cls:
                lo, hi = BY_NAME[cls].length
                assert lo <= v.size[0] <= hi
    for k in range(300):     # 15 s
        tr.step(0.05)
        if k % 5 == 0:
            fp = tr.footprints()
            c = fp.mean(axis=1)
            for i in range(len(fp)):
                near = np.nonzero(np.linalg.norm(c[i + 1:] - c[i], axis=1) < 14.0)[0] + i + 1
                for j in near:
                    assert not _sat_overlap(fp[i], fp[j]), (k, tr.vehicles[i].vid, tr.vehicles[j].vid)
    moved = np.linalg.norm(np.array([[v.x, v.y] for v in moving]) - start, axis=1)
    assert np.median(moved) > 20.0       # most vehicles got somewhere in 15 s
    assert max(v.v for v in moving) <= max(ln.speed_limit for ln in net.lanes) * 1.06


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 6, 9])
def test_no_gridlock_over_80_seconds(seed):
    net, tr = _town_with_traffic(seed, 55)
    still = {v.vid: 0 for v in tr.moving()}
    worst = 0
    for _ in range(1600):
        tr.step(0.05)
        for v in tr.moving():
            still[v.vid] = still[v.vid] + 1 if v.v < 0.2 else 0
        worst = max(worst, max(still.values()))
    assert worst * 0.05 < 45.0
