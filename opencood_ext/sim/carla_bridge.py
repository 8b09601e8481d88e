"""CARLA co-simulation backend: a :class:`~opencood_ext.sim.world.World` on a CARLA server.

    with CarlaWorld(host="127.0.0.1", port=2000, agent_types=types, num_agents=4) as world:
        for _ in range(100):
            frame = world.tick()     # 0.1 s of simulated time, every agent's sensors + labels

Connects with a timeout (no answer: :class:`CarlaUnavailable` naming host:port);
runs the server synchronously at 0.05 s a tick with the Traffic Manager synchronous
and seeded; spawns the connected vehicles (agent types in order) near a seeded
anchor spawn point with each type's ``sensor.lidar.ray_cast`` (OPV2V-H's 32/16-ring
variants are cut from that sweep) and, for camera types, ``sensor.camera.rgb`` +
``sensor.camera.depth`` per camera, plus four-wheeled background traffic.
``tick()`` = two ``world.tick()``; every sensor's measurement OF THAT FRAME comes
from a frame-keyed queue and is converted (:mod:`opencood_ext.sim.carla_convert`).

Labels: every four-wheeled vehicle becomes an OPV2V :class:`ObjectLabel`. An
agent's ``visible_ids`` are the vehicles (other than itself) with at least
``min_points`` of ITS LiDAR returns inside their box (the ray_cast sweep the agent
records, so visibility follows that sensor's drop-off and noise; CARLA's boxes are a
little larger than the meshes, so hits on a body land inside). ``Frame.objects``
is the union of the agents' visible vehicles (OPV2V's ground truth rule).

Clean-up: ``close()`` stops and destroys every sensor first, then the vehicles,
and restores the server's original settings; it runs from ``__exit__`` (so also
on exceptions and Ctrl-C inside a ``with`` block) and when ``__init__`` fails.
"""
from __future__ import annotations

import logging
import queue
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from opencood_ext.data.frame import AgentObs, CameraObs, Frame, ObjectLabel
from opencood_ext.geometry.transforms import pose_to_matrix

from . import carla_convert as cc
from .world import AgentInfo

log = logging.getLogger(__name__)

TICK_SECONDS = 0.05
TICKS_PER_FRAME = 2


class CarlaUnavailable(RuntimeError):
    """No CARLA server answered (or the client library is missing)."""


class SensorTimeout(RuntimeError):
    """A sensor delivered no measurement for the frame in time."""


def connect(host: str, port: int, timeout_s: float):
    """-> ``(carla.Client, server_version)``; raises :class:`CarlaUnavailable`."""
    try:
        import carla
    except ImportError as exc:
        raise CarlaUnavailable("the CARLA client library is not installed: pip install carla==0.9.16") from exc
    client = carla.Client(host, int(port))
    client.set_timeout(float(timeout_s))
    try:
        version = client.get_server_version()
    except RuntimeError as exc:
        raise CarlaUnavailable(
            f"no CARLA server answered at {host}:{port} within {timeout_s:g} s ({exc}). Start one, "
            "e.g. `docker compose -f docker/docker-compose.yml up -d carla` (docker/README.md), "
            "or pass the host and port of a running server") from exc
    if version.split("-")[0] != client.get_client_version().split("-")[0]:
        log.warning("CARLA server %s differs from client library %s", version, client.get_client_version())
    return client, version


class FrameQueue:
    """Measurements of many sensors, matched by simulator frame number.

    ``callback(key)`` gives the function to pass to ``sensor.listen``;
    ``collect(frame, timeout_s)`` returns ``{key: measurement}`` of exactly that
    frame, dropping older measurements (the first of the two ticks per frame).
    """

    def __init__(self):
        self._queues: Dict[object, queue.Queue] = {}

    def callback(self, key):
        if key in self._queues:
            raise ValueError(f"sensor key {key!r} registered twice")
        q: queue.Queue = queue.Queue()
        self._queues[key] = q
        return q.put

    def clear(self) -> None:
        self._queues.clear()

    def collect(self, frame: int, timeout_s: float) -> Dict[object, object]:
        deadline = time.monotonic() + timeout_s
        out = {}
        for key, q in self._queues.items():
            while True:
                try:
                    data = q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise SensorTimeout(f"sensor {key!r} delivered nothing for frame {frame} within "
                                        f"{timeout_s:g} s") from None
                if data.frame == frame:
                    out[key] = data
                    break
                if data.frame > frame:
                    raise SensorTimeout(f"sensor {key!r} skipped frame {frame} (next is {data.frame})")
        return out


