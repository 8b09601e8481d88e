"""Procedural town: road surface, curbs, sidewalks, lane markings and the
static props (buildings, walls, street lights, signs, trees).

The ground is a raster (``res`` m cells): road cells at z = 0, everything
else raised by ``curb_height`` (sidewalks, grass), meshed as a step height
field; each cell also carries a material code (asphalt, paint, sidewalk,
grass, ...) looked up at ray-hit points. Props are placed on free cells by
distance to the road (computed with a Euclidean distance transform).
Everything is drawn from one ``numpy.random.Generator``: the same seed gives
the same town.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np

from opencood_ext.deps import require_sim

from . import meshes as M
from .roads import RoadNetwork, RoadParams, generate_roads
from .scene import PATTERN_FACADE, PATTERN_GROUND, GroundTexture

# ground material codes -> colour (RGB 0..1) and LiDAR reflectivity
ASPHALT, WHITE, YELLOW, SIDEWALK, GRASS, PARKING, CURB = range(7)
GROUND_COLORS = np.array([[0.23, 0.23, 0.25], [0.86, 0.86, 0.82], [0.86, 0.70, 0.16], [0.60, 0.58, 0.55],
                          [0.28, 0.42, 0.18], [0.29, 0.29, 0.31], [0.72, 0.72, 0.70]], np.float32)
GROUND_REFLECT = np.array([0.95, 1.0, 1.0, 0.97, 0.9, 0.95, 0.97], np.float32)
FACADES = np.array([[0.78, 0.72, 0.62], [0.62, 0.32, 0.24], [0.55, 0.56, 0.58], [0.86, 0.85, 0.80],
                    [0.42, 0.50, 0.60], [0.70, 0.60, 0.45], [0.35, 0.36, 0.38]], np.float32)


@dataclass
class TownParams:
    """The ``town`` config section."""

    roads: RoadParams = field(default_factory=RoadParams)
    raster_res: float = 0.25
    margin: float = 60.0
    sidewalk_width: float = 3.0
    curb_height: float = 0.15
    building_depth: Tuple[float, float] = (10.0, 24.0)
    building_width: Tuple[float, float] = (10.0, 30.0)
    building_height: Tuple[float, float] = (6.0, 30.0)
    light_spacing: float = 30.0
    tree_spacing: float = 12.0
    park_trees: int = 40


@dataclass
class StaticPart:
    """A static mesh with its surface attributes (see :class:`scene.SurfaceTable`)."""

    mesh: M.Mesh
    cls: str
    color: Tuple[float, float, float]
    reflectivity: float = 0.9
    pattern: int = 0


@dataclass
class Town:
    roads: RoadNetwork
    ground: GroundTexture
    raised: np.ndarray          # (ny, nx) bool: not road
    dist_to_road: np.ndarray    # (ny, nx) float32 metres
    occupied: np.ndarray        # (ny, nx) bool: a prop stands here
    parts: List[StaticPart]
    params: TownParams

    def cell(self, xy) -> Tuple[int, int]:
        g = self.ground
        return int((xy[1] - g.y0) // g.res), int((xy[0] - g.x0) // g.res)

    def ground_parts(self) -> List[StaticPart]:
        """Height-field mesh plus a flat skirt out to 1 km."""
        g, h = self.ground, self.params.curb_height
        height = np.where(self.raised, h, 0.0)
        mesh = M.heightfield(height, g.x0, g.y0, g.res)
        ny, nx = height.shape
        x1, y1, far = g.x0 + nx * g.res, g.y0 + ny * g.res, 1000.0
        skirt = [((g.x0 - far, g.y0 - far), (x1 + far, g.y0)), ((g.x0 - far, y1), (x1 + far, y1 + far)),
                 ((g.x0 - far, g.y0), (g.x0, y1)), ((x1, g.y0), (x1 + far, y1))]
        quads = []
        for (xa, ya), (xb, yb) in skirt:
            quads.append((np.array([[xa, ya, h], [xb, ya, h], [xb, yb, h], [xa, yb, h]]),
                          np.array([[0, 1, 2], [0, 2, 3]])))
        return [StaticPart(M.merge([mesh] + quads), "ground", (1.0, 1.0, 1.0), 1.0, PATTERN_GROUND)]


def _mark(codes: np.ndarray, x0: float, y0: float, res: float, pts: np.ndarray, code: int) -> None:
    i = np.floor((pts[:, 0] - x0) / res).astype(int)
    j = np.floor((pts[:, 1] - y0) / res).astype(int)
    ok = (i >= 0) & (i < codes.shape[1]) & (j >= 0) & (j < codes.shape[0])
    codes[j[ok], i[ok]] = code


def _densify(points: np.ndarray, step: float) -> Tuple[np.ndarray, np.ndarray]:
    """Resample a polyline every ``step`` m: points (K, 2) and their arclength (K,)."""
    seg = np.linalg.norm(np.diff(points, axis=0), axis=1)
    s = np.concatenate([[0.0], np.cumsum(seg)])
    t = np.arange(0.0, s[-1] + 1e-9, step)
    return np.c_[np.interp(t, s, points[:, 0]), np.interp(t, s, points[:, 1])], t


def _offset(points: np.ndarray, off: float) -> np.ndarray:
    """Polyline shifted ``off`` m to its right (left-handed frame: right = (-dy, dx))."""
    d = np.gradient(points, axis=0)
    d /= np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-9)
    return points + off * np.c_[-d[:, 1], d[:, 0]]


def _surfaces(net: RoadNetwork, p: TownParams):
    res = p.raster_res
    lo = net.nodes.min(axis=0) - p.margin
    hi = net.nodes.max(axis=0) + p.margin
    nx, ny = (int(np.ceil(v)) for v in (hi - lo) / res)
    x0, y0 = float(lo[0]), float(lo[1])
    w = net.lane_width
    centre = np.zeros((ny, nx), bool)
    park = np.zeros((ny, nx), bool)
    tmp = np.zeros((ny, nx), np.uint8)
    for ln in net.lanes:
        _mark(tmp, x0, y0, res, _densify(ln.points, res / 2)[0], 1)
    centre |= tmp == 1
    tmp[:] = 0
    for st in net.parking:
        d = np.array([np.cos(st.heading), np.sin(st.heading)])
        t = np.arange(-3.0, st.length + 3.0, res / 2)
        _mark(tmp, x0, y0, res, st.start[None] + t[:, None] * d[None], 1)
    park |= tmp == 1
    distance_transform_edt = require_sim("scipy.ndimage").distance_transform_edt
    road = distance_transform_edt(~centre) * res <= w / 2 + 0.05
    parking = (distance_transform_edt(~park) * res <= p.roads.parking_width / 2) & ~road
    road |= parking
    for jn in net.junctions:
        (cx, cy), (hx, hy) = jn.center, jn.half_size
        i0, i1 = int((cx - hx - x0) / res), int(np.ceil((cx + hx - x0) / res))
        j0, j1 = int((cy - hy - y0) / res), int(np.ceil((cy + hy - y0) / res))
        road[max(j0, 0):j1, max(i0, 0):i1] = True
    dist = (distance_transform_edt(~road) * res).astype(np.float32)
    codes = np.full((ny, nx), GRASS, np.uint8)
    codes[road] = ASPHALT
    codes[parking] = PARKING
    codes[~road & (dist <= p.sidewalk_width)] = SIDEWALK
    codes[~road & (dist <= 0.3)] = CURB
    # lane markings: centre line (yellow), lane dividers (white, dashed), stop lines
    for ln in net.lanes:
        if ln.kind == "connector":
            continue
        for shift in (-0.35 * res, 0.0, 0.35 * res):   # a few offsets keep diagonal lines connected
            left, s = _densify(_offset(ln.points, -w / 2 + shift), res / 2)
            if ln.index == 0:
                _mark(codes, x0, y0, res, left, YELLOW)
            else:
                _mark(codes, x0, y0, res, left[np.mod(s, 9.0) < 3.0], WHITE)
        if any(net.lanes[n].kind == "connector" for n in ln.successors):
            end, d = ln.points[-1], ln.points[-1] - ln.points[-2]
            d /= np.linalg.norm(d)
            r = np.array([-d[1], d[0]])
            a, b = np.meshgrid(np.arange(-w / 2, w / 2, res / 2), np.arange(-0.5, 0.0, res / 2))
            _mark(codes, x0, y0, res, end + a.reshape(-1, 1) * r + b.reshape(-1, 1) * d, WHITE)
            # zebra crossing between the stop line and the junction box interior
            a, b = np.meshgrid(np.arange(-w / 2, w / 2, res / 2), np.arange(1.0, 4.0, res / 2))
            stripe = np.mod(a.reshape(-1) + w / 2, 1.0) < 0.5
            pts = end + a.reshape(-1, 1) * r + b.reshape(-1, 1) * d
            _mark(codes, x0, y0, res, pts[stripe], WHITE)
    ground = GroundTexture(codes, x0, y0, res, GROUND_COLORS, GROUND_REFLECT, outside=GRASS)
    return ground, ~road, dist


class _Placer:
    """Rectangle placement on the raster with an occupancy mask."""

    def __init__(self, ground: GroundTexture, dist: np.ndarray, occupied: np.ndarray):
        self.g, self.dist, self.occ = ground, dist, occupied

    def window(self, xa, xb, ya, yb):
        g = self.g
        i0, i1 = int(np.floor((xa - g.x0) / g.res)), int(np.ceil((xb - g.x0) / g.res))
        j0, j1 = int(np.floor((ya - g.y0) / g.res)), int(np.ceil((yb - g.y0) / g.res))
        ny, nx = self.occ.shape
        if i0 < 0 or j0 < 0 or i1 > nx or j1 > ny:
            return None
        return slice(j0, j1), slice(i0, i1)

    def free(self, xa, xb, ya, yb, min_dist: float) -> bool:
        w = self.window(xa, xb, ya, yb)
        return w is not None and not self.occ[w].any() and self.dist[w].min() >= min_dist

    def take(self, xa, xb, ya, yb, gap: float = 0.0) -> None:
        w = self.window(xa - gap, xb + gap, ya - gap, yb + gap)
        if w is not None:
            self.occ[w] = True

    def candidates(self, rng, lo: float, hi: float, count: int) -> np.ndarray:
        """Up to ``count`` random cell centres (K, 2) with lo <= dist <= hi, plus the
        unit direction away from the road snapped to the x or y axis (K, 2)."""
        j, i = np.nonzero((self.dist >= lo) & (self.dist <= hi) & ~self.occ)
        if not len(j):
            return np.zeros((0, 4))
        pick = rng.choice(len(j), size=min(count, len(j)), replace=False)
        j, i = j[pick], i[pick]
        ny, nx = self.dist.shape
        gx = self.dist[j, np.minimum(i + 2, nx - 1)] - self.dist[j, np.maximum(i - 2, 0)]
        gy = self.dist[np.minimum(j + 2, ny - 1), i] - self.dist[np.maximum(j - 2, 0), i]
        nrm = np.where((np.abs(gx) >= np.abs(gy))[:, None], np.c_[np.sign(gx), 0 * gx], np.c_[0 * gy, np.sign(gy)])
        ok = np.abs(nrm).sum(1) > 0
        xy = np.c_[self.g.x0 + (i + 0.5) * self.g.res, self.g.y0 + (j + 0.5) * self.g.res]
        return np.c_[xy, nrm][ok]


def _rect(front, nrm, width, depth):
    """Axis-aligned rectangle in front of ``front`` extending ``depth`` along ``nrm``."""
    t = np.array([-nrm[1], nrm[0]])
    corners = np.array([front + t * width / 2, front - t * width / 2,
                        front + t * width / 2 + nrm * depth, front - t * width / 2 + nrm * depth])
    (xa, ya), (xb, yb) = corners.min(0), corners.max(0)
    return xa, xb, ya, yb


class _PointSet:
    """Points placed so far (lights, trees) in a growing buffer: the spacing test of each of
    thousands of candidates no longer rebuilds an array from a list."""

    def __init__(self):
        self._xy = np.zeros((64, 2))
        self._n = 0

    def add(self, x: float, y: float) -> None:
        if self._n == len(self._xy):
            self._xy = np.concatenate([self._xy, np.zeros_like(self._xy)])
        self._xy[self._n] = (x, y)
        self._n += 1

    def within(self, x: float, y: float, spacing: float) -> bool:
        """Is a placed point closer than ``spacing`` to (x, y)?"""
        return bool(self._n) and np.min(np.hypot(*(self._xy[:self._n] - [x, y]).T)) < spacing


def _props(rng, net: RoadNetwork, ground: GroundTexture, dist: np.ndarray, p: TownParams):
    occupied = np.zeros(dist.shape, bool)   # cells taken by props (roads are excluded by distance)
    pl = _Placer(ground, dist, occupied)
    parts: List[StaticPart] = []
    sw = p.sidewalk_width
    for x, y, nx_, ny_ in pl.candidates(rng, sw + 0.5, sw + 1.0, 1200):     # buildings
        nrm = np.array([nx_, ny_])
        width, depth = rng.uniform(*p.building_width), rng.uniform(*p.building_depth)
        front = np.array([x, y]) + nrm * rng.uniform(0.0, 2.5)
        xa, xb, ya, yb = _rect(front, nrm, width, depth)
        if rng.random() < 0.15 or not pl.free(xa, xb, ya, yb, sw + 0.4):
            continue
        h = rng.uniform(*p.building_height) * (2.0 if rng.random() < 0.1 else 1.0)
        color = tuple(FACADES[int(rng.integers(len(FACADES)))] * rng.uniform(0.85, 1.1))
        parts.append(StaticPart(M.box([(xa + xb) / 2, (ya + yb) / 2, h / 2], [xb - xa, yb - ya, h]),
                                "building", color, 0.97, PATTERN_FACADE))
        if rng.random() < 0.3:   # a rooftop block
            parts.append(StaticPart(M.box([(xa + xb) / 2, (ya + yb) / 2, h + 1.5],
                                          [(xb - xa) * 0.4, (yb - ya) * 0.4, 3.0]), "building", color, 0.97))
        pl.take(xa, xb, ya, yb, gap=rng.uniform(0.5, 3.0))
    for x, y, nx_, ny_ in pl.candidates(rng, sw + 0.3, sw + 0.6, 80):        # garden walls
        nrm = np.array([nx_, ny_])
        xa, xb, ya, yb = _rect(np.array([x, y]), nrm, rng.uniform(6.0, 20.0), 0.3)
        if pl.free(xa, xb, ya, yb, sw + 0.2):
            h = rng.uniform(1.0, 2.4)
            parts.append(StaticPart(M.box([(xa + xb) / 2, (ya + yb) / 2, h / 2], [xb - xa, yb - ya, h]), "wall",
                                    tuple(FACADES[int(rng.integers(len(FACADES)))] * 0.8), 0.95))
            pl.take(xa, xb, ya, yb, gap=0.5)
    lights = _PointSet()
    for x, y, nx_, ny_ in pl.candidates(rng, 0.5, 0.8, 3000):                 # street lights
        if lights.within(x, y, p.light_spacing):
            continue
        lights.add(x, y)
        h = rng.uniform(7.0, 8.5)
        arm = np.array([x, y]) - np.array([nx_, ny_]) * 1.0
        parts.append(StaticPart(M.cylinder(x, y, 0.1, 0.0, h), "pole", (0.35, 0.36, 0.38), 0.97))
        parts.append(StaticPart(M.box([arm[0], arm[1], h - 0.1], [abs(nx_) * 2 + 0.15, abs(ny_) * 2 + 0.15, 0.15]),
                                "pole", (0.35, 0.36, 0.38), 0.97))
        pl.take(x - 0.5, x + 0.5, y - 0.5, y + 0.5)
    for ln in net.lanes:                                                        # signs at stop lines
        if ln.kind == "drive" and any(net.lanes[n].kind == "connector" for n in ln.successors) \
                and ln.index == 0 and rng.random() < 0.6:
            d = (ln.points[-1] - ln.points[-2]) / np.linalg.norm(ln.points[-1] - ln.points[-2])
            r = np.array([-d[1], d[0]])
            road_e = ln.road
            pos = ln.points[-1] - d * 1.5 + r * (net.half_widths[road_e] - 0.5 * net.lane_width + 1.2)
            j, i = int((pos[1] - ground.y0) / ground.res), int((pos[0] - ground.x0) / ground.res)
            if 0 <= j < dist.shape[0] and 0 <= i < dist.shape[1] and 0.4 < dist[j, i] < sw:
                parts.append(StaticPart(M.cylinder(pos[0], pos[1], 0.05, 0.0, 2.6, 6), "pole", (0.5, 0.5, 0.5), 0.9))
                parts.append(StaticPart(M.box([pos[0], pos[1], 2.45], [0.05 + 0.6 * abs(r[0]), 0.05 + 0.6 * abs(r[1]), 0.6]),
                                        "pole", (0.75, 0.1, 0.1), 1.0))
                pl.take(pos[0] - 0.4, pos[0] + 0.4, pos[1] - 0.4, pos[1] + 0.4)
    trees = _PointSet()
    street = pl.candidates(rng, 1.8, 2.2, 3000)
    park = pl.candidates(rng, sw + 4.0, 1e9, 600)[: p.park_trees]
    for k, (x, y, _, _) in enumerate(np.concatenate([street, park])):           # trees
        spacing = p.tree_spacing if k < len(street) else 6.0
        if trees.within(x, y, spacing):
            continue
        if not pl.free(x - 0.6, x + 0.6, y - 0.6, y + 0.6, 0.4):
            continue
        trees.add(x, y)
        trunk = rng.uniform(2.6, 4.0)   # crowns start above bus roofs near the curb
        rr, rz = rng.uniform(1.5, 2.6), rng.uniform(1.6, 2.8)
        parts.append(StaticPart(M.cylinder(x, y, rng.uniform(0.14, 0.25), 0.0, trunk + rz * 0.5, 6), "vegetation",
                                (0.32, 0.22, 0.14), 0.92))
        green = np.array([0.18, 0.36, 0.12]) * rng.uniform(0.8, 1.25)
        parts.append(StaticPart(M.ellipsoid([x, y, trunk + rz * 0.95], [rr, rr, rz]), "vegetation", tuple(green), 0.88))
        pl.take(x - 0.6, x + 0.6, y - 0.6, y + 0.6)
    return parts, occupied


def generate_town(rng: np.random.Generator, params: TownParams = TownParams()) -> Town:
    """Roads, ground raster and static props for one scenario."""
    net = generate_roads(rng, params.roads)
    ground, raised, dist = _surfaces(net, params)
    parts, occupied = _props(rng, net, ground, dist, params)
    return Town(net, ground, raised, dist, occupied, parts, params)
