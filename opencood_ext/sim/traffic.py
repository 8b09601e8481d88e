"""Traffic: lane following with IDM speed control, curve speed limits and
junction reservations that keep vehicles out of each other's way.

* Each moving vehicle follows a route of lane ids (extended at random at each
  lane end) at arclength ``s`` of ``route[0]`` (its box centre).
* Car following: the vehicle's path ahead is sampled every metre; any other
  vehicle whose body (sampled along its length) comes within half-widths +
  margin of that path is an obstacle; the nearest one sets the IDM gap.
* Junctions: before entering a junction box a vehicle must hold a grant for
  its connector; a grant is refused while a vehicle on a conflicting connector
  (paths closer than ~3 m, see :mod:`roads`) holds one, or while the exit lane
  has no room. Without a grant the stop line acts as a standing obstacle.
  Requests are served nearest-first, so arrivals are first come, first served.

Time step: 0.05 s (CARLA's tick); the world saves every second tick (10 Hz).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from .following import first_obstacles
from .roads import RoadNetwork
from .vehicles import sample_class, sample_size


@dataclass
class TrafficParams:
    """The ``traffic`` config section."""

    vehicles: Tuple[int, int] = (20, 60)      # moving vehicles per scenario, drawn in [lo, hi]
    parked_per_100m: float = 4.0             # parked-car density along parking strips
    desired_speed_factor: Tuple[float, float] = (0.8, 1.05)
    max_accel: float = 1.8
    comfort_decel: float = 3.0
    max_decel: float = 8.0
    headway: Tuple[float, float] = (1.1, 1.6)  # IDM time gap T, s
    min_gap: float = 2.0                        # IDM s0, m
    lookahead: float = 60.0
    lateral_margin: float = 0.35
    long_vehicle: float = 7.0                   # m; longer ones take a junction alone
    starvation_s: float = 4.0                   # a request refused this long blocks newcomers


@dataclass
class Vehicle:
    vid: int
    cls: str
    size: np.ndarray            # full length, width, height
    color_index: int
    parked: bool = False
    route: List[int] = field(default_factory=list)
    history: List[int] = field(default_factory=list)   # lanes already left, most recent last
    s: float = 0.0
    v: float = 0.0
    desired: float = 1.0        # factor on the lane speed limit
    headway: float = 1.3
    x: float = 0.0
    y: float = 0.0
    yaw: float = 0.0            # radians
    grant: Optional[Tuple[int, int]] = None   # (junction id, connector lane id)
    rng: Optional[np.random.Generator] = None


class Traffic:
    """All vehicles of one scenario on a :class:`RoadNetwork`."""

    def __init__(self, network: RoadNetwork, rng: np.random.Generator, params: TrafficParams = TrafficParams()):
        self.net = network
        self.p = params
        self.rng = rng
        self.vehicles: List[Vehicle] = []
        self.time = 0.0
        self._next_id = int(rng.integers(100, 3000))
        self._occupants: Dict[int, Dict[int, int]] = {j.junction_id: {} for j in network.junctions}
        self._long: Dict[int, bool] = {}
        self._waiting: Dict[int, float] = {}   # vehicle id -> seconds its junction request was refused
        self._dt = 0.05

    # ------------------------------------------------------------------ spawning
    def _new(self, cls_name: str = "", parked: bool = False) -> Vehicle:
        cls = sample_class(self.rng, cls_name)
        veh = Vehicle(self._next_id, cls.name, sample_size(self.rng, cls), int(self.rng.integers(0, 10)),
                      parked=parked, desired=float(self.rng.uniform(*self.p.desired_speed_factor)),
                      headway=float(self.rng.uniform(*self.p.headway)),
                      rng=np.random.default_rng(self.rng.integers(2 ** 63)))
        self._next_id += int(self.rng.integers(1, 40))
        return veh

    def _free(self, x: float, y: float, length: float) -> bool:
        for o in self.vehicles:
            if np.hypot(o.x - x, o.y - y) < (length + o.size[0]) / 2 + 3.0:
                return False
        return True

    def spawn_moving(self, count: int, cls_name: str = "", near: Optional[Tuple[float, float, float]] = None,
                     attempts: int = 400) -> List[Vehicle]:
        """Place ``count`` vehicles on drive lanes (not junctions); ``near=(x, y, r)``
        keeps them within r metres of (x, y)."""
        lanes = [ln for ln in self.net.lanes if ln.kind in ("drive", "curve") and ln.length > 12.0]
        weights = np.array([ln.length for ln in lanes])
        placed = []
        for _ in range(attempts):
            if len(placed) == count:
                break
            veh = self._new(cls_name)
            lane = lanes[int(self.rng.choice(len(lanes), p=weights / weights.sum()))]
            margin = veh.size[0] / 2 + 1.0
            s = float(self.rng.uniform(margin, max(margin, lane.length - 15.0)))
            if near is not None:
                (x, y), _ = lane.sample(s)
                if np.hypot(x - near[0], y - near[1]) > near[2]:
                    continue
            if self.put_on_lane(veh, lane.lane_id, s):
                placed.append(veh)
        return placed

    def new_vehicle(self, cls_name: str = "") -> Vehicle:
        """A moving vehicle of class ``cls_name`` (any class when empty), not yet on the road."""
        return self._new(cls_name)

    def put_on_lane(self, veh: Vehicle, lane_id: int, s: float) -> bool:
        """Put ``veh`` with its centre at arclength ``s`` of lane ``lane_id`` at half its desired
        speed, when no other vehicle is within half their lengths + 3 m; False (nothing changed)
        when one is."""
        lane = self.net.lanes[lane_id]
        (x, y), yaw = lane.sample(s)
        if not self._free(x, y, veh.size[0]):
            return False
        veh.route, veh.s, veh.x, veh.y, veh.yaw = [lane.lane_id], s, float(x), float(y), float(yaw)
        veh.v = 0.5 * lane.speed_limit * veh.desired
        self._extend(veh)
        self._place(veh)
        self.vehicles.append(veh)
        return True

    def spawn_parked(self) -> List[Vehicle]:
        """Cars and vans along the parking strips (static, labelled)."""
        placed = []
        for strip in self.net.parking:
            d = np.array([np.cos(strip.heading), np.sin(strip.heading)])
            s = float(self.rng.uniform(0.0, 4.0))
            while s < strip.length:
                veh = self._new("Car" if self.rng.random() < 0.8 else "Van", parked=True)
                half = veh.size[0] / 2
                if s + 2 * half > strip.length:
                    break
                if self.rng.random() < self.p.parked_per_100m * 6.5 / 100.0:
                    x, y = strip.start + d * (s + half)
                    veh.x, veh.y, veh.yaw = float(x), float(y), float(strip.heading)
                    self.vehicles.append(veh)
                    placed.append(veh)
                s += 2 * half + float(self.rng.uniform(1.0, 2.5))
        return placed

    # ------------------------------------------------------------------ routing
    def _extend(self, veh: Vehicle) -> None:
        lanes = self.net.lanes
        ahead = lanes[veh.route[0]].length - veh.s + sum(lanes[i].length for i in veh.route[1:])
        while ahead < self.p.lookahead + 30.0:
            nxt = lanes[veh.route[-1]].successors
            pick = nxt[int(veh.rng.integers(len(nxt)))]
            if veh.size[0] > self.p.long_vehicle and len(nxt) > 1 and veh.rng.random() < 0.85:
                straight = [n for n in nxt if self._is_straight(n)]   # long vehicles keep to their street
                pick = straight[0] if straight else pick
            veh.route.append(pick)
            ahead += lanes[pick].length

    def _is_straight(self, lane_id: int) -> bool:
        pts = self.net.lanes[lane_id].points
        d0, d1 = pts[1] - pts[0], pts[-1] - pts[-2]
        return float(np.dot(d0, d1)) > 0.95 * np.linalg.norm(d0) * np.linalg.norm(d1)

    def _path(self, veh: Vehicle, behind: float = 0.0):
        """Route samples (about 1 m apart) from ``behind`` m behind the vehicle
        centre to the look-ahead: s (K,) path coordinate (0 = centre), xy (K, 2),
        speed limit (K,). Lanes already left (``history``) supply the part behind."""
        lanes = self.net.lanes
        seq = veh.history + veh.route
        base = -veh.s - sum(lanes[h].length for h in veh.history)
        out_s, out_xy, out_v = [], [], []
        for lid in seq:
            ln = lanes[lid]
            lo, hi = -behind - base, self.p.lookahead - base
            if hi > 0 and lo < ln.length:
                k0 = max(0, int(np.ceil(lo)))
                k1 = min(len(ln.dense_s), int(np.ceil(hi)))
                if k1 > k0:
                    out_s.append(ln.dense_s[k0:k1] + base)
                    out_xy.append(ln.dense_xy[k0:k1])
                    out_v.append(ln.dense_speed[k0:k1])
            base += ln.length
            if base >= self.p.lookahead:
                break
        if not out_s:
            return np.zeros(0), np.zeros((0, 2)), np.zeros(0)
        return np.concatenate(out_s), np.concatenate(out_xy), np.concatenate(out_v)

    @staticmethod
    def half_wheelbase(length: float) -> float:
        """Distance from the body centre to each axle, m (both axles ride on the path)."""
        return max(0.3 * float(length), 0.5 * float(length) - 1.3)

    # ------------------------------------------------------------------ stepping
    def _arrays(self):
        v = self.vehicles
        return (np.array([o.x for o in v]), np.array([o.y for o in v]), np.array([o.yaw for o in v]),
                np.array([o.size[0] for o in v]), np.array([o.size[1] for o in v]),
                np.array([o.v for o in v]))

    def _leaders(self, movers, paths, arrays):
        """Gap and leader speed for each moving vehicle (see :mod:`following`)."""
        x, y, yaw, length, width, speed = arrays
        return first_obstacles(movers, paths, x, y, yaw, length, width, speed,
                               [self.half_wheelbase(float(L)) for L in length], self.p.lateral_margin)

    def _idm(self, veh: Vehicle, v0: float, gap: float, v_lead: float, s0: float) -> float:
        p = self.p
        acc = p.max_accel * (1.0 - (veh.v / max(v0, 0.1)) ** 4)
        if np.isfinite(gap):
            s_star = s0 + veh.v * veh.headway + veh.v * (veh.v - v_lead) / (2 * np.sqrt(p.max_accel * p.comfort_decel))
            acc -= p.max_accel * (max(s_star, s0) / max(gap, 0.1)) ** 2
        return float(np.clip(acc, -p.max_decel, p.max_accel))

    def _junction_requests(self) -> Dict[int, float]:
        """Grant or refuse junction entries; returns vehicle index -> distance from
        its centre to a stop line it must not pass."""
        lanes = self.net.lanes
        rear: Dict[int, float] = {}  # lane id -> smallest rear-bumper s of vehicles on it
        requests = {}  # entry lane -> (distance, vehicle index, junction, connector); nearest per lane
        for i, veh in enumerate(self.vehicles):
            if veh.parked:
                continue
            r = veh.s - veh.size[0] / 2
            rear[veh.route[0]] = min(rear.get(veh.route[0], np.inf), r)
            if veh.grant is not None:
                continue
            dist = lanes[veh.route[0]].length - veh.s
            for n, lid in enumerate(veh.route[1:], start=1):
                ln = lanes[lid]
                if ln.kind == "connector":
                    reach = max(20.0, veh.v ** 2 / (2 * self.p.comfort_decel) + 12.0)
                    entry = veh.route[n - 1]
                    if dist < reach and (entry not in requests or dist < requests[entry][0]):
                        requests[entry] = (dist, i, ln.junction, lid)
                    break
                dist += ln.length
                if dist > self.p.lookahead:
                    break
        stops = {}
        # fairness: a request refused for long acts as a phantom occupant, so no
        # new conflicting grant (none at all, for a long vehicle) overtakes it
        phantoms: Dict[int, Dict[int, int]] = {}
        def priority(req):
            wait = self._waiting.get(self.vehicles[req[1]].vid, 0.0)
            return (0, -wait) if wait > self.p.starvation_s else (1, req[0])
        order = sorted(requests.values(), key=priority)
        for dist, i, jid, lid in order:
            veh = self.vehicles[i]
            occ = self._occupants[jid]
            held = {**occ, **phantoms.get(jid, {})}
            conflicts = self.net.junctions[jid].conflicts[lid]
            exit_lane = lanes[lid].successors[0]
            busy_exit = any(lanes[c].successors[0] == exit_lane for c in held.values() if c != lid)
            room = rear.get(exit_lane, np.inf) > veh.size[0] + 4.0
            committed = dist - veh.size[0] / 2 < 0.5  # already over the line: let it clear the box
            # long vehicles sweep wide when turning: they use a junction alone
            is_long = veh.size[0] > self.p.long_vehicle
            alone = not held if is_long else not any(self._long.get(v, False) for v in held)
            if committed or (room and alone and not busy_exit and not any(c in conflicts for c in held.values())):
                occ[veh.vid] = lid
                self._long[veh.vid] = is_long
                veh.grant = (jid, lid)
                self._waiting.pop(veh.vid, None)
            else:
                stops[i] = dist
                self._waiting[veh.vid] = self._waiting.get(veh.vid, 0.0) + self._dt
                # refused for a full exit lane, it waits longer before holding others back
                if self._waiting[veh.vid] > self.p.starvation_s * (1.0 if room else 2.0):
                    phantoms.setdefault(jid, {})[veh.vid] = lid
                    self._long[veh.vid] = is_long
        return stops

    def step(self, dt: float = 0.05) -> None:
        """Advance all moving vehicles by ``dt`` seconds."""
        movers = [i for i, v in enumerate(self.vehicles) if not v.parked]
        paths = {i: self._path(self.vehicles[i], behind=self.half_wheelbase(self.vehicles[i].size[0]) + 1.0)
                 for i in movers}
        self._dt = dt
        stops = self._junction_requests()
        leaders = self._leaders(movers, paths, self._arrays())
        acc = {}
        for i in movers:
            veh = self.vehicles[i]
            ps, _, pv = paths[i]
            pv = pv[ps >= 0]
            ps = ps[ps >= 0]
            if len(ps):
                reach = np.sqrt(pv ** 2 + 2 * self.p.comfort_decel * np.maximum(ps, 0.0))
                v0 = min(veh.desired * float(pv[0]), float(reach.min()))
            else:
                v0 = 1.0
            gap, v_lead = leaders[i]
            a = self._idm(veh, v0, gap, v_lead, self.p.min_gap)
            if i in stops:
                a = min(a, self._idm(veh, v0, stops[i] - veh.size[0] / 2, 0.0, 0.5))
            acc[i] = a
        for i, a in acc.items():
            self._advance(self.vehicles[i], a, dt)
        self.time += dt

    def _advance(self, veh: Vehicle, a: float, dt: float) -> None:
        lanes = self.net.lanes
        veh.v = max(0.0, veh.v + a * dt)
        veh.s += veh.v * dt
        while veh.s > lanes[veh.route[0]].length:
            veh.s -= lanes[veh.route[0]].length
            veh.history = (veh.history + [veh.route.pop(0)])[-3:]
        if veh.grant is not None:
            jid, lid = veh.grant
            if lid not in veh.route and veh.s - veh.size[0] / 2 > 0.5:
                self._occupants[jid].pop(veh.vid, None)
                veh.grant = None
        self._extend(veh)
        self._place(veh)

    def _place(self, veh: Vehicle) -> None:
        """Pose from the route: both axles (centre -/+ half wheelbase) on the path,
        body centre between them, heading along them -- long vehicles cut inside
        a turn instead of swinging out."""
        a = self.half_wheelbase(veh.size[0])
        rx, ry = self._route_point(veh, veh.s - a)
        fx, fy = self._route_point(veh, veh.s + a)
        veh.x, veh.y = (rx + fx) / 2, (ry + fy) / 2
        veh.yaw = float(np.arctan2(fy - ry, fx - rx))

    def _route_point(self, veh: Vehicle, s: float) -> Tuple[float, float]:
        """Point at arclength ``s`` of ``route[0]``; negative ``s`` walks back
        through ``history`` (and straight back beyond it)."""
        lanes = self.net.lanes
        if s < 0:
            for lid in reversed(veh.history):
                s += lanes[lid].length
                if s >= 0:
                    return lanes[lid].point(s)
            (x, y), h = lanes[(veh.history or veh.route)[0]].sample(0.0)
            return x + s * np.cos(h), y + s * np.sin(h)
        for lid in veh.route:
            if s <= lanes[lid].length:
                return lanes[lid].point(s)
            s -= lanes[lid].length
        return lanes[veh.route[-1]].point(lanes[veh.route[-1]].length)

    # ------------------------------------------------------------------ queries
    def moving(self) -> List[Vehicle]:
        return [v for v in self.vehicles if not v.parked]

    def footprints(self) -> np.ndarray:
        """(N, 4, 2) BEV corners of every vehicle (moving and parked)."""
        out = np.zeros((len(self.vehicles), 4, 2))
        for k, v in enumerate(self.vehicles):
            c, s = np.cos(v.yaw), np.sin(v.yaw)
            for m, (a, b) in enumerate(((1, 1), (1, -1), (-1, -1), (-1, 1))):
                lx, ly = a * v.size[0] / 2, b * v.size[1] / 2
                out[k, m] = (v.x + lx * c - ly * s, v.y + lx * s + ly * c)
        return out
