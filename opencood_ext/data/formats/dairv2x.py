"""DAIR-V2X-C reader (docs/formats.md section 2): one vehicle + one infrastructure LiDAR.

``<root>/cooperative/data_info.json`` lists the cooperative pairs and is the
index (read at construction; nothing else is). Per pair:

* vehicle (agent id 0): ``T_world_from_lidar = T_world_from_novatel @
  T_novatel_from_lidar`` from ``vehicle-side/calib/novatel_to_world/<id>.json``
  and ``vehicle-side/calib/lidar_to_novatel/<id>.json``;
* infrastructure (agent id -1): ``infrastructure-side/calib/virtuallidar_to_world/<id>.json``
  with the pair's ``system_error_offset`` ``delta_x`` / ``delta_y`` added to the
  translation;
* objects (``labels="cooperative"``, the default): the cooperative ``label_world`` file
  (``cooperative_label_path``, by default ``cooperative/label_world/<vehicle id>.json``); each
  ``world_8_points`` box becomes an ObjectLabel with ``location`` = box centre, ``center`` = 0,
  ``angle`` = [0, yaw_deg, 0], ``extent`` = half sizes; only Car / Van / Truck /
  Bus are kept. Object ids are the entry's position in the label file, and both
  agents list every kept object as visible (the cooperative label is already a
  union).
* objects (``labels="sides"``, what the GenComm / HEAL heterogeneous dataset reads): each agent's
  own labels, ``vehicle-side/label/lidar/<vehicle id>.json`` and
  ``infrastructure-side/label/virtuallidar/<infrastructure id>.json`` (``type``,
  ``3d_dimensions {h, w, l}`` full sizes, ``3d_location {x, y, z}`` box centre in that agent's
  LiDAR frame, ``rotation`` yaw in radians); entries with a zero size are skipped (as the
  reference), the vehicle classes kept. The box goes to the world through the agent's pose (roll
  and pitch kept in ``angle``); ids are the vehicle's entry positions and
  :data:`INFRA_LABEL_ID0` + the infrastructure's; each agent lists only its own as visible, and
  the frame is marked ``side_labels`` (ground truth merges the two by overlap).
* LiDAR: PCD ``x y z intensity`` with intensity / 256; NaN/inf rows are a data
  fault as in every reader (:func:`opencood_ext.data.faults.drop_nonfinite`:
  dropped with a warning naming the file and count, or refused with ``strict``).

The corner order is DAIR's (bottom face ``(+l,+w) (+l,-w) (-l,-w) (-l,+w)``,
then the top face), the same as :func:`~opencood_ext.geometry.boxes_to_corners`,
so the heading comes from it; files whose corners do not follow it fall back to
an order-free fit (heading known only up to 180 degrees). Frames are
right-handed; nothing is flipped. Every frame has scenario ``"cooperative"`` and
the vehicle frame id as timestamp. Cameras are not loaded.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ...geometry import corners_to_boxes, matrix_to_pose
from ..errors import DataFormatError, not_utf8
from ..frame import VEHICLE_CLASSES, AgentObs, Frame, ObjectLabel
from .decode_cache import DecodeCache
from .layout import IndexedReader
from ..faults import drop_nonfinite
from .pcd import decode_pcd

log = logging.getLogger(__name__)

SCENARIO = "cooperative"
DAIR_INTENSITY_SCALE = 256.0
_KEEP = {c.lower(): c for c in VEHICLE_CLASSES}
LABEL_SOURCES = ("cooperative", "sides")
INFRA_LABEL_ID0 = 100000  # the infrastructure's own labels are numbered from here (labels="sides")


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DataFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise not_utf8(path, exc) from None
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, f"not valid JSON: {exc}") from None


def _frame_id(p: str) -> str:
    return PurePosixPath(str(p).replace("\\", "/")).stem


def calib_matrix(path: Path) -> np.ndarray:
    """A DAIR calib JSON (``{rotation, translation}``, optionally under ``transform``) -> (4, 4)."""
    d = _read_json(path)
    if isinstance(d, dict) and isinstance(d.get("transform"), dict):
        d, prefix = d["transform"], "transform."
    else:
        prefix = ""
    if not isinstance(d, dict):
        raise DataFormatError(path, "expected a JSON object with rotation and translation")
    T = np.eye(4)
    for key, shape in (("rotation", (3, 3)), ("translation", (3,))):
        if key not in d:
            raise DataFormatError(path, "missing key", key=prefix + key)
        try:
            arr = np.asarray(d[key], dtype=np.float64)
            arr = arr.reshape(shape)
        except (TypeError, ValueError):
            raise DataFormatError(path, f"expected {int(np.prod(shape))} numbers", key=prefix + key) from None
        if key == "rotation":
            T[:3, :3] = arr
        else:
            T[:3, 3] = arr
    return T


def _ordered_box(c: np.ndarray) -> Optional[np.ndarray]:
    """(7,) box when the corners follow DAIR's order (a cuboid in that order), else None."""
    if c[4:, 2].mean() < c[:4, 2].mean():
        c = c[[4, 5, 6, 7, 0, 1, 2, 3]]
    b, up = c[:4], c[4:] - c[:4]
    e01, e03 = b[1] - b[0], b[3] - b[0]
    scale = max(np.linalg.norm(e01), np.linalg.norm(e03), np.linalg.norm(up[0]), 1e-6)
    tol = 0.05 * scale
    ok = (np.linalg.norm(e01 - (b[2] - b[3])) < tol and np.linalg.norm(e03 - (b[2] - b[1])) < tol
          and np.linalg.norm(up - up[0], axis=1).max() < tol
          and max(abs(np.dot(e01, e03)), abs(np.dot(up[0], e01)), abs(np.dot(up[0], e03))) < tol * scale)
    return corners_to_boxes(c[None])[0] if ok else None