def destroy_actors(client, sensors: Sequence, other_ids: Sequence[int]) -> None:
    """Stop every listening sensor, then destroy the sensors and after them the other
    actors in one ordered batch. Failures are logged, never raised (this runs on
    the way out of errors and Ctrl-C)."""
    import carla

    for sensor in sensors:
        try:
            listening = sensor.is_listening  # a method in 0.9.16, a property in some releases
            if listening() if callable(listening) else listening:
                sensor.stop()
        except RuntimeError as exc:
            log.warning("could not stop sensor %s: %s", sensor.id, exc)
    ids = [s.id for s in sensors] + [int(i) for i in other_ids]
    if ids:
        try:
            client.apply_batch_sync([carla.command.DestroyActor(i) for i in ids], False)
        except RuntimeError as exc:
            log.warning("could not destroy %d CARLA actors: %s", len(ids), exc)


def _agent_info(agent_id: int, type_name: str, spec) -> AgentInfo:
    return AgentInfo(agent_id=agent_id, agent_type=type_name, lidar=getattr(spec, "lidar", None),
                     cameras=list(getattr(spec, "cameras", []) or []),
                     lidar_variants=dict(getattr(spec, "lidar_variants", {}) or {}))


class CarlaWorld:
    """A World backed by a CARLA server.

    agent_types: ``{type name: spec}`` as the built-in world takes them (a spec has
        ``lidar`` (LidarSpec or None), ``cameras`` (CameraSpecs), ``lidar_variants``
        ({beams: keep_every})); agent i gets ``assignment[i % len(assignment)]``.
    num_agents / num_background: connected vehicles / Traffic Manager vehicles.
    sensor_timeout_s: how long ``tick`` waits for a sensor's frame.
    label_range: vehicles farther than this (m) from every agent are not labelled.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 2000, timeout_s: float = 10.0,
                 town: str = "Town05", agent_types: Optional[Mapping[str, object]] = None,
                 num_agents: int = 4, num_background: int = 30, seed: int = 0, tm_port: int = 8000,
                 record_cameras: bool = True, record_depth: bool = True,
                 assignment: Optional[Sequence[str]] = None, sensor_timeout_s: float = 10.0,
                 label_range: float = 120.0, min_points: int = 1,
                 agent_blueprint: str = "vehicle.lincoln.mkz_2020"):
        if not agent_types:
            raise ValueError("CarlaWorld: agent_types is empty; pass the agent-type specs (m1..m4)")
        self.agent_types = dict(agent_types)
        self.assignment = list(assignment or self.agent_types)
        unknown = [t for t in self.assignment if t not in self.agent_types]
        if unknown:
            raise ValueError(f"CarlaWorld: assignment names unknown agent types {unknown}; "
                             f"known: {sorted(self.agent_types)}")
        if num_agents < 1 or num_background < 0:
            raise ValueError(f"CarlaWorld: num_agents={num_agents} must be >= 1, num_background="
                             f"{num_background} >= 0")
        self.host, self.port, self.timeout_s, self.town = host, int(port), float(timeout_s), town
        self.num_agents, self.num_background, self.tm_port = num_agents, num_background, tm_port
        self.record_cameras, self.record_depth = record_cameras, record_depth
        self.sensor_timeout_s, self.label_range, self.min_points = sensor_timeout_s, label_range, min_points
        self.agent_blueprint = agent_blueprint
        self._client, self.server_version = connect(host, port, timeout_s)
        self._world = self._tm = self._orig_settings = None
        self._sensors: List = []  # sensor actors
        self._agent_actors: List = []  # connected vehicles
        self._background_ids: List[int] = []
        self._agents: List[AgentInfo] = []
        self._plans: Dict[int, List[cc.SensorPlan]] = {}
        self._static: Dict[int, Tuple[object, str]] = {}  # actor id -> (bounding box, obj_type)
        self._queue = FrameQueue()
        self._seed, self._ticks, self.timestamp_s = seed, 0, TICK_SECONDS  # timestamps count 0.05 s ticks
        try:
            self.reset(seed)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ World protocol

    @property
    def agents(self) -> List[AgentInfo]:
        return list(self._agents)

    @property
    def scenario(self) -> str:
        return f"carla_{self.town.lower()}_seed{self._seed}"

    def reset(self, seed: int) -> None:
        import carla

        self._destroy_actors()
        self._seed, self._ticks = int(seed), 0
        if self._orig_settings is None:  # what the server had before we touched it
            self._orig_settings = self._client.get_world().get_settings()
        self._world = self._load_town()  # (load_world resets the settings to defaults)
        settings = self._world.get_settings()
        settings.synchronous_mode = True
        settings.fixed_delta_seconds = TICK_SECONDS
        self._world.apply_settings(settings)
        self._tm = self._client.get_trafficmanager(self.tm_port)
        self._tm.set_synchronous_mode(True)
        self._tm.set_random_device_seed(self._seed)
        self._world.tick()

        rng = np.random.default_rng(self._seed)
        spawns = self._world.get_map().get_spawn_points()
        if len(spawns) < self.num_agents:
            raise RuntimeError(f"{self.town} has {len(spawns)} spawn points, fewer than {self.num_agents} agents")
        anchor = spawns[int(rng.integers(len(spawns)))].location
        spawns.sort(key=lambda t: t.location.distance(anchor))
        library = self._world.get_blueprint_library()
        cars = [bp for bp in library.filter("vehicle.*")
                if bp.has_attribute("number_of_wheels") and int(bp.get_attribute("number_of_wheels")) == 4]
        agent_bp = library.find(self.agent_blueprint) if library.filter(self.agent_blueprint) else cars[0]
        agent_bp.set_attribute("role_name", "cav")

        used = 0
        while len(self._agent_actors) < self.num_agents and used < len(spawns):
            actor = self._world.try_spawn_actor(agent_bp, spawns[used])
            used += 1
            if actor is None:
                continue
            self._agent_actors.append(actor)
            actor.set_autopilot(True, self.tm_port)
            type_name = self.assignment[(len(self._agent_actors) - 1) % len(self.assignment)]
            info = _agent_info(actor.id, type_name, self.agent_types[type_name])
            self._agents.append(info)
            self._plans[actor.id] = cc.sensor_plans(info, self.record_cameras, self.record_depth)
            for plan in self._plans[actor.id]:
                bp = library.find(plan.blueprint)
                for k, v in plan.attributes.items():
                    bp.set_attribute(k, v)
                sensor = self._world.spawn_actor(bp, cc.pose_to_transform(plan.mount), attach_to=actor)
                self._sensors.append(sensor)
                sensor.listen(self._queue.callback((actor.id, plan.key)))
        if len(self._agent_actors) < self.num_agents:
            raise RuntimeError(f"could spawn only {len(self._agent_actors)} of {self.num_agents} agents in {self.town}")

        free = spawns[used:used + 3 * self.num_background]
        picks = rng.permutation(len(free))[:self.num_background]
        batch = []
        for i in picks:
            bp = cars[int(rng.integers(len(cars)))]
            if bp.has_attribute("color"):
                colors = bp.get_attribute("color").recommended_values
                bp.set_attribute("color", colors[int(rng.integers(len(colors)))])
            bp.set_attribute("role_name", "background")
            batch.append(carla.command.SpawnActor(bp, free[int(i)]).then(
                carla.command.SetAutopilot(carla.command.FutureActor, True, self.tm_port)))
        for resp in self._client.apply_batch_sync(batch, True):
            if resp.error:
                log.info("background vehicle not spawned: %s", resp.error)
            else:
                self._background_ids.append(resp.actor_id)
        self._world.tick()

    def tick(self) -> Frame:
        if self._world is None:
            raise RuntimeError("CarlaWorld is closed")
        for _ in range(TICKS_PER_FRAME):
            frame_id = self._world.tick(self.timeout_s)
            self._ticks += 1
        data = self._queue.collect(frame_id, self.sensor_timeout_s)
        snapshot = self._world.get_snapshot()
        labels = self._labels(snapshot)
        agents = [self._agent_obs(info, data, snapshot, labels) for info in self._agents]
        seen = sorted({i for a in agents for i in a.visible_ids})
        return Frame(scenario=self.scenario, timestamp=f"{self._ticks:06d}", agents=agents,
                     objects={i: labels[i] for i in seen}, source=f"carla://{self.host}:{self.port}")

    def protocol(self) -> dict:
        return {
            "backend": "carla", "carla_server": self.server_version, "town": self.town,
            "seed": self._seed, "fixed_delta_seconds": TICK_SECONDS, "ticks_per_frame": TICKS_PER_FRAME,
            "num_agents": self.num_agents, "num_background": self.num_background, "tm_port": self.tm_port,
            "label_rule": f">= {self.min_points} LiDAR points in the box, within {self.label_range} m",
            "agents": [{"id": a.agent_id, "type": a.agent_type,
                        "sensors": [{"blueprint": p.blueprint, "name": p.name, "mount": list(p.mount),
                                     "attributes": dict(p.attributes)} for p in self._plans[a.agent_id]],
                        "lidar_variants": {int(k): int(v) for k, v in a.lidar_variants.items()}}
                       for a in self._agents],
        }

    def close(self) -> None:
        """Stop and destroy sensors, then vehicles; restore the server settings (idempotent)."""
        self._destroy_actors()
        if self._world is not None and self._orig_settings is not None:
            try:
                self._world.apply_settings(self._orig_settings)
            except RuntimeError as exc:
                log.warning("could not restore CARLA settings: %s", exc)
        if self._tm is not None:
            try:
                self._tm.set_synchronous_mode(False)
            except RuntimeError as exc:
                log.warning("could not release the Traffic Manager: %s", exc)
        self._world, self._tm, self._orig_settings = None, None, None

    def __enter__(self) -> "CarlaWorld":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _load_town(self):
        world = self._client.get_world()
        if world.get_map().name.split("/")[-1] == self.town:
            return world
        maps = {m.split("/")[-1]: m for m in self._client.get_available_maps()}
        if self.town not in maps:
            raise ValueError(f"CarlaWorld: town {self.town!r} is not on the server; it has {sorted(maps)}")
        self._client.set_timeout(max(self.timeout_s, 120.0))  # loading a town takes a while
        try:
            return self._client.load_world(self.town)
        finally:
            self._client.set_timeout(self.timeout_s)

    def _destroy_actors(self) -> None:
        destroy_actors(self._client, self._sensors,
                       [a.id for a in self._agent_actors] + self._background_ids)
        self._sensors, self._agent_actors, self._background_ids = [], [], []
        self._agents, self._plans, self._static = [], {}, {}
        self._queue.clear()

    def _labels(self, snapshot) -> Dict[int, ObjectLabel]:
        """Every four-wheeled vehicle within ``label_range`` of an agent -> ObjectLabel."""
        agent_xyz = np.array([cc.transform_to_pose(snapshot.find(a.id).get_transform())[:3]
                              for a in self._agent_actors])
        labels = {}
        for actor in self._world.get_actors().filter("vehicle.*"):
            static = self._static.get(actor.id)
            if static is None:
                wheels = actor.attributes.get("number_of_wheels", "4")
                static = (actor.bounding_box, cc.obj_type_of(actor.attributes.get("base_type", "")))
                static = static if str(wheels) == "4" else (None, "")
                self._static[actor.id] = static
            snap = snapshot.find(actor.id)
            if static[0] is None or snap is None:
                continue
            tf = snap.get_transform()
            if np.min(np.linalg.norm(agent_xyz - cc.transform_to_pose(tf)[:3], axis=1)) > self.label_range:
                continue
            labels[actor.id] = cc.vehicle_label(actor.id, tf, static[0], static[1],
                                                cc.speed_kmh(snap.get_velocity()))
        return labels

    def _agent_obs(self, info: AgentInfo, data, snapshot, labels) -> AgentObs:
        vehicle = snapshot.find(info.agent_id)
        v_pose = cc.transform_to_pose(vehicle.get_transform())
        meta = {"ego_speed": cc.speed_kmh(vehicle.get_velocity()), "true_ego_pos": v_pose.tolist(),
                "predicted_ego_pos": v_pose.tolist(), "carla_frame": int(snapshot.frame)}
        lidar_key = (info.agent_id, "lidar")
        if info.lidar is not None:
            meas = data[lidar_key]
            sweep = cc.lidar_buffer_to_points(meas.raw_data, source=f"agent {info.agent_id} lidar")
            counts = [meas.get_point_count(ch) for ch in range(meas.channels)]
            points = cc.reduce_rings(sweep, counts, info.lidar.keep_every)  # LidarSpec.keep_every
            beams = {int(b): cc.reduce_rings(sweep, counts, k) for b, k in info.lidar_variants.items()}
            lidar_pose = cc.transform_to_pose(meas.transform)
        else:  # camera-only: the label/visibility frame is the vehicle's
            points, beams, lidar_pose = np.zeros((0, 4), np.float32), {}, v_pose
        T_world_lidar = pose_to_matrix(lidar_pose)
        cameras = []
        lidar_mount = info.lidar.mount if info.lidar is not None else (0.0,) * 6
        for plan in self._plans[info.agent_id]:
            if plan.role != "rgb":
                continue
            cam = cc.camera_of(plan)
            rgb = data[(info.agent_id, plan.key)]
            dep = data.get((info.agent_id, f"depth:{plan.name}"))
            cameras.append(CameraObs(
                name=cam.name, K=cam.K,
                image=cc.bgra_to_rgb(rgb.raw_data, rgb.width, rgb.height, f"agent {info.agent_id} {cam.name}"),
                depth=None if dep is None else cc.decode_depth(dep.raw_data, dep.width, dep.height),
                T_lidar_from_camera=cc.camera_extrinsics(lidar_mount, cam.mount),
                T_world_from_camera=cc.transform_to_matrix(rgb.transform),
                cords=cc.transform_to_pose(rgb.transform)))
        others = [i for i in labels if i != info.agent_id]  # an agent does not label itself
        return AgentObs(agent_id=info.agent_id, agent_type=info.agent_type, T_world_from_lidar=T_world_lidar,
                        lidar=points, cameras=cameras, lidar_beams=beams,
                        visible_ids=cc.visible_ids(others, [labels[i] for i in others], points,
                                                   T_world_lidar, self.label_range, self.min_points),
                        lidar_pose=lidar_pose, meta=meta)
