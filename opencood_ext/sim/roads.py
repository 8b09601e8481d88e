"""Procedural road network: a jittered street grid with some streets removed,
giving four-way (X) and T junctions, rounded corners (curves) and
multi-lane two-way streets with optional parking strips.

World frame: left-handed (x forward, y right, z up). Traffic keeps RIGHT: for
a heading ``d = (dx, dy)`` the right-hand side is ``r = (-dy, dx)`` (a yaw of
+90 deg turns +x toward +y). The lane graph is a list of :class:`Lane`
centre-line polylines linked by ``successors``; lanes inside a junction box
(``junction >= 0``) are connectors whose conflicts are precomputed.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Dict, List, Set, Tuple

import numpy as np


@dataclass
class RoadParams:
    """Road-network generator settings (the ``town.roads`` config section)."""

    grid_nodes: Tuple[int, int] = (3, 4)         # nodes per axis, drawn in [lo, hi]
    spacing: Tuple[float, float] = (70.0, 105.0)  # metres between grid lines
    lane_width: float = 3.5
    two_lane_probability: float = 0.5             # lanes per direction: 2 else 1
    drop_edges: Tuple[int, int] = (1, 3)          # interior streets removed
    curve_radius: Tuple[float, float] = (17.0, 25.0)
    parking_probability: float = 0.4
    parking_width: float = 2.5
    speed_limit_kmh: Tuple[float, float] = (40.0, 50.0)
    lateral_accel: float = 2.2                    # m/s^2, limits speed in curves
    junction_margin: float = 5.0                  # stop line to the crossing street's curb, m


@dataclass
class Lane:
    """A lane centre line. points: (M, 2); s: (M,) arclength; speed: (M,) max m/s.

    kind: "drive" (straight street), "curve" (rounded corner) or "connector"
    (inside junction ``junction``); index: 0 next to the centre line.
    """

    lane_id: int
    points: np.ndarray
    kind: str
    index: int
    speed_limit: float
    road: int = -1
    junction: int = -1
    successors: List[int] = field(default_factory=list)
    s: np.ndarray = field(init=False)
    speed: np.ndarray = field(init=False)
    lateral_accel: float = 2.2

    def __post_init__(self):
        p = np.asarray(self.points, float)
        seg = np.linalg.norm(np.diff(p, axis=0), axis=1)
        self.points = p
        self.s = np.concatenate([[0.0], np.cumsum(seg)])
        curv = np.zeros(len(p))
        if len(p) >= 3:
            a, b, c = p[:-2], p[1:-1], p[2:]
            ab, bc, ca = (np.linalg.norm(b - a, axis=1), np.linalg.norm(c - b, axis=1),
                          np.linalg.norm(a - c, axis=1))
            cross = np.abs((b - a)[:, 0] * (c - a)[:, 1] - (b - a)[:, 1] * (c - a)[:, 0])
            curv[1:-1] = 2 * cross / np.maximum(ab * bc * ca, 1e-9)
            curv[0], curv[-1] = curv[1], curv[-2]
        self.speed = np.minimum(self.speed_limit, np.sqrt(self.lateral_accel / np.maximum(curv, 1e-6)))
        # 1 m samples for path look-ahead and plain lists for scalar look-ups
        self.dense_s = np.arange(0.0, self.s[-1], 1.0)
        self.dense_xy = self.sample(self.dense_s)[0]
        self.dense_speed = np.interp(self.dense_s, self.s, self.speed)
        self._s_list = self.s.tolist()
        self._pts_list = self.points.tolist()

    @property
    def length(self) -> float:
        return float(self.s[-1])

    def point(self, s: float) -> Tuple[float, float]:
        """Scalar fast path of :meth:`sample` (position only)."""
        sl = self._s_list
        s = min(max(s, 0.0), sl[-1])
        k = min(max(bisect_right(sl, s) - 1, 0), len(sl) - 2)
        (x0, y0), (x1, y1) = self._pts_list[k], self._pts_list[k + 1]
        f = (s - sl[k]) / max(sl[k + 1] - sl[k], 1e-9)
        return x0 + f * (x1 - x0), y0 + f * (y1 - y0)

    def sample(self, s) -> Tuple[np.ndarray, np.ndarray]:
        """Positions (..., 2) and headings (..., ) rad at arclength(s) ``s`` (clamped)."""
        s = np.clip(np.asarray(s, float), 0.0, self.length)
        k = np.clip(np.searchsorted(self.s, s, side="right") - 1, 0, len(self.s) - 2)
        seg = self.points[k + 1] - self.points[k]
        span = np.maximum(self.s[k + 1] - self.s[k], 1e-9)
        f = ((s - self.s[k]) / span)[..., None]
        return self.points[k] + f * seg, np.arctan2(seg[..., 1], seg[..., 0])


@dataclass
class Junction:
    """A junction box: centre (2,), half_size (2,) along x and y; connectors and
    their conflicts (connector lane id -> set of lane ids it must not share the
    box with)."""

    junction_id: int
    center: np.ndarray
    half_size: np.ndarray
    connectors: List[int] = field(default_factory=list)
    conflicts: Dict[int, Set[int]] = field(default_factory=dict)


@dataclass
class ParkingStrip:
    """Parking along a street edge: from ``start`` (2,) in direction ``heading`` for ``length`` m."""

    start: np.ndarray
    heading: float
    length: float


@dataclass
class RoadNetwork:
    lanes: List[Lane]
    junctions: List[Junction]
    parking: List[ParkingStrip]
    nodes: np.ndarray                 # (N, 2)
    edges: List[Tuple[int, int]]
    lanes_per_edge: List[int]
    lane_width: float
    half_widths: List[float]          # per edge, curb to centre line

    def drive_lanes(self) -> List[Lane]:
        return [ln for ln in self.lanes if ln.kind == "drive"]


def _bezier(p0, h0, p1, h1, step: float = 0.5) -> np.ndarray:
    """Cubic Bezier from p0 heading h0 to p1 heading h1, circular-arc-like tangents."""
    chord = float(np.linalg.norm(p1 - p0))
    cosang = float(np.clip(np.dot(h0, h1), -1.0, 1.0))
    theta = np.arccos(cosang)
    if theta < 1e-3:
        ctrl = chord / 3.0
    else:
        radius = chord / (2 * np.sin(theta / 2))
        ctrl = 4.0 / 3.0 * np.tan(theta / 4) * radius
    c0, c1 = p0 + h0 * ctrl, p1 - h1 * ctrl
    n = max(4, int(np.ceil(chord / step)) + 1)
    t = np.linspace(0, 1, n)[:, None]
    return ((1 - t) ** 3) * p0 + 3 * ((1 - t) ** 2) * t * c0 + 3 * (1 - t) * t * t * c1 + t ** 3 * p1


def _connected(n: int, edges) -> bool:
    adj = {i: [] for i in range(n)}
    for a, b in edges:
        adj[a].append(b)
        adj[b].append(a)
    seen, stack = {0}, [0]
    while stack:
        for m in adj[stack.pop()]:
            if m not in seen:
                seen.add(m)
                stack.append(m)
    return len(seen) == n


def _grid(rng, p: RoadParams):
    nx, ny = (int(rng.integers(p.grid_nodes[0], p.grid_nodes[1] + 1)) for _ in range(2))
    xs = np.concatenate([[0.0], np.cumsum(rng.uniform(*p.spacing, nx - 1))])
    ys = np.concatenate([[0.0], np.cumsum(rng.uniform(*p.spacing, ny - 1))])
    xs -= xs.mean()
    ys -= ys.mean()
    nodes = np.array([[x, y] for y in ys for x in xs])
    idx = lambda i, j: j * nx + i  # noqa: E731
    edges, line = [], []
    for j in range(ny):
        for i in range(nx - 1):
            edges.append((idx(i, j), idx(i + 1, j)))
            line.append(("row", j))
    for i in range(nx):
        for j in range(ny - 1):
            edges.append((idx(i, j), idx(i, j + 1)))
            line.append(("col", i))
    boundary = [(line[k][0] == "row" and line[k][1] in (0, ny - 1)) or
                (line[k][0] == "col" and line[k][1] in (0, nx - 1)) for k in range(len(edges))]
    keep = list(range(len(edges)))
    interior = [k for k in keep if not boundary[k]]
    for k in rng.permutation(interior)[: int(rng.integers(p.drop_edges[0], p.drop_edges[1] + 1))]:
        trial = [e for e in keep if e != k]
        deg = np.bincount(np.array([edges[e] for e in trial]).ravel(), minlength=len(nodes))
        if deg.min() >= 2 and _connected(len(nodes), [edges[e] for e in trial]):
            keep = trial
    lines = {key: (2 if rng.random() < p.two_lane_probability else 1) for key in sorted(set(line))}
    return nodes, [edges[k] for k in keep], [lines[line[k]] for k in keep]


def generate_roads(rng: np.random.Generator, p: RoadParams = RoadParams()) -> RoadNetwork:
    """Build a road network from ``rng`` (deterministic for a given generator state)."""
    nodes, edges, nlanes = _grid(rng, p)
    inc: Dict[int, List[int]] = {i: [] for i in range(len(nodes))}
    for e, (a, b) in enumerate(edges):
        inc[a].append(e)
        inc[b].append(e)

    def direction(e, node):  # unit vector pointing away from ``node`` along edge e
        a, b = edges[e]
        d = nodes[b] - nodes[a] if node == a else nodes[a] - nodes[b]
        return d / np.linalg.norm(d)

    kind = {}
    for n, es in inc.items():
        if len(es) >= 3:
            kind[n] = "junction"
        else:
            kind[n] = "pass" if abs(np.dot(direction(es[0], n), direction(es[1], n))) > 0.9 else "corner"
    changed = True
    while changed:  # lanes must match through corners and pass-through nodes
        changed = False
        for n, es in inc.items():
            if kind[n] != "junction" and nlanes[es[0]] != nlanes[es[1]]:
                nlanes[es[0]] = nlanes[es[1]] = min(nlanes[es[0]], nlanes[es[1]])
                changed = True
    w = p.lane_width
    parking = [bool(rng.random() < p.parking_probability) for _ in edges]
    half = [nlanes[e] * w + (p.parking_width if parking[e] else 0.0) for e in range(len(edges))]
    limits = [rng.uniform(*p.speed_limit_kmh) / 3.6 for _ in edges]
    radius = {n: rng.uniform(*p.curve_radius) for n in inc}
    trim: Dict[Tuple[int, int], float] = {}
    junctions: List[Junction] = []
    jid_of: Dict[int, int] = {}
    for n, es in inc.items():
        if kind[n] == "junction":
            hx = max(half[e] for e in es if abs(direction(e, n)[1]) > 0.5) + p.junction_margin
            hy = max(half[e] for e in es if abs(direction(e, n)[0]) > 0.5) + p.junction_margin
            jid_of[n] = len(junctions)
            junctions.append(Junction(len(junctions), nodes[n].copy(), np.array([hx, hy])))
            for e in es:
                trim[(e, n)] = hx if abs(direction(e, n)[0]) > 0.5 else hy
        for e in es:
            if kind[n] == "corner":
                trim[(e, n)] = radius[n]
            elif kind[n] == "pass":
                trim[(e, n)] = 0.0

    lanes: List[Lane] = []
    ends: Dict[int, List[Tuple[int, int, int, np.ndarray]]] = {n: [] for n in inc}   # lanes ending at n
    starts: Dict[int, List[Tuple[int, int, int, np.ndarray]]] = {n: [] for n in inc}  # lanes starting at n
    strips: List[ParkingStrip] = []
    for e, (a, b) in enumerate(edges):
        for src, dst in ((a, b), (b, a)):
            d = direction(e, src)
            r = np.array([-d[1], d[0]])
            p0 = nodes[src] + d * trim[(e, src)]
            p1 = nodes[dst] - d * trim[(e, dst)]
            for k in range(nlanes[e]):
                off = r * (k + 0.5) * w
                lane = Lane(len(lanes), np.stack([p0 + off, p1 + off]), "drive", k, limits[e], road=e,
                            lateral_accel=p.lateral_accel)
                lanes.append(lane)
                starts[src].append((lane.lane_id, e, k, d))
                ends[dst].append((lane.lane_id, e, k, d))
            length = float(np.linalg.norm(p1 - p0))
            if parking[e] and length > 30.0:
                st = p0 + d * 8.0 + r * (nlanes[e] * w + p.parking_width / 2)
                strips.append(ParkingStrip(st, float(np.arctan2(d[1], d[0])), length - 16.0))

    def link(src_lane, dst_lane, kind_, index, speed, junction=-1):
        a, b = lanes[src_lane], lanes[dst_lane]
        ha = a.points[-1] - a.points[-2]
        hb = b.points[1] - b.points[0]
        pts = _bezier(a.points[-1], ha / np.linalg.norm(ha), b.points[0], hb / np.linalg.norm(hb))
        ln = Lane(len(lanes), pts, kind_, index, speed, junction=junction, successors=[dst_lane],
                  lateral_accel=p.lateral_accel)
        lanes.append(ln)
        a.successors.append(ln.lane_id)
        return ln.lane_id

    for n in inc:
        if kind[n] == "pass":
            for lid, e, k, d in ends[n]:
                for lid2, e2, k2, d2 in starts[n]:
                    if e2 != e and k2 == k:
                        lanes[lid].successors.append(lid2)
        elif kind[n] == "corner":
            for lid, e, k, d in ends[n]:
                for lid2, e2, k2, d2 in starts[n]:
                    if e2 != e and k2 == k:
                        link(lid, lid2, "curve", k, min(limits[e], limits[e2]))
        else:
            jn = junctions[jid_of[n]]
            for lid, e, k, d in ends[n]:
                made = []
                for lid2, e2, k2, d2 in starts[n]:
                    if e2 == e:
                        continue  # no U-turns
                    cross = d[0] * d2[1] - d[1] * d2[0]  # > 0: right turn (left-handed frame)
                    if np.dot(d, d2) > 0.9:
                        ok = k2 == k
                    elif cross > 0:
                        ok = k == nlanes[e] - 1 and k2 == nlanes[e2] - 1
                    else:
                        ok = k == 0 and k2 == 0
                    if ok:
                        made.append(link(lid, lid2, "connector", k, min(limits[e], limits[e2]), jn.junction_id))
                if not made:  # a lane that would dead-end merges straight on
                    for lid2, e2, k2, d2 in starts[n]:
                        if e2 != e and np.dot(d, d2) > 0.9 and k2 == nlanes[e2] - 1:
                            made.append(link(lid, lid2, "connector", k, limits[e], jn.junction_id))
                jn.connectors.extend(made)
    for jn in junctions:
        _conflicts(jn, lanes)
    for ln in lanes:
        if not ln.successors:
            raise RuntimeError(f"road generator left lane {ln.lane_id} ({ln.kind}) without a successor")
    return RoadNetwork(lanes, junctions, strips, nodes, list(edges), nlanes, w, half)


def _conflicts(jn: Junction, lanes: List[Lane], clearance: float = 3.2) -> None:
    """Connectors conflict when their paths come within ``clearance`` m, unless
    they leave from the same entry lane (those vehicles simply follow)."""
    pts = {c: lanes[c].points for c in jn.connectors}
    entry = {c: next(ln.lane_id for ln in lanes if c in ln.successors) for c in jn.connectors}
    jn.conflicts = {c: set() for c in jn.connectors}
    for i, a in enumerate(jn.connectors):
        for b in jn.connectors[i + 1:]:
            if entry[a] == entry[b]:
                continue
            d = np.linalg.norm(pts[a][:, None, :] - pts[b][None, :, :], axis=-1).min()
            if d < clearance:
                jn.conflicts[a].add(b)
                jn.conflicts[b].add(a)

