"""Pure conversions between CARLA measurements and the project's data model.

Nothing here talks to a server: functions take raw byte buffers, numpy
arrays, or ``carla.Transform`` / ``Location`` / ``Rotation`` /
``BoundingBox`` values (or any object with the same attributes), which the
``carla`` client library builds offline. :mod:`opencood_ext.sim.carla_bridge`
glues them to a live simulator.

Frames (docs/formats.md section 1): CARLA's world and sensor frames are
left-handed (x forward, y right, z up), the same as the project's, so nothing
is flipped. A 6-vector pose is ``[x, y, z, roll, yaw, pitch]`` in metres and
degrees and ``pose_to_matrix(transform_to_pose(t)) == t.get_matrix()``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from opencood_ext.data.frame import ObjectLabel
from opencood_ext.geometry.boxes import objects_to_boxes, points_in_boxes
from opencood_ext.geometry.transforms import invert_transform, matrix_to_pose, pose_to_matrix

from .world import AgentInfo, CameraSpec, LidarSpec

# CARLA's depth camera encodes depth as (R + G*256 + B*256^2) / (256^3 - 1) * 1000 m.
DEPTH_FAR_M = 1000.0
_DEPTH_SCALE = DEPTH_FAR_M / (256.0 ** 3 - 1.0)

# Vehicle blueprints' ``base_type`` attribute -> the project's class names.
BASE_TYPE_TO_CLASS = {"car": "Car", "van": "Van", "truck": "Truck", "bus": "Bus"}

# Attributes ``sensor.lidar.ray_cast_semantic`` accepts (it has no noise / drop-off).
_SEMANTIC_LIDAR_KEYS = ("channels", "range", "points_per_second", "rotation_frequency",
                        "upper_fov", "lower_fov", "horizontal_fov")


# --------------------------------------------------------------------------- poses

def transform_to_pose(transform) -> np.ndarray:
    """``carla.Transform`` -> (6,) float64 ``[x, y, z, roll, yaw, pitch]`` (m, degrees)."""
    loc, rot = transform.location, transform.rotation
    return np.array([loc.x, loc.y, loc.z, rot.roll, rot.yaw, rot.pitch], dtype=np.float64)


def pose_to_transform(pose):
    """(6,) ``[x, y, z, roll, yaw, pitch]`` -> ``carla.Transform`` (a sensor mount or a pose)."""
    import carla  # the client library is only needed for this direction

    p = [float(v) for v in np.asarray(pose, dtype=np.float64).reshape(6)]
    return carla.Transform(carla.Location(x=p[0], y=p[1], z=p[2]),
                           carla.Rotation(pitch=p[5], yaw=p[4], roll=p[3]))


def transform_to_matrix(transform) -> np.ndarray:
    """``carla.Transform`` -> (4, 4) float64 ``T_world_from_local`` in float64 precision
    (``Transform.get_matrix()`` computes in float32)."""
    return pose_to_matrix(transform_to_pose(transform))


def camera_extrinsics(lidar_mount, camera_mount) -> np.ndarray:
    """(4, 4) ``T_lidar_from_camera`` of two sensors rigidly attached to one parent.

    Mounts are ``T_parent_from_sensor`` poses; the result is
    ``inv(T_parent_from_lidar) @ T_parent_from_camera``. OPV2V's yaml
    ``extrinsic`` is the INVERSE of this matrix.
    """
    T_pl = pose_to_matrix(lidar_mount)
    T_pc = pose_to_matrix(camera_mount)
    return np.linalg.solve(T_pl, T_pc)


# --------------------------------------------------------------------------- LiDAR

def lidar_buffer_to_points(raw, source: str = "lidar") -> np.ndarray:
    """``sensor.lidar.ray_cast`` ``raw_data`` -> (N, 4) float32 ``x, y, z, intensity``
    in the sensor frame (a copy; CARLA reuses its buffer)."""
    buf = memoryview(raw).cast("B")
    if buf.nbytes % 16:
        raise ValueError(f"{source}: raw LiDAR buffer of {buf.nbytes} bytes is not a whole number "
                         "of 16-byte (x, y, z, intensity float32) points")
    return np.frombuffer(buf, dtype=np.float32).reshape(-1, 4).copy()


SEMANTIC_DTYPE = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("cos_inc", "<f4"),
                           ("object_idx", "<u4"), ("object_tag", "<u4")])


def semantic_buffer_to_points(raw, source: str = "semantic lidar") -> np.ndarray:
    """``sensor.lidar.ray_cast_semantic`` ``raw_data`` -> (N,) structured array with
    fields x, y, z, cos_inc (float32), object_idx (actor id), object_tag (uint32)."""
    buf = memoryview(raw).cast("B")
    if buf.nbytes % SEMANTIC_DTYPE.itemsize:
        raise ValueError(f"{source}: raw buffer of {buf.nbytes} bytes is not a whole number of "
                         f"{SEMANTIC_DTYPE.itemsize}-byte semantic LiDAR detections")
    return np.frombuffer(buf, dtype=SEMANTIC_DTYPE).copy()


def point_channels(counts: Sequence[int]) -> np.ndarray:
    """Per-channel point counts (``measurement.get_point_count(ch)``) -> (N,) int64
    channel of every point (CARLA stores points channel by channel, channel 0
    being the upper-most ring)."""
    c = np.asarray(counts, dtype=np.int64).reshape(-1)
    if (c < 0).any():
        raise ValueError(f"negative LiDAR point count in {c.tolist()}")
    return np.repeat(np.arange(len(c), dtype=np.int64), c)


def reduce_rings(points: np.ndarray, counts: Sequence[int], keep_every: int) -> np.ndarray:
    """Keep rings ``0, keep_every, 2 * keep_every, ...`` of a sweep (OPV2V-H's 32- and
    16-beam scans from the 64-beam one). ``points`` (N, C) in channel order."""
    ch = point_channels(counts)
    if len(ch) != len(points):
        raise ValueError(f"per-channel counts sum to {len(ch)} but the sweep has {len(points)} points")
    if keep_every < 1:
        raise ValueError(f"keep_every must be >= 1, got {keep_every}")
    return points[ch % keep_every == 0]


def lidar_attributes(spec: LidarSpec, semantic: bool = False) -> Dict[str, str]:
    """Blueprint attributes for ``sensor.lidar.ray_cast`` (or ``..._semantic``)."""
    attrs = spec.carla_attributes()
    if semantic:
        attrs = {k: attrs[k] for k in _SEMANTIC_LIDAR_KEYS}
    return attrs


# --------------------------------------------------------------------------- cameras

def _image_array(raw, width: int, height: int, source: str) -> np.ndarray:
    buf = memoryview(raw).cast("B")
    if buf.nbytes != width * height * 4:
        raise ValueError(f"{source}: {buf.nbytes} bytes do not hold a {width}x{height} BGRA image "
                         f"({width * height * 4} bytes)")
    return np.frombuffer(buf, dtype=np.uint8).reshape(height, width, 4)


def bgra_to_rgb(raw, width: int, height: int, source: str = "camera") -> np.ndarray:
    """CARLA ``Image.raw_data`` (BGRA, row-major) -> (H, W, 3) uint8 RGB (a copy)."""
    return np.ascontiguousarray(_image_array(raw, width, height, source)[:, :, 2::-1])


def decode_depth(raw, width: int, height: int, source: str = "depth camera") -> np.ndarray:
    """``sensor.camera.depth`` raw BGRA -> (H, W) float32 depth in metres along the
    optical axis: ``(R + G * 256 + B * 65536) / (256^3 - 1) * 1000``."""
    a = _image_array(raw, width, height, source).astype(np.float64)
    code = a[:, :, 2] + a[:, :, 1] * 256.0 + a[:, :, 0] * 65536.0
    return (code * _DEPTH_SCALE).astype(np.float32)


def encode_depth(depth_m: np.ndarray) -> np.ndarray:
    """Inverse of :func:`decode_depth` (for tests and replays): (H, W) metres ->
    (H, W, 4) uint8 BGRA with alpha 255, quantised to 1000 / (256^3 - 1) m."""
    code = np.clip(np.rint(np.asarray(depth_m, np.float64) / _DEPTH_SCALE), 0, 256 ** 3 - 1)
    code = code.astype(np.int64)
    out = np.empty(code.shape + (4,), dtype=np.uint8)
    out[..., 2] = code & 0xFF
    out[..., 1] = (code >> 8) & 0xFF
    out[..., 0] = (code >> 16) & 0xFF
    out[..., 3] = 255
    return out


# --------------------------------------------------------------------------- labels

def obj_type_of(base_type: str) -> str:
    """Vehicle blueprint ``base_type`` -> "Car" / "Van" / "Truck" / "Bus" ("Car" when
    the blueprint does not say; callers skip two-wheelers before asking)."""
    return BASE_TYPE_TO_CLASS.get(str(base_type).strip().lower(), "Car")


def vehicle_label(actor_id: int, transform, bounding_box, obj_type: str = "Car",
                  speed_kmh: float = 0.0) -> ObjectLabel:
    """A vehicle's transform and ``bounding_box`` -> OPV2V :class:`ObjectLabel`.

    ``location`` is the actor location; CARLA's ``bounding_box.location`` is in
    the ACTOR frame, so it is rotated into world axes to become OPV2V's
    ``center`` (an offset added in world axes); ``angle`` is the actor's
    [roll, yaw, pitch] (composed with the box's own rotation when that is not
    zero); ``extent`` is CARLA's extent, already half sizes. The result's world
    corners equal ``bounding_box.get_world_vertices(transform)``.
    """
    T_world_actor = transform_to_matrix(transform)
    bl, br = bounding_box.location, bounding_box.rotation
    box_rot = (br.roll, br.yaw, br.pitch)
    T_actor_box = pose_to_matrix([bl.x, bl.y, bl.z, *box_rot])
    T_world_box = T_world_actor @ T_actor_box
    location = np.array([transform.location.x, transform.location.y, transform.location.z])
    center = T_world_box[:3, 3] - location
    if any(abs(v) > 1e-9 for v in box_rot):
        angle = matrix_to_pose(T_world_box)[3:]
    else:
        angle = transform_to_pose(transform)[3:]
    ext = bounding_box.extent
    return ObjectLabel(object_id=int(actor_id), location=location, center=center, angle=angle,
                       extent=[ext.x, ext.y, ext.z], obj_type=obj_type, speed=float(speed_kmh))


def visible_ids(ids: Sequence[int], objects: Sequence[ObjectLabel], points: np.ndarray,
                T_world_lidar: np.ndarray, max_range: float, min_points: int = 1) -> List[int]:
    """Ids of the objects with at least ``min_points`` of ``points`` (N, 3+), LiDAR
    frame) inside their box and a centre within ``max_range`` m (xy) of the sensor."""
    if not len(ids) or not len(points):
        return []
    boxes = objects_to_boxes(objects, invert_transform(T_world_lidar))  # (M, 7) LiDAR frame
    xy = np.asarray(points[:, :2], dtype=np.float64)
    out = []
    for oid, box in zip(ids, boxes):
        if np.hypot(box[0], box[1]) > max_range:
            continue
        r = 0.5 * np.linalg.norm(box[3:5])  # circumradius in xy: a cheap pre-filter
        near = (np.abs(xy[:, 0] - box[0]) <= r) & (np.abs(xy[:, 1] - box[1]) <= r)
        if near.sum() >= min_points and points_in_boxes(points[near, :3], box[None]).sum() >= min_points:
            out.append(int(oid))
    return sorted(out)


def speed_kmh(velocity) -> float:
    """``carla.Vector3D`` velocity (m/s) -> speed in km/h (OPV2V's unit)."""
    return 3.6 * float(np.sqrt(velocity.x ** 2 + velocity.y ** 2 + velocity.z ** 2))


# --------------------------------------------------------------------------- sensor plans

@dataclass
class SensorPlan:
    """One CARLA sensor to attach to an agent.

    role: "lidar", "rgb" or "depth"; name: the camera name for cameras.
    mount: ``T_parent_from_sensor`` pose [x, y, z, roll, yaw, pitch].
    """

    role: str
    blueprint: str
    attributes: Dict[str, str]
    mount: tuple
    name: str = "lidar"
    spec: Optional[object] = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return self.role if self.role == "lidar" else f"{self.role}:{self.name}"


def sensor_plans(agent: AgentInfo, record_cameras: bool = True, depth: bool = True) -> List[SensorPlan]:
    """The CARLA sensors one agent needs: its LiDAR (reduced ring variants are cut
    from this one sweep, no extra sensor) and, with ``record_cameras``, an RGB (and
    a depth) camera per :class:`CameraSpec`."""
    plans: List[SensorPlan] = []
    if agent.lidar is not None:
        plans.append(SensorPlan("lidar", "sensor.lidar.ray_cast", lidar_attributes(agent.lidar),
                                tuple(agent.lidar.mount), "lidar", agent.lidar))
    if record_cameras:
        for cam in agent.cameras:
            plans.append(SensorPlan("rgb", "sensor.camera.rgb", cam.carla_attributes(),
                                    tuple(cam.mount), cam.name, cam))
            if depth:
                plans.append(SensorPlan("depth", "sensor.camera.depth", cam.carla_attributes(),
                                        tuple(cam.mount), cam.name, cam))
    if not plans:
        raise ValueError(f"agent {agent.agent_id} ({agent.agent_type}) has no LiDAR and no cameras "
                         "to record")
    return plans


def camera_of(plan: SensorPlan) -> CameraSpec:
    if not isinstance(plan.spec, CameraSpec):
        raise TypeError(f"sensor plan {plan.key} is not a camera")
    return plan.spec
