"""Ground-truth boxes of a Frame in a chosen sensor frame."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence

import numpy as np

from ..geometry import boxes_inside_range, invert_transform, objects_to_boxes
from .frame import Frame


@dataclass
class GroundTruth:
    """Boxes of one frame in one sensor frame (e.g. the ego LiDAR).

    boxes: (N, 7) float32 ``[x, y, z, l, w, h, yaw]``: centre, FULL sizes, yaw in
        radians, in the frame given by ``T_world_from_sensor``.
    ids: (N,) int64 object ids (ascending).
    types: N class names (``ObjectLabel.obj_type``).
    """

    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 7), np.float32))
    ids: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.int64))
    types: List[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


def frame_ground_truth(frame: Frame, T_world_from_sensor, lidar_range: Optional[Sequence[float]] = None,
                       classes: Optional[Iterable[str]] = None,
                       visible_to: Optional[Iterable[int]] = None) -> GroundTruth:
    """Ground truth of ``frame`` as boxes in the sensor frame ``T_world_from_sensor`` (4, 4).

    Args:
        lidar_range: ``(xmin, ymin, zmin, xmax, ymax, zmax)`` in the sensor frame;
            a box is kept when all 8 of its corners lie inside, z included, bounds
            inclusive (the field's rule, :func:`~opencood_ext.geometry.boxes_inside_range`).
        classes: keep only objects whose ``obj_type`` is listed.
        visible_to: agent ids; keep objects any of them lists in ``visible_ids``
            (default: every object of the frame, the union over all agents).
    """
    if visible_to is None:
        ids = sorted(frame.objects)
    else:
        seen = set()
        for aid in visible_to:
            seen.update(frame.agent(int(aid)).visible_ids)
        ids = sorted(i for i in seen if i in frame.objects)
    if classes is not None:
        keep = set(classes)
        ids = [i for i in ids if frame.objects[i].obj_type in keep]
    T_sensor_from_world = invert_transform(np.asarray(T_world_from_sensor, dtype=np.float64))
    boxes = objects_to_boxes([frame.objects[i] for i in ids], T_sensor_from_world)
    ids_arr = np.asarray(ids, dtype=np.int64)
    if lidar_range is not None and len(ids):
        mask = boxes_inside_range(boxes, lidar_range)
        boxes, ids_arr = boxes[mask], ids_arr[mask]
    return GroundTruth(boxes=boxes.astype(np.float32).reshape(-1, 7), ids=ids_arr,
                       types=[frame.objects[int(i)].obj_type for i in ids_arr])