def _orderless_box(c: np.ndarray) -> np.ndarray:
    """(7,) box from 8 corners in any order (yaw modulo pi)."""
    order = np.argsort(c[:, 2], kind="stable")
    bottom, top = c[order[:4]], c[order[4:]]
    d = np.linalg.norm(bottom[1:, :2] - bottom[0, :2], axis=1)
    edges = bottom[1:][np.argsort(d)[:2], :2] - bottom[0, :2]  # the two sides at corner 0
    long_e, short_e = (edges[0], edges[1]) if np.linalg.norm(edges[0]) >= np.linalg.norm(edges[1]) \
        else (edges[1], edges[0])
    return np.array([*c.mean(axis=0), np.linalg.norm(long_e), np.linalg.norm(short_e),
                     top[:, 2].mean() - bottom[:, 2].mean(), np.arctan2(long_e[1], long_e[0])])


def corners_to_label(corners, object_id: int, obj_type: str, path, key: str) -> ObjectLabel:
    """DAIR ``world_8_points`` (8, 3) -> ObjectLabel (see the module docstring)."""
    try:
        c = np.asarray(corners, dtype=np.float64).reshape(8, 3)
    except (TypeError, ValueError):
        raise DataFormatError(path, "world_8_points must be 8 x 3 numbers", key=key) from None
    if not np.isfinite(c).all():
        raise DataFormatError(path, "world_8_points contains NaN or infinite values", key=key)
    box = _ordered_box(c)
    if box is None:
        log.debug("%s [%s]: corners not in DAIR order; using an order-free fit", path, key)
        box = _orderless_box(c)
    return ObjectLabel(object_id=object_id, location=box[:3], center=np.zeros(3),
                       angle=[0.0, float(np.degrees(box[6])), 0.0], extent=box[3:6] / 2.0,
                       obj_type=obj_type)


def _number(v, path, key) -> float:
    try:
        return float(v)  # camera-side labels write numbers as strings
    except (TypeError, ValueError):
        raise DataFormatError(path, f"expected a number, got {v!r}", key=key) from None


