"""The GenComm reference / HEAL datasets' agent and point rules, for ``protocol: reference``
(docs/protocol.md, "Reference protocol: evaluation", lists each with its source file).

* Agent order: ids compared as STRINGS ("-1" < "1041" < "650"), then a roadside unit that
  sorts first moves to the end (only that one). The first agent is the ego; when its type is
  not an ego type (the reference's ``heter.ego_modality``, our ``data.ego_types``; by default
  the alliance's), the first agent of an ego type in string order is the ego (a roadside unit
  too: "-1" sorts first) and every other agent follows in string order (no roadside-unit move
  then). With no agent of an ego type the order stands, as the reference's
  ``Adaptor.reorder_cav_list`` leaves it; an alliance agent leads where the first is not one.
  With a type mapping (the reference's ``heter.mapping_dict``, our ``data.type_mapping``) the
  first agent's type is tested as the assignment names it, BEFORE the mapping (an m2 mapped to
  m1 is not of ego type m1), the others' after it, as ``reorder_cav_list`` tests them.
* Selection: the first ``max_cav`` agents of that order are taken BEFORE the communication
  range and the alliance types are checked, so an agent out of range or of another type still
  uses up a place.
* Each LiDAR agent drops its own vehicle's returns: points with x in [-1.95, 2.95] and y in
  [-1.1, 1.1] m in its own sensor frame (z not checked; applied to roadside units too).
* Per-agent labels (DAIR-V2X, a Frame with ``side_labels``): each selected agent's own boxes, their
  corners taken to the ego frame and fitted back to a box by the reference's ``corner_to_center``
  (:func:`reference_corner_fit`), kept when all 8 corners of that box lie inside the range with z
  widened by 1 m on each side; the ego's all, each other agent's box only when its bird's-eye-view
  IoU with every ego box is at most 0.05 (GenComm ``intermediate_heter_fusion_dataset.py``
  ``__getitem__``, ``dairv2x`` branch; ``box_utils.py`` ``load_single_objects_dairv2x_hetero``). The
  reference's evaluation then checks x and y only (``generate_gt_bbx_by_iou``), which these boxes
  already pass.
"""
from __future__ import annotations

from typing import Iterable, List, Mapping, Optional, Sequence

import numpy as np

from ..geometry import bev_iou, boxes_inside_range, invert_transform, object_corners_world
from .frame import AgentObs, Frame
from .ground_truth import GroundTruth

# (xmin, xmax, ymin, ymax) metres, bounds inclusive: the reference's own-vehicle box
OWN_VEHICLE_BOX = (-1.95, 2.95, -1.1, 1.1)
SIDE_LABEL_IOU = 0.05  # a collaborator's box overlapping an ego box by more is the same object
SIDE_LABEL_Z_MARGIN = 1.0  # metres added below and above the range's z for per-agent labels


def reference_order(agents: Sequence[AgentObs]) -> List[AgentObs]:
    """Agents in the reference's order: string-sorted ids, a leading roadside unit moved last."""
    out = sorted(agents, key=lambda a: str(a.agent_id))
    if out and out[0].agent_id < 0:
        out = out[1:] + out[:1]
    return out


def reference_ego_first(agents: Sequence[AgentObs], ego_types: Iterable[str],
                        type_mapping: Optional[Mapping[str, str]] = None) -> List[AgentObs]:
    """The agents (in :func:`reference_order`) with the reference's ego first: the first agent when its
    type is in ``ego_types``, else the first agent of such a type in string order of the ids, the
    others after it in string order (``Adaptor.reorder_cav_list``); unchanged when none has such a type.

    type_mapping: the agents carry their assigned types and this maps them (``data.type_mapping``):
    the first agent's type is tested as assigned, the others' mapped, as the reference tests them."""
    wanted = set(ego_types)
    ordered = list(agents)
    if not ordered or ordered[0].agent_type in wanted:
        return ordered
    mapped = (lambda t: t) if type_mapping is None else type_mapping.__getitem__
    by_id = sorted(ordered, key=lambda a: str(a.agent_id))
    ego = next((a for a in by_id if mapped(a.agent_type) in wanted), None)
    return ordered if ego is None else [ego] + [a for a in by_id if a is not ego]


def reference_selection(agents: Sequence[AgentObs], alliance: Iterable[str], comm_range: float,
                        max_cav: int, with_collaborators: bool = True,
                        ego_types: Optional[Iterable[str]] = None) -> List[AgentObs]:
    """Ego first, then the collaborators the reference keeps (module docstring).

    agents: the frame's agents in :func:`reference_order`; alliance: the agent types taking part;
    ego_types: the types an ego may have (the reference's ``ego_modality``; None: the alliance's).
    Raises ValueError when no agent is of an alliance type."""
    types = set(alliance)
    ordered = list(agents)
    if not any(a.agent_type in types for a in ordered):
        raise ValueError(f"no agent of the alliance types {sorted(types)}")
    ordered = reference_ego_first(ordered, types if ego_types is None else set(ego_types) & types)
    if ordered[0].agent_type not in types:  # no ego-type agent and the first is not in the alliance
        ordered = reference_ego_first(ordered, types)
    ego = ordered[0]
    if not with_collaborators:
        return [ego]
    ego_xy = ego.T_world_from_lidar[:2, 3]
    taken = ordered[:max(int(max_cav), 1)]
    return [ego] + [a for a in taken[1:] if a.agent_type in types
                    and np.linalg.norm(a.T_world_from_lidar[:2, 3] - ego_xy) <= comm_range]


