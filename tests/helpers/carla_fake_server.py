"""An in-memory stand-in for the few CARLA server calls :class:`CarlaWorld` makes
(tests/opencood_ext/sim/test_carla_bridge.py uses it to run reset / tick / close bookkeeping without a
server). Sensor data: a LiDAR returns 10 ground points a ring plus one point at the
box centre of every other vehicle; cameras return black BGRA images."""
from __future__ import annotations

from types import SimpleNamespace

import carla
import numpy as np

from opencood_ext.sim import carla_convert as cc
from opencood_ext.geometry.transforms import invert_transform, matrix_to_pose


def _tf(x, y, z, roll, yaw, pitch):
    return carla.Transform(carla.Location(x=x, y=y, z=z), carla.Rotation(pitch=pitch, yaw=yaw, roll=roll))


class FakeServer:
    """The few server calls CarlaWorld makes, answered in memory, so that reset / tick /
    close bookkeeping (settings, frame matching, Frame assembly, clean-up) runs here.
    It proves nothing about CARLA itself: the live test below does that."""

    def __init__(self):
        self.frame, self.vehicles, self.sensors, self.destroyed = 0, [], [], []
        self.settings = SimpleNamespace(synchronous_mode=False, fixed_delta_seconds=None)
        bps = [("vehicle.lincoln.mkz_2020", "4", "car"), ("vehicle.bh.crossbike", "2", "bicycle"),
               ("sensor.lidar.ray_cast", "0", ""), ("sensor.camera.rgb", "0", ""), ("sensor.camera.depth", "0", "")]
        self.library = Lib(BP(i, {"number_of_wheels": w, "base_type": b}) for i, w, b in bps)
        self.next_id = 100

    def _new_id(self):
        self.next_id += 1
        return self.next_id

    # client
    def set_timeout(self, t): pass
    def get_server_version(self): return "0.9.16"
    def get_client_version(self): return "0.9.16"
    def get_world(self): return self
    def get_trafficmanager(self, port): return SimpleNamespace(set_synchronous_mode=lambda on: None,
                                                               set_random_device_seed=lambda s: None)

    def apply_batch_sync(self, cmds, do_tick=False):
        for c in cmds:
            self.destroyed.append(c.actor_id)
        self.vehicles = [v for v in self.vehicles if v.id not in self.destroyed]
        self.sensors = [s for s in self.sensors if s.id not in self.destroyed]
        return []

    # world
    def get_settings(self): return SimpleNamespace(**vars(self.settings))
    def apply_settings(self, s): self.settings = SimpleNamespace(**vars(s))
    def get_map(self):
        spawns = [_tf(8.0 * i, 0.0, 0.3, 0.0, 0.0, 0.0) for i in range(6)]
        return SimpleNamespace(name="Carla/Maps/Town05", get_spawn_points=lambda: spawns)
    def get_blueprint_library(self): return self.library
    def get_snapshot(self): return SimpleNamespace(frame=self.frame, find=self._find)
    def get_actors(self): return Lib(self.vehicles + self.sensors)

    def _find(self, i):
        v = next(v for v in self.vehicles if v.id == i)
        return SimpleNamespace(get_transform=lambda: v.tf, get_velocity=lambda: carla.Vector3D(x=5.0))

    def try_spawn_actor(self, bp, tf):
        v = SimpleNamespace(id=self._new_id(), tf=tf, type_id=bp.id, attributes=dict(bp.attrs),
                            set_autopilot=lambda on, port: None,
                            bounding_box=carla.BoundingBox(carla.Location(z=0.75), carla.Vector3D(x=2.3, y=1.0, z=0.75)))
        self.vehicles.append(v)
        return v

    def spawn_actor(self, bp, mount, attach_to):
        s = SimpleNamespace(id=self._new_id(), type_id=bp.id, attrs=dict(bp.attrs), mount=mount,
                            parent=attach_to, cb=None, stopped=False)
        s.listen = lambda cb, s=s: setattr(s, "cb", cb)
        s.is_listening = lambda s=s: s.cb is not None and not s.stopped
        s.stop = lambda s=s: setattr(s, "stopped", True)
        self.sensors.append(s)
        return s

    def tick(self, seconds=0.0):
        self.frame += 1
        for s in self.sensors:
            T = np.array(s.parent.tf.get_matrix()) @ np.array(s.mount.get_matrix())
            tf = cc.pose_to_transform(matrix_to_pose(T))
            if s.type_id == "sensor.lidar.ray_cast":  # 10 ground points a ring + one on each other car
                ch = int(s.attrs["channels"])
                pts = np.tile(np.array([[20.0, 20.0, -1.9, 0.5]], np.float32), (ch * 10, 1))
                for i, v in enumerate(x for x in self.vehicles if x is not s.parent):
                    centre = np.array(v.tf.get_matrix()) @ [0.0, 0.0, 0.75, 1.0]
                    pts[i, :3] = (invert_transform(T) @ centre)[:3]
                s.cb(SimpleNamespace(frame=self.frame, raw_data=pts.tobytes(), channels=ch, transform=tf,
                                     get_point_count=lambda c: 10))
            else:
                w, h = int(s.attrs["image_size_x"]), int(s.attrs["image_size_y"])
                s.cb(SimpleNamespace(frame=self.frame, raw_data=bytes(w * h * 4), width=w, height=h, transform=tf))
        return self.frame


class BP:
    def __init__(self, bp_id, attrs):
        self.id, self.attrs = bp_id, dict(attrs)

    def has_attribute(self, k):
        return k in self.attrs

    def get_attribute(self, k):
        return self.attrs[k]

    def set_attribute(self, k, v):
        self.attrs[k] = v


class Lib(list):
    def filter(self, pattern):
        return Lib(x for x in self if (getattr(x, "type_id", None) or x.id).startswith(pattern.rstrip("*")))

    def find(self, name):
        bp = next(b for b in self if b.id == name)
        return BP(bp.id, bp.attrs)