def load_side_labels(path: Path, T_world_from_lidar: np.ndarray, first_id: int = 0) -> Dict[int, ObjectLabel]:
    """Vehicle classes of one side's label file (boxes in that side's LiDAR frame) as world
    ObjectLabels, ids ``first_id`` + the entry's position; zero-size entries skipped."""
    items = _read_json(path)
    if not isinstance(items, list):
        raise DataFormatError(path, "expected a JSON list of labelled objects")
    out = {}
    for k, item in enumerate(items):
        for key in ("type", "3d_dimensions", "3d_location", "rotation"):
            if not isinstance(item, dict) or key not in item:
                raise DataFormatError(path, "missing key", key=f"[{k}].{key}")
        dims, loc = item["3d_dimensions"], item["3d_location"]
        for name, d, axes in (("3d_dimensions", dims, "lwh"), ("3d_location", loc, "xyz")):
            if not isinstance(d, dict) or any(a not in d for a in axes):
                raise DataFormatError(path, f"expected an object with keys {list(axes)}", key=f"[{k}].{name}")
        l, w, h = (_number(dims[a], path, f"[{k}].3d_dimensions.{a}") for a in "lwh")
        cls = _KEEP.get(str(item["type"]).lower())
        if cls is None or l == 0 or w == 0 or h == 0:
            continue
        centre = [_number(loc[a], path, f"[{k}].3d_location.{a}") for a in "xyz"]
        yaw = _number(item["rotation"], path, f"[{k}].rotation")
        box = np.eye(4)
        box[:2, :2] = [[np.cos(yaw), -np.sin(yaw)], [np.sin(yaw), np.cos(yaw)]]
        box[:3, 3] = centre
        pose = matrix_to_pose(np.asarray(T_world_from_lidar, np.float64) @ box)
        out[first_id + k] = ObjectLabel(object_id=first_id + k, location=pose[:3], center=np.zeros(3),
                                        angle=pose[3:], extent=np.array([l, w, h]) / 2.0, obj_type=cls)
    return out


def load_cooperative_labels(path: Path) -> Dict[int, ObjectLabel]:
    """Vehicle classes of a cooperative ``label_world`` file, keyed by position."""
    items = _read_json(path)
    if not isinstance(items, list):
        raise DataFormatError(path, "expected a JSON list of labelled objects")
    out = {}
    for k, item in enumerate(items):
        if not isinstance(item, dict) or "type" not in item:
            raise DataFormatError(path, "missing key", key=f"[{k}].type")
        cls = _KEEP.get(str(item["type"]).lower())
        if cls is None:
            continue
        if "world_8_points" not in item:
            raise DataFormatError(path, "missing key", key=f"[{k}].world_8_points")
        out[k] = corners_to_label(item["world_8_points"], k, cls, path, f"[{k}].world_8_points")
    return out


