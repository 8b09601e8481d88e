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
from scipy.spatial import cKDTree

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


@dataclass
class Vehicle:
    vid: int
    cls: str
    size: np.ndarray            # full length, width, height
    color_index: int
    parked: bool = False
    route: List[int] = field(default_factory=list)
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
            (x, y), yaw = lane.sample(s)
            if near is not None and np.hypot(x - near[0], y - near[1]) > near[2]:
                continue
            if not self._free(x, y, veh.size[0]):
                continue
            veh.route, veh.s, veh.x, veh.y, veh.yaw = [lane.lane_id], s, float(x), float(y), float(yaw)
            veh.v = 0.5 * lane.speed_limit * veh.desired
            self._extend(veh)
            self._place(veh)
            self.vehicles.append(veh)
            placed.append(veh)
        return placed

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
            veh.route.append(pick)
            ahead += lanes[pick].length

    def _path(self, veh: Vehicle):
        """Route samples (1 m apart) ahead of the vehicle centre: s (K,) path
        coordinate, xy (K, 2), speed limit (K,)."""
        lanes = self.net.lanes
        out_s, out_xy, out_v = [], [], []
        base = -veh.s  # path coordinate of the current lane's start
        for n, lid in enumerate(veh.route):
            ln = lanes[lid]
            k0 = int(np.ceil(veh.s)) if n == 0 else 0
            k1 = min(len(ln.dense_s), int(np.ceil(self.p.lookahead - base)))
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

    # ------------------------------------------------------------------ stepping
    def _arrays(self):
        v = self.vehicles
        return (np.array([o.x for o in v]), np.array([o.y for o in v]), np.array([o.yaw for o in v]),
                np.array([o.size[0] for o in v]), np.array([o.size[1] for o in v]),
                np.array([o.v for o in v]))

    def _bodies(self, x, y, yaw, length, width):
        """Points along every vehicle's length axis: xy (P, 2), owner (P,), radius (P,)."""
        n = np.maximum(2, np.ceil(length / 1.5).astype(int) + 1)
        owner = np.repeat(np.arange(len(x)), n)
        k = np.arange(owner.size) - np.repeat(np.cumsum(n) - n, n)
        half = (length - width)[owner] / 2
        t = -half + k * (2 * half / (n[owner] - 1))
        xy = np.c_[x[owner] + t * np.cos(yaw[owner]), y[owner] + t * np.sin(yaw[owner])]
        return xy, owner, width[owner] / 2

    def _leaders(self, movers, paths, arrays):
        """For each moving vehicle index: (distance its centre can still advance
        along its path before its body -- swept along the path -- would touch
        another vehicle's current body, that vehicle's speed along the path);
        (inf, 0) when the look-ahead is clear."""
        x, y, yaw, length, width, speed = arrays
        bxy, bown, brad = self._bodies(x, y, yaw, length, width)
        out = {i: (np.inf, 0.0) for i in movers}
        qxy, qown, qs, qhead = [], [], [], []
        for i in movers:
            s, xy, _ = paths[i]
            keep = s >= 0.5
            s, xy = s[keep], xy[keep]
            if len(s) < 2:
                continue
            d = np.gradient(xy, axis=0)
            head = np.arctan2(d[:, 1], d[:, 0])
            half = (length[i] - width[i]) / 2
            t = np.linspace(-half, half, max(2, int(np.ceil(length[i] / 1.5)) + 1))
            pts = xy[:, None, :] + t[None, :, None] * np.stack([np.cos(head), np.sin(head)], -1)[:, None, :]
            qxy.append(pts.reshape(-1, 2))
            qown.append(np.full(pts.shape[0] * pts.shape[1], i))
            qs.append(np.repeat(s, len(t)))
            qhead.append(np.repeat(head, len(t)))
        if not qxy:
            return out
        qxy, qown, qs, qhead = (np.concatenate(v) for v in (qxy, qown, qs, qhead))
        max_reach = width.max() + self.p.lateral_margin
        dist, idx = cKDTree(bxy).query(qxy, k=min(8, len(bxy)), distance_upper_bound=max_reach)
        dist, idx = dist.reshape(len(qxy), -1), idx.reshape(len(qxy), -1)
        valid = idx < len(bxy)
        idx = np.where(valid, idx, 0)
        reach = width[qown][:, None] / 2 + brad[idx] + self.p.lateral_margin
        hit = valid & (dist < reach) & (bown[idx] != qown[:, None])          # (Q, k)
        rows = np.nonzero(hit.any(axis=1))[0]
        if not len(rows):
            return out
        order = np.lexsort((qs[rows], qown[rows]))                           # by owner, then path s
        rows = rows[order]
        owners, first = np.unique(qown[rows], return_index=True)
        for i, r in zip(owners, rows[first]):
            j = bown[idx[r, np.argmax(hit[r])]]
            rel = float(speed[j] * max(0.0, np.cos(yaw[j] - qhead[r])))
            out[int(i)] = (max(0.0, float(qs[r]) - 1.0), rel)
        return out

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
        for dist, i, jid, lid in sorted(requests.values()):
            veh = self.vehicles[i]
            occ = self._occupants[jid]
            conflicts = self.net.junctions[jid].conflicts[lid]
            exit_lane = lanes[lid].successors[0]
            busy_exit = any(lanes[c].successors[0] == exit_lane for c in occ.values() if c != lid)
            room = rear.get(exit_lane, np.inf) > veh.size[0] + 4.0
            committed = dist - veh.size[0] / 2 < 0.5  # already over the line: let it clear the box
            # long vehicles sweep wide when turning: they use a junction alone
            long_inside = any(self._long[v] for v in occ)
            alone = not occ if veh.size[0] > self.p.long_vehicle else not long_inside
            if committed or (room and alone and not busy_exit and not any(c in conflicts for c in occ.values())):
                occ[veh.vid] = lid
                self._long[veh.vid] = veh.size[0] > self.p.long_vehicle
                veh.grant = (jid, lid)
            else:
                stops[i] = dist
        return stops

    def step(self, dt: float = 0.05) -> None:
        """Advance all moving vehicles by ``dt`` seconds."""
        movers = [i for i, v in enumerate(self.vehicles) if not v.parked]
        paths = {i: self._path(self.vehicles[i]) for i in movers}
        stops = self._junction_requests()
        leaders = self._leaders(movers, paths, self._arrays())
        acc = {}
        for i in movers:
            veh = self.vehicles[i]
            ps, _, pv = paths[i]
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
            veh.route.pop(0)
        if veh.grant is not None:
            jid, lid = veh.grant
            if lid not in veh.route and veh.s - veh.size[0] / 2 > 0.5:
                self._occupants[jid].pop(veh.vid, None)
                veh.grant = None
        self._extend(veh)
        self._place(veh)

    def _place(self, veh: Vehicle) -> None:
        """Pose from the route: centre at s, heading from a centred difference
        (smooth through lane joints)."""
        veh.x, veh.y = self._route_point(veh, veh.s)
        ax, ay = self._route_point(veh, veh.s + 0.75)
        bx, by = self._route_point(veh, veh.s - 0.75)
        veh.yaw = float(np.arctan2(ay - by, ax - bx))

    def _route_point(self, veh: Vehicle, s: float) -> Tuple[float, float]:
        lanes = self.net.lanes
        if s < 0:
            x, y = lanes[veh.route[0]].point(0.0)
            return x + s * np.cos(veh.yaw), y + s * np.sin(veh.yaw)
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