def remove_own_points(points: np.ndarray) -> np.ndarray:
    """(N, C) points in an agent's own sensor frame -> those outside :data:`OWN_VEHICLE_BOX`."""
    x0, x1, y0, y1 = OWN_VEHICLE_BOX
    p = np.asarray(points)
    own = (p[:, 0] >= x0) & (p[:, 0] <= x1) & (p[:, 1] >= y0) & (p[:, 1] <= y1)
    return p[~own]


def reference_corner_fit(corners: np.ndarray) -> np.ndarray:
    """(N, 8, 3) corners (bottom face (+l, +w) (+l, -w) (-l, -w) (-l, +w), then the top face) -> (N, 7)
    ``[x, y, z, l, w, h, yaw]`` as the reference's ``box_utils.corner_to_center``: the centre the mean
    of corners 0, 3, 5, 6; l and w the means of four edges' lengths in x-y (a tilted box comes out
    shorter than its 3-D edges); h the mean z span; yaw the plain mean of four edges' ``atan2``
    (so four headings split across +-pi average to another angle, as there)."""
    c = np.asarray(corners, dtype=np.float64).reshape(-1, 8, 3)

    def span(i, j):
        return np.linalg.norm(c[:, i, :2] - c[:, j, :2], axis=1)

    def heading(i, j):
        return np.arctan2(c[:, i, 1] - c[:, j, 1], c[:, i, 0] - c[:, j, 0])

    centre = c[:, [0, 3, 5, 6]].mean(axis=1)
    length = (span(0, 3) + span(2, 1) + span(4, 7) + span(5, 6)) / 4
    width = (span(0, 1) + span(2, 3) + span(4, 5) + span(6, 7)) / 4
    height = np.abs((c[:, 4:, 2] - c[:, :4, 2]).mean(axis=1))
    yaw = (heading(1, 2) + heading(0, 3) + heading(5, 6) + heading(4, 7)) / 4
    return np.concatenate([centre, np.stack([length, width, height, yaw], axis=1)], axis=1)


def _agent_boxes(frame: Frame, agent_id: int, T_sensor_from_world: np.ndarray, lidar_range: np.ndarray,
                 classes: Optional[set]) -> GroundTruth:
    """One agent's own labels in the sensor frame by the reference's corner fit, range-filtered."""
    ids = [i for i in frame.agent(int(agent_id)).visible_ids
           if i in frame.objects and (classes is None or frame.objects[i].obj_type in classes)]
    if not ids:
        return GroundTruth()
    objs = [frame.objects[i] for i in ids]
    corners = np.stack([object_corners_world(o.location, o.center, o.angle, o.extent) for o in objs])
    boxes = reference_corner_fit(corners @ T_sensor_from_world[:3, :3].T + T_sensor_from_world[:3, 3])
    keep = boxes_inside_range(boxes, lidar_range)
    return GroundTruth(boxes=boxes[keep].astype(np.float32), ids=np.asarray(ids, np.int64)[keep],
                       types=[o.obj_type for o, k in zip(objs, keep) if k])


def side_label_ground_truth(frame: Frame, agent_ids: Sequence[int], T_world_from_sensor,
                            lidar_range: Sequence[float], classes: Optional[Iterable[str]] = None) -> GroundTruth:
    """Ground truth from per-agent labels (module docstring): ``agent_ids`` ego first, boxes in the
    sensor frame ``T_world_from_sensor``; the ego's boxes first, then each other agent's kept ones."""
    r = np.asarray(lidar_range, dtype=np.float64).copy()
    r[2] -= SIDE_LABEL_Z_MARGIN
    r[5] += SIDE_LABEL_Z_MARGIN
    T = invert_transform(np.asarray(T_world_from_sensor, dtype=np.float64))
    keep_classes = None if classes is None else set(classes)
    per_agent = [_agent_boxes(frame, aid, T, r, keep_classes) for aid in agent_ids]
    if not per_agent:
        return GroundTruth()
    ego, parts = per_agent[0], [per_agent[0]]
    for other in per_agent[1:]:
        if len(other) and len(ego):
            keep = (bev_iou(other.boxes.astype(np.float64), ego.boxes.astype(np.float64)) <= SIDE_LABEL_IOU).all(1)
        else:
            keep = np.ones(len(other), bool)
        parts.append(GroundTruth(other.boxes[keep], other.ids[keep], [t for t, k in zip(other.types, keep) if k]))
    return GroundTruth(boxes=np.concatenate([p.boxes for p in parts]).astype(np.float32).reshape(-1, 7),
                       ids=np.concatenate([p.ids for p in parts]).astype(np.int64),
                       types=[t for p in parts for t in p.types])