class DairV2XReader(IndexedReader):
    """Cooperative DAIR-V2X-C frames (vehicle agent 0, infrastructure agent -1).

    Args:
        root: dataset root holding ``cooperative/``, ``vehicle-side/``, ``infrastructure-side/``.
        split_ids: None (every pair), a list of vehicle frame ids, or a path to
            a JSON list of them.
        skip_bad: see :mod:`.layout`.
        vehicle_type, infra_type: ``agent_type`` given to the two agents.
        cache_dir: keep decoded point clouds there (:mod:`.decode_cache`); None: no cache.
        strict: NaN/inf points raise a DataFaultError naming the file instead of being
            dropped with a DataFaultWarning (:mod:`opencood_ext.data.faults`).
        labels: "cooperative" (the ``label_world`` file) or "sides" (each agent's own labels,
            as the GenComm / HEAL heterogeneous dataset; module docstring).
    """

    left_handed = False

    def __init__(self, root, split_ids: Union[None, str, Path, Sequence[str]] = None, skip_bad: bool = False,
                 vehicle_type: str = "m1", infra_type: str = "m1", cache_dir=None, strict: bool = False,
                 labels: str = "cooperative"):
        super().__init__(skip_bad, strict)
        if labels not in LABEL_SOURCES:
            raise ValueError(f"labels must be one of {list(LABEL_SOURCES)}, got {labels!r}")
        self.labels = labels
        self.cache = None if cache_dir is None else DecodeCache(cache_dir)
        self.root = self._root = Path(root)
        self.vehicle_type, self.infra_type = vehicle_type, infra_type
        self.info_path = self.root / "cooperative" / "data_info.json"
        if not self.root.is_dir():
            raise DataFormatError(self.root, "dataset root does not exist or is not a directory")
        info = _read_json(self.info_path)
        if not isinstance(info, list):
            raise DataFormatError(self.info_path, "expected a JSON list of cooperative pairs")
        entries: List[Tuple[str, dict, int]] = []
        for k, e in enumerate(info):
            src = e.get("vehicle_image_path", e.get("vehicle_pointcloud_path")) if isinstance(e, dict) else None
            if src is None:
                raise DataFormatError(self.info_path, "missing key", key=f"[{k}].vehicle_image_path")
            entries.append((_frame_id(src), e, k))
        self.split = ""
        if split_ids is not None:
            ids = self._split_list(split_ids)
            known = {fid for fid, _, _ in entries}
            missing = [i for i in ids if i not in known]
            if missing:
                log.warning("%d split ids are not in %s (first: %s)", len(missing), self.info_path, missing[:3])
            wanted = set(ids)
            entries = [x for x in entries if x[0] in wanted]
        if not entries:
            raise DataFormatError(self.info_path, "no cooperative pairs selected")
        self._entries = entries

    def _split_list(self, split_ids) -> List[str]:
        if isinstance(split_ids, (str, Path)):
            path = Path(split_ids)
            self.split = path.stem
            data = _read_json(path)
            if not isinstance(data, list):
                raise DataFormatError(path, "split file must be a JSON list of vehicle frame ids")
            return [str(x) for x in data]
        return [str(x) for x in split_ids]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def scenarios(self) -> List[str]:
        return [SCENARIO]

    @property
    def samples(self) -> List[Tuple[str, str]]:
        return [(SCENARIO, fid) for fid, _, _ in self._entries]

    def frame_path(self, i: int) -> Path:
        """The vehicle point cloud of pair ``i``."""
        fid, e, _ = self._entries[self._index(i)]
        return self.root / e.get("vehicle_pointcloud_path", f"vehicle-side/velodyne/{fid}.pcd")

    def _field(self, e: dict, k: int, key: str) -> str:
        if key not in e:
            raise DataFormatError(self.info_path, "missing key", key=f"[{k}].{key}")
        return str(e[key])

    def _read_points(self, path: Path) -> np.ndarray:
        if self.cache is None:
            pts = decode_pcd(path, intensity_scale=DAIR_INTENSITY_SCALE)
        else:  # the cache keeps the rows as stored: every read reports NaN/inf ones
            pts = self.cache.points(path, decode_pcd, intensity_scale=DAIR_INTENSITY_SCALE)
        return drop_nonfinite(pts, path, 4, strict=self.strict)

    def _load(self, i: int) -> Frame:
        fid, e, k = self._entries[i]
        inf_id = _frame_id(e.get("infrastructure_image_path", self._field(e, k, "infrastructure_pointcloud_path")))
        veh_side, inf_side = self.root / "vehicle-side" / "calib", self.root / "infrastructure-side" / "calib"
        T_veh = calib_matrix(veh_side / "novatel_to_world" / f"{fid}.json") @ \
            calib_matrix(veh_side / "lidar_to_novatel" / f"{fid}.json")
        T_inf = calib_matrix(inf_side / "virtuallidar_to_world" / f"{inf_id}.json")
        offset = e.get("system_error_offset") or {}
        try:
            T_inf[0, 3] += float(offset.get("delta_x", 0.0))
            T_inf[1, 3] += float(offset.get("delta_y", 0.0))
        except (TypeError, ValueError, AttributeError):
            raise DataFormatError(self.info_path, "delta_x / delta_y must be numbers",
                                  key=f"[{k}].system_error_offset") from None
        if self.labels == "sides":
            veh_objects = load_side_labels(self.root / "vehicle-side" / "label" / "lidar" / f"{fid}.json", T_veh)
            inf_objects = load_side_labels(self.root / "infrastructure-side" / "label" / "virtuallidar" /
                                           f"{inf_id}.json", T_inf, INFRA_LABEL_ID0)
            objects = {**veh_objects, **inf_objects}
            veh_visible, inf_visible = sorted(veh_objects), sorted(inf_objects)
        else:
            label_rel = e.get("cooperative_label_path", f"cooperative/label_world/{fid}.json")
            objects = load_cooperative_labels(self.root / label_rel)
            veh_visible = inf_visible = sorted(objects)
        veh = AgentObs(agent_id=0, agent_type=self.vehicle_type, T_world_from_lidar=T_veh,
                       lidar=self._read_points(self.root / self._field(e, k, "vehicle_pointcloud_path")),
                       visible_ids=list(veh_visible), meta={"frame_id": fid})
        inf = AgentObs(agent_id=-1, agent_type=self.infra_type, T_world_from_lidar=T_inf,
                       lidar=self._read_points(self.root / self._field(e, k, "infrastructure_pointcloud_path")),
                       visible_ids=list(inf_visible),
                       meta={"frame_id": inf_id, "system_error_offset": dict(offset)})
        return Frame(scenario=SCENARIO, timestamp=fid, agents=[veh, inf], objects=objects,
                     split=self.split, source=str(self.info_path), side_labels=self.labels == "sides")
