"""The ``road`` scene family: the connected vehicles share the ego's straight road.

The ego drives a straight ``drive`` lane; every collaborator sits on a lane of the same street
(the grid line the ego's lane lies on, across the junctions it meets), either

* in the ego's direction, ahead or behind it (any lane of that direction),
* oncoming, on a lane of the opposite direction, or
* in a platoon: a chain in the ego's own lane line, bumper to bumper gaps drawn from
  ``platoon_gap``, each new member in front of the chain or behind it.

So every collaborator heads along the ego's heading or its reverse (a straight street), unlike the
junction family, where they come from the crossing arms. Centres are ``road_gap`` apart along the
street (platoon members: as the chain gives) and never beyond ``comm_range``. Positions stay 15 m
short of a lane's end, as other moving traffic does, so that nobody has turned into a junction by
the first saved frame. Overlaps are refused as for any spawn (:meth:`Traffic.put_on_lane`).

Frame: world (left-handed, x forward, y right), metres; the "along" coordinate of a point is its
projection on the ego's lane direction, measured from the ego lane's start.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from .traffic import Traffic, Vehicle

END_MARGIN = 15.0        # m: no one is put closer than this to the end of its lane
PARALLEL_COS = 0.999     # lanes closer than ~2.6 deg to the ego's direction (or its reverse) count
SAME_STREET_LANES = 4.0  # lane widths: the farthest a lane of the same street lies from the ego's lane


@dataclass
class _StreetLane:
    """A drive lane of the ego's street: ``sign`` +1 (the ego's direction) or -1 (oncoming),
    ``along0`` the along coordinate of its first point, ``lateral`` its signed offset (m)."""

    lane_id: int
    sign: int
    along0: float
    lateral: float
    length: float


def _street(traffic: Traffic, ego_lane: int) -> List[_StreetLane]:
    """The drive lanes parallel to ``ego_lane`` within :data:`SAME_STREET_LANES` lane widths."""
    net = traffic.net
    ego = net.lanes[ego_lane]
    a = ego.points[0]
    u = (ego.points[-1] - a) / ego.length
    out = []
    for ln in net.drive_lanes():
        d = (ln.points[-1] - ln.points[0]) / ln.length
        c = float(d @ u)
        rel = ln.points[0] - a
        lateral = float(u[0] * rel[1] - u[1] * rel[0])
        if abs(c) >= PARALLEL_COS and abs(lateral) <= SAME_STREET_LANES * net.lane_width:
            out.append(_StreetLane(ln.lane_id, 1 if c > 0 else -1, float(rel @ u), lateral, ln.length))
    return out


def _arclength(lane: _StreetLane, along: float, half_length: float) -> Optional[float]:
    """Arclength on ``lane`` of the along coordinate ``along``, None when a vehicle of that half
    length would not fit there (1 m from the start, :data:`END_MARGIN` from the end)."""
    s = lane.sign * (along - lane.along0)
    return s if half_length + 1.0 <= s <= lane.length - END_MARGIN else None


def place_on_road(traffic: Traffic, rng: np.random.Generator, n_cav: int, p) -> List[Vehicle]:
    """Put ``n_cav`` connected cars on one street (module docstring); ``p`` is the ``agents``
    config section (:class:`opencood_ext.sim.builtin.AgentParams`). May return fewer (the caller
    removes them and tries again)."""
    lanes = [ln for ln in traffic.net.drive_lanes() if ln.length > 2 * END_MARGIN]
    ego_lane = lanes[int(rng.integers(len(lanes)))]
    ego = traffic.new_vehicle("Car")
    s0 = float(rng.uniform(ego.size[0] / 2 + 1.0, ego_lane.length - END_MARGIN))
    if not traffic.put_on_lane(ego, ego_lane.lane_id, s0):
        return []
    placed = [ego]
    street = _street(traffic, ego_lane.lane_id)
    own = [ln for ln in street if ln.sign == 1 and abs(ln.lateral) < 0.5]   # the ego's lane line
    chain = [(s0, ego.size[0] / 2)] * 2     # (along, half length) of the platoon's rear and front

    def put(candidates: List[_StreetLane], along: float, veh: Vehicle) -> bool:
        fits = [(ln, s) for ln in candidates for s in [_arclength(ln, along, veh.size[0] / 2)] if s is not None]
        if not fits:
            return False
        ln, s = fits[int(rng.integers(len(fits)))]
        x, y = traffic.net.lanes[ln.lane_id].point(s)
        if np.hypot(x - ego.x, y - ego.y) > p.comm_range or not traffic.put_on_lane(veh, ln.lane_id, s):
            return False
        placed.append(veh)
        return True

    members = int(rng.integers(1, n_cav)) if n_cav > 1 and rng.random() < p.platoon_probability else 0
    for _ in range(40 * n_cav):
        if len(placed) == n_cav:
            break
        veh = traffic.new_vehicle("Car")
        half = veh.size[0] / 2
        if len(placed) <= members:                        # next platoon member, at the front or the rear
            front = bool(rng.random() < 0.5)
            gap = float(rng.uniform(*p.platoon_gap))
            (along, h) = chain[1] if front else chain[0]
            along = along + (h + gap + half) * (1 if front else -1)
            if put(own, along, veh):
                chain[1 if front else 0] = (along, half)
            continue
        oncoming = bool(rng.random() < p.oncoming_probability)
        along = s0 + float(rng.uniform(*p.road_gap)) * (1 if rng.random() < 0.5 else -1)
        put([ln for ln in street if ln.sign == (-1 if oncoming else 1)], along, veh)
    return placed
