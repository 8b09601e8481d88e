"""The built-in world: procedural town, traffic and Embree sensors, no download.

``BuiltinWorld(SimConfig()).reset(seed)`` builds one scenario: a town
(:mod:`town`), 20-60 moving vehicles plus parked ones (:mod:`traffic`), 2-5
connected vehicles (cars spawned within ``spawn_radius`` of the first, well
inside the 70 m communication range; where depends on the scene family,
``agents.layout``: see :mod:`families`) and, with ``rsu_probability``, a
roadside unit (id -1) on a 4-6 m pole on the sidewalk at the junction
nearest the first agent (beside it when no junction is within 50 m). Each
``tick()`` runs two 0.05 s traffic steps and returns a :class:`Frame` (10 Hz).

Labels (OPV2V semantics): an agent lists every vehicle with at least one
return in its 64-beam sweep; ``location`` is the ground point below the box
centre, ``center = (0, 0, H/2)`` (world axes), ``angle = [0, yaw, 0]`` deg,
``extent`` = half sizes; speeds in km/h. The ground is flat (z = 0 roads).

After each ``tick()``, ``last_scans`` (agent -> LidarScan with per-point object
ids) and ``last_camera_ids`` ((agent, camera) -> per-pixel object ids) hold
the ray-level ground truth for tests and debugging.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

import numpy as np

from opencood_ext.data.frame import AgentObs, CameraObs, Frame, ObjectLabel, sort_agent_ids
from opencood_ext.deps import require_sim
from opencood_ext.geometry import invert_transform, matrix_to_pose, pose_to_matrix

from . import meshes as M
from .agent_types import AgentTypesConfig
from .camera import CameraModel
from .families import LAYOUTS
from .lidar import LidarModel, LidarScan
from .road_layout import place_on_road
from .scene import RayScene, SurfaceTable
from .town import TownParams, generate_town
from .traffic import Traffic, TrafficParams, Vehicle
from .vehicles import GLASS, PAINT, PART_BODY, PART_GLASS, TYRE, vehicle_mesh
from .world import AgentInfo, CameraSpec


RSU_POLE_ID = -1001  # object id of the roadside pole; -1 means 'no object' in the surface table


@dataclass
class AgentParams:
    """Connected agents (the ``agents`` config section)."""

    count: Tuple[int, int] = (2, 5)
    comm_range: float = 70.0
    spawn_radius: float = 40.0                          # m: from the first agent, or the junction centre
    rsu_probability: float = 0.5
    layout: str = "junction"                            # one of LAYOUTS (module docstring)
    junction_distance: Tuple[float, float] = (8.0, 35.0)   # ego to junction centre, m
    min_arm_angle: float = 50.0                         # deg, ego vs collaborator bearing from the centre
    road_gap: Tuple[float, float] = (6.0, 50.0)         # road: ego to collaborator centre along the street, m
    oncoming_probability: float = 0.35                  # road: a collaborator drives the other way
    platoon_probability: float = 0.3                    # road: some collaborators platoon in the ego's lane
    platoon_gap: Tuple[float, float] = (4.0, 14.0)      # road: bumper to bumper in a platoon, m

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"agents.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if not 0.0 < self.road_gap[0] <= self.road_gap[1] < self.comm_range or self.platoon_gap[0] < 3.5:
            raise ValueError(f"agents.road_gap must satisfy 0 < lo <= hi < comm_range ({self.comm_range}) and "
                             f"agents.platoon_gap start at 3.5 m or more; got {self.road_gap}, {self.platoon_gap}")


@dataclass
class SimConfig:
    """Everything the built-in world needs; constructor arguments = config schema."""

    town: TownParams = field(default_factory=TownParams)
    traffic: TrafficParams = field(default_factory=TrafficParams)
    agents: AgentParams = field(default_factory=AgentParams)
    sensors: AgentTypesConfig = field(default_factory=AgentTypesConfig)
    cameras: bool = True
    camera_size: Optional[Tuple[int, int]] = None   # (W, H); None: the rig's size
    camera_shadows: bool = True
    warmup_ticks: int = 20
    tick_seconds: float = 0.05
    ticks_per_frame: int = 2
    single_scene: bool = False                      # rebuild one scene a tick (benchmark)


@dataclass
class _Agent:
    info: AgentInfo
    vehicle: Optional[Vehicle]          # None for a roadside unit
    T_world_from_base: np.ndarray       # vehicle reference point / pole foot
    exclude: List[int]


class BuiltinWorld:
    """:class:`opencood_ext.sim.world.World` backend; see the module docstring."""

    def __init__(self, config: Optional[SimConfig] = None, *, agent_types: Optional[AgentTypesConfig] = None,
                 num_agents: Optional[int] = None, cameras: Optional[bool] = None):
        """``config`` is the schema; the keywords override its ``sensors``,
        ``agents.count`` (exactly ``num_agents`` vehicles) and ``cameras``."""
        cfg = config if config is not None else SimConfig()
        if agent_types is not None:
            cfg = replace(cfg, sensors=agent_types)
        if num_agents is not None:
            if num_agents < 1:
                raise ValueError(f"BuiltinWorld: num_agents must be >= 1, got {num_agents}")
            cfg = replace(cfg, agents=replace(cfg.agents, count=(int(num_agents), int(num_agents))))
        if cameras is not None:
            cfg = replace(cfg, cameras=bool(cameras))
        self.cfg = cfg
        self.timestamp_s = cfg.tick_seconds  # seconds per unit of its frames' timestamps (they count ticks)
        self.lidar_model = LidarModel(self.cfg.sensors.lidar, self.cfg.tick_seconds)
        cams = self.cfg.sensors.cameras.specs(self.cfg.camera_size) if self.cfg.cameras else []
        self._camera_models = {c.name: CameraModel(c) for c in cams}
        self._seed: Optional[int] = None
        self._layout = cfg.agents.layout    # this scenario's (``reset`` may override it)
        self._agents: List[_Agent] = []
        # per-ray ground truth of the last tick, for tests and debugging:
        self.last_camera_ids: Dict[Tuple[int, str], np.ndarray] = {}   # (agent, camera) -> (H, W) object ids
        self.last_scans: Dict[int, LidarScan] = {}                      # agent -> 64-beam sweep with object ids

    # ------------------------------------------------------------------ World API
    @property
    def agents(self) -> List[AgentInfo]:
        return [a.info for a in self._agents]

    @property
    def scenario(self) -> str:
        """A date-time name (OPV2V style) derived from the reset seed."""
        if self._seed is None:
            raise RuntimeError("BuiltinWorld.scenario before reset(seed)")
        base = datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=(self._seed * 7919) % (365 * 86400))
        return base.strftime("%Y_%m_%d_%H_%M_%S")

    def reset(self, seed: int, layout: Optional[str] = None) -> None:
        """Build scenario ``seed``; ``layout`` (one of LAYOUTS) overrides ``agents.layout`` for it."""
        cfg = self.cfg
        if layout is not None and layout not in LAYOUTS:
            raise ValueError(f"BuiltinWorld.reset: layout must be one of {LAYOUTS}, got {layout!r}")
        self._layout = cfg.agents.layout if layout is None else layout
        self._seed = int(seed)
        rng = np.random.default_rng(self._seed)
        self.town = generate_town(rng, cfg.town)
        self.traffic = Traffic(self.town.roads, rng, cfg.traffic)
        cavs = self._spawn(rng)
        self.tick_count = 0
        az, el = rng.uniform(0, 2 * np.pi), np.radians(rng.uniform(35, 65))
        self.sun = np.array([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)])
        rsu = self._place_rsu(rng, cavs[0]) if rng.random() < cfg.agents.rsu_probability else None
        self._build_scene(rsu)
        ids = [v.vid for v in cavs] + ([-1] if rsu is not None else [])
        types = cfg.sensors.assign(ids, rng)
        self._agents = []
        for v in cavs:
            T = pose_to_matrix([v.x, v.y, 0.0, 0.0, np.degrees(v.yaw), 0.0])
            self._agents.append(_Agent(self._info(v.vid, types[v.vid]), v, T, [v.vid]))
        if rsu is not None:
            self._agents.append(_Agent(self._info(-1, types[-1], rsu[3]), None, rsu[2], [rsu[4]]))
        self._agents.sort(key=lambda a: sort_agent_ids(ids).index(a.info.agent_id))
        self._noise_seed = int(rng.integers(2 ** 62))
        for _ in range(cfg.warmup_ticks):
            self.traffic.step(cfg.tick_seconds)
            self.tick_count += 1

    def tick(self) -> Frame:
        if self._seed is None:
            raise RuntimeError("BuiltinWorld.tick() before reset(seed)")
        for _ in range(self.cfg.ticks_per_frame):
            self.traffic.step(self.cfg.tick_seconds)
            self.tick_count += 1
        self._update_dynamic()
        self.last_camera_ids, self.last_scans = {}, {}
        agents, objects = [], {}
        for k, ag in enumerate(self._agents):
            obs = self._observe(ag, np.random.default_rng([self._noise_seed, self.tick_count, k]))
            agents.append(obs)
            for vid in obs.visible_ids:
                objects[vid] = self._label(self._by_id[vid])
        return Frame(self.scenario, f"{self.tick_count:06d}", agents, objects, source="builtin")

    def protocol(self) -> dict:
        cfg, lid = self.cfg, self.cfg.sensors.lidar
        moving = self.traffic.moving()
        return {
            "backend": "opencood_ext.sim.builtin",
            "world": {"seed": self._seed, "fixed_delta_seconds": cfg.tick_seconds, "sync_mode": True,
                      "ticks_per_saved_frame": cfg.ticks_per_frame, "warmup_ticks": cfg.warmup_ticks},
            "sensing": {"lidar": {k: getattr(lid, k) for k in lid.carla_attributes()}
                        | {"mount": [float(x) for x in lid.mount]},
                        "beam_variants": list(cfg.sensors.beam_variants),
                        "cameras": [{"name": c.name, "width": c.width, "height": c.height, "fov": c.fov,
                                     "mount": [float(x) for x in c.mount]} for c in self._camera_specs()]},
            "town": {"nodes": int(len(self.town.roads.nodes)), "junctions": len(self.town.roads.junctions),
                     "lanes": len(self.town.roads.lanes), "static_parts": len(self.town.parts)},
            "scenario": {"cav_list": [a.info.agent_id for a in self._agents if not a.info.is_rsu],
                         "rsu_list": [a.info.agent_id for a in self._agents if a.info.is_rsu],
                         "agent_types": {str(a.info.agent_id): a.info.agent_type for a in self._agents},
                         "moving_vehicles": len(moving), "parked_vehicles": len(self.traffic.vehicles) - len(moving),
                         "communication_range": cfg.agents.comm_range, "layout": self._layout},
        }

    def close(self) -> None:
        self.scene = None
        self._seed = None

    # ------------------------------------------------------------------ set-up
    def _camera_specs(self) -> List[CameraSpec]:
        return [m.spec for m in self._camera_models.values()]

    def _info(self, agent_id: int, agent_type: str, rsu_height: Optional[float] = None) -> AgentInfo:
        """Sensors of one agent; a roadside unit's LiDAR sits ``rsu_height`` above
        the pole foot and its cameras look down from just below it."""
        lidar, cams = self.cfg.sensors.lidar, self._camera_specs()
        if rsu_height is not None:
            rig = self.cfg.sensors.rsu
            lidar = replace(lidar, mount=(0.0, 0.0, rsu_height, 0.0, 0.0, 0.0))
            cams = [replace(c, mount=(rig.camera_offset * np.cos(np.radians(c.mount[4])),
                                      rig.camera_offset * np.sin(np.radians(c.mount[4])), rsu_height - 0.3,
                                      0.0, c.mount[4], rig.camera_pitch)) for c in cams]
        return AgentInfo(agent_id, agent_type, lidar, cams, self.cfg.sensors.variant_keep())

    def _spawn(self, rng) -> List[Vehicle]:
        """Connected vehicles first (``layout``), then the rest of the traffic."""
        cfg, tr = self.cfg, self.traffic
        n_cav = int(rng.integers(cfg.agents.count[0], cfg.agents.count[1] + 1))
        place = {"junction": self._place_at_junction, "free": self._place_free,
                 "road": lambda rng_, n: place_on_road(tr, rng_, n, cfg.agents)}[self._layout]
        for _ in range(30):
            cavs = place(rng, n_cav)
            if len(cavs) == n_cav:
                break
            for v in cavs:
                tr.vehicles.remove(v)
        else:
            raise RuntimeError(f"could not place {n_cav} connected vehicles (layout {self._layout!r}, "
                               f"spawn_radius {cfg.agents.spawn_radius} m) in 30 tries")
        total = int(rng.integers(cfg.traffic.vehicles[0], cfg.traffic.vehicles[1] + 1))
        tr.spawn_moving(max(0, total - n_cav))
        tr.spawn_parked()
        self._by_id = {v.vid: v for v in tr.vehicles}
        return cavs

    def _place_free(self, rng, n_cav: int) -> List[Vehicle]:
        tr, r = self.traffic, self.cfg.agents.spawn_radius
        first = tr.spawn_moving(1, "Car")
        if not first or n_cav == 1:
            return first
        return first + tr.spawn_moving(n_cav - 1, "Car", near=(first[0].x, first[0].y, r))

    def _place_at_junction(self, rng, n_cav: int) -> List[Vehicle]:
        """Ego on an arm of a random junction, the others on its other arms (may
        return fewer than ``n_cav``; the caller removes them and tries again)."""
        tr, p = self.traffic, self.cfg.agents
        junctions = tr.net.junctions
        c = np.asarray(junctions[int(rng.integers(len(junctions)))].center, dtype=float)
        lo, hi = p.junction_distance

        def polar(v: Vehicle) -> Tuple[float, float]:   # bearing (rad) and distance (m) from the centre
            return np.arctan2(v.y - c[1], v.x - c[0]), np.hypot(v.x - c[0], v.y - c[1])

        first = tr.spawn_moving(1, "Car", near=(c[0], c[1], hi))
        if not first:
            return []
        bearing0, dist0 = polar(first[0])
        if dist0 < lo or n_cav == 1:
            return first
        placed = list(first)
        for _ in range(60):
            if len(placed) == n_cav:
                break
            new = tr.spawn_moving(1, "Car", near=(c[0], c[1], p.spawn_radius), attempts=50)
            if not new:
                continue
            v = new[0]
            bearing, dist = polar(v)
            off = abs((bearing - bearing0 + np.pi) % (2 * np.pi) - np.pi)
            if off < np.radians(p.min_arm_angle) or dist < lo:
                tr.vehicles.remove(v)
            else:
                placed.append(v)
        return placed

    def _place_rsu(self, rng, near: Vehicle):
        """Pole on the sidewalk at the junction nearest the first agent (when
        within 50 m, else beside that agent): (x, y, T_world_from_base, LiDAR
        height, pole object id)."""
        town = self.town
        c = np.array([[j.center[0], j.center[1]] for j in town.roads.junctions])
        d = np.hypot(*(c - [near.x, near.y]).T)
        jn = town.roads.junctions[int(np.argmin(d))]
        centre, half = (jn.center, jn.half_size.max() + 10.0) if d.min() < 50.0 else (np.array([near.x, near.y]), 25.0)
        g = town.ground
        i0, j0 = ((centre - [g.x0, g.y0]) / g.res).astype(int)
        r = int(np.ceil(half / g.res))
        win = np.s_[max(j0 - r, 0):j0 + r, max(i0 - r, 0):i0 + r]
        band = (town.dist_to_road[win] > 1.0) & (town.dist_to_road[win] < 2.2)
        for clearance in (4.5, 3.0):   # keep tree crowns and lamp posts out of its sensors' way
            clear = ~require_sim("scipy.ndimage").maximum_filter(town.occupied[win], size=2 * int(np.ceil(clearance / g.res)) + 1)
            jj, ii = np.nonzero(band & clear)
            if len(jj):
                break
        else:
            return None
        k = int(rng.integers(len(jj)))
        x = g.x0 + (ii[k] + max(i0 - r, 0) + 0.5) * g.res
        y = g.y0 + (jj[k] + max(j0 - r, 0) + 0.5) * g.res
        h = float(rng.uniform(*self.cfg.sensors.rsu.lidar_height))
        yaw = float(np.degrees(np.arctan2(centre[1] - y, centre[0] - x)))
        T = pose_to_matrix([x, y, town.params.curb_height, 0.0, yaw, 0.0])
        return x, y, T, h, RSU_POLE_ID   # the pole is the RSU's own 'body' (never labelled)

    def _build_scene(self, rsu) -> None:
        table = SurfaceTable()
        meshes, surf = [], []

        def add(mesh, sid):
            meshes.append(mesh)
            surf.append(np.full(len(mesh[1]), sid, np.int32))

        for part in self.town.ground_parts() + self.town.parts:
            add(part.mesh, table.add(part.cls, part.color, part.reflectivity, pattern=part.pattern))
        if rsu is not None:
            x, y, T, h, oid = rsu
            z0 = self.town.params.curb_height
            sid = table.add("rsu", (0.45, 0.47, 0.5), 0.97, object_id=oid)
            add(M.cylinder(x, y, 0.12, 0.0, z0 + h - 0.15), sid)
            add(M.box([x, y, z0 + h - 0.3], [0.5, 0.5, 0.3]), sid)
        dyn_v, dyn_owner, dyn_t, dyn_s, off = [], [], [], [], 0
        for k, v in enumerate(self.traffic.vehicles):
            verts, tris, part = vehicle_mesh(v.cls, v.size)
            sids = np.array([table.add("vehicle", PAINT[v.color_index], 0.98, v.vid),
                             table.add("vehicle", GLASS, 0.7, v.vid), table.add("vehicle", TYRE, 0.6, v.vid)])
            s = sids[np.where(part == PART_BODY, 0, np.where(part == PART_GLASS, 1, 2))]
            if v.parked:
                add((M.transform_xy(verts, v.x, v.y, v.yaw), tris), 0)
                surf[-1] = s.astype(np.int32)
            else:
                dyn_v.append(verts)
                dyn_owner.append(np.full(len(verts), k))
                dyn_t.append(tris + off)
                dyn_s.append(s)
                off += len(verts)
        static = M.merge(meshes)
        self.scene = RayScene(table, static, np.concatenate(surf), self.town.ground, self.cfg.single_scene)
        self._dyn = (np.concatenate(dyn_v), np.concatenate(dyn_owner), np.concatenate(dyn_t),
                     np.concatenate(dyn_s).astype(np.int32))
        self._update_dynamic()

    def _update_dynamic(self) -> None:
        verts, owner, tris, surf = self._dyn
        veh = self.traffic.vehicles
        x = np.array([v.x for v in veh])[owner]
        y = np.array([v.y for v in veh])[owner]
        yaw = np.array([v.yaw for v in veh])[owner]
        c, s = np.cos(yaw), np.sin(yaw)
        world = np.c_[verts[:, 0] * c - verts[:, 1] * s + x, verts[:, 0] * s + verts[:, 1] * c + y, verts[:, 2]]
        self.scene.set_dynamic((world, tris), surf)

    # ------------------------------------------------------------------ per tick
    def _base_pose(self, ag: _Agent) -> np.ndarray:
        v = ag.vehicle
        if v is None:
            return ag.T_world_from_base
        return pose_to_matrix([v.x, v.y, 0.0, 0.0, np.degrees(v.yaw), 0.0])

    def _observe(self, ag: _Agent, rng) -> AgentObs:
        T_base = self._base_pose(ag)
        lidar_pose = matrix_to_pose(T_base @ pose_to_matrix(ag.info.lidar.mount))
        T_wl = pose_to_matrix(lidar_pose)
        scan = self.lidar_model.scan(self.scene, T_wl, rng, exclude_ids=ag.exclude)
        self.last_scans[ag.info.agent_id] = scan
        visible = sorted(int(i) for i in np.unique(scan.object_id) if i >= 0 and i in self._by_id)
        beams = {b: scan.keep_rings(k).points for b, k in self.cfg.sensors.variant_keep().items()}
        cams = []
        T_lw = invert_transform(T_wl)
        for spec in ag.info.cameras:
            model = self._camera_models[spec.name]
            T_wc = pose_to_matrix(matrix_to_pose(T_base @ pose_to_matrix(spec.mount)))
            r = model.render(self.scene, T_wc, self.sun, self.cfg.camera_shadows, exclude_ids=ag.exclude)
            self.last_camera_ids[(ag.info.agent_id, spec.name)] = r.object_id
            cams.append(CameraObs(spec.name, r.image, spec.K, T_lw @ T_wc, r.depth, T_wc, matrix_to_pose(T_wc)))
        v = ag.vehicle
        base_pose = matrix_to_pose(T_base)
        meta = {"ego_speed": float(v.v * 3.6) if v is not None else 0.0,
                "true_ego_pos": [float(p) for p in base_pose],
                "predicted_ego_pos": [float(p) for p in base_pose]}
        return AgentObs(ag.info.agent_id, ag.info.agent_type, T_wl, scan.points, cams, beams, visible,
                        lidar_pose, meta)

    def _label(self, v: Vehicle) -> ObjectLabel:
        half = np.asarray(v.size, float) / 2
        return ObjectLabel(v.vid, [v.x, v.y, 0.0], [0.0, 0.0, half[2]], [0.0, np.degrees(v.yaw), 0.0], half,
                           v.cls, float(v.v * 3.6))
