"""Write Frames as an OPV2V / OPV2V-H dataset that :class:`OPV2VReader` and
OpenCOOD-family tools read.

Per agent: ``<root>/<split>/<scenario>/<agent_id>/<timestamp>.pcd`` (rgb-packed
intensity, OPV2V's encoding), ``.yaml``, ``_bev_visibility.png`` (HEAL's
visible-cell mask, :mod:`.bev_visibility`), ``_camera{i}.png``, and OPV2V-H's
``_32.pcd`` / ``_16.pcd`` (from ``lidar_beams``) and ``_depth{i}.png`` (8-bit
metres, :mod:`.opv2v_io`). The OPV2V-H files go in the same directory, or with
``hetero_root`` in HEAL's side tree ``<hetero_root>/<split>/<scenario>/<agent_id>/``
(:func:`~.layout.hetero_tree`). Output bytes depend only on the Frame (sorted
yaml keys, exact float repr, deterministic PNG/PCD encoders).

:data:`WRITER_FORMAT` numbers what the writer puts on disk (the recorder keeps
it in its completion markers): 1 = 16-bit depth x 256, no visibility masks;
2 = 8-bit depth in metres and ``_bev_visibility.png``.

yaml per agent: ``lidar_pose``; ``true_ego_pos`` / ``predicted_ego_pos`` /
``ego_speed`` from ``meta`` (defaults: the LiDAR pose, the true pose, 0);
``vehicles`` = the frame objects in that agent's ``visible_ids`` (when NO agent
lists visible ids, every agent gets every object, so the ground truth
survives); ``camera{i}`` with ``cords``, ``extrinsic`` (= inv(T_lidar_from_camera))
and ``intrinsic``; plus the other ``meta`` entries (keys starting with ``_`` are
not written).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Mapping

import numpy as np

from ...atomic_files import atomic_write_bytes
from ...geometry import matrix_to_pose, pose_to_matrix
from ..frame import AgentObs, CameraObs, Frame, ObjectLabel
from .bev_visibility import visibility_mask, write_visibility_png
from .opv2v_io import CAMERA_KEY, dump_yaml, plain, write_depth_png, write_rgb_png
from .pcd import write_pcd

_CAM_NAME = re.compile(r"^camera(\d+)$")
WRITER_FORMAT = 2


def _pose_for(T: np.ndarray, raw) -> List[float]:
    """The raw 6-vector when it still describes ``T``, else one computed from ``T``."""
    if raw is not None:
        raw = np.asarray(raw, dtype=np.float64).reshape(-1)
        if raw.shape == (6,) and np.allclose(pose_to_matrix(raw), T, atol=1e-9, rtol=0):
            return [float(v) for v in raw]
    return [float(v) for v in matrix_to_pose(np.asarray(T, dtype=np.float64))]


def _object_entry(obj: ObjectLabel) -> dict:
    entry = {"location": plain(obj.location), "center": plain(obj.center), "angle": plain(obj.angle),
             "extent": plain(obj.extent), "speed": float(obj.speed)}
    if obj.obj_type != "Car":
        entry["obj_type"] = obj.obj_type
    return entry


def _camera_index(cam: CameraObs, position: int) -> int:
    m = _CAM_NAME.match(cam.name or "")
    return int(m.group(1)) if m else position


def _camera_entry(cam: CameraObs, T_world_from_lidar: np.ndarray) -> dict:
    T_l_c = np.asarray(cam.T_lidar_from_camera, dtype=np.float64)
    T_w_c = cam.T_world_from_camera if cam.T_world_from_camera is not None else T_world_from_lidar @ T_l_c
    return {"cords": _pose_for(np.asarray(T_w_c, dtype=np.float64), cam.cords),
            "extrinsic": plain(np.linalg.inv(T_l_c)), "intrinsic": plain(np.asarray(cam.K, np.float64))}


def agent_yaml(agent: AgentObs, objects: Mapping[int, ObjectLabel], object_ids) -> dict:
    """The per-agent yaml mapping (see the module docstring)."""
    lidar_pose = _pose_for(agent.T_world_from_lidar, agent.lidar_pose)
    meta = {str(k): plain(v) for k, v in agent.meta.items() if not str(k).startswith("_")}
    d = dict(meta)
    d["lidar_pose"] = lidar_pose
    d.setdefault("true_ego_pos", list(lidar_pose))
    d.setdefault("predicted_ego_pos", list(d["true_ego_pos"]))
    d.setdefault("ego_speed", 0.0)
    missing = [i for i in object_ids if i not in objects]
    if missing:
        raise ValueError(f"agent {agent.agent_id}: visible_ids {missing} are not in frame.objects")
    d["vehicles"] = {int(i): _object_entry(objects[i]) for i in sorted(object_ids)}
    for k in [k for k in d if CAMERA_KEY.match(k)]:
        del d[k]  # cameras come from agent.cameras only
    for pos, cam in enumerate(agent.cameras):
        d[f"camera{_camera_index(cam, pos)}"] = _camera_entry(cam, agent.T_world_from_lidar)
    return d


def write_opv2v_frame(root, split: str, frame: Frame, pcd_data: str = "binary",
                      write_cameras: bool = True, hetero_root=None, bev_visibility: bool = True) -> List[Path]:
    """Write every agent of ``frame``; returns the written paths (sorted).

    hetero_root: where the OPV2V-H files go (HEAL's ``OPV2V_Hetero`` tree);
        None: beside the main files.
    bev_visibility: write ``<timestamp>_bev_visibility.png`` per agent.
    """
    base = Path(root) / str(split) / frame.scenario
    het = None if hetero_root is None else Path(hetero_root) / str(split) / frame.scenario
    any_visible = any(a.visible_ids for a in frame.agents)
    written: List[Path] = []
    for agent in frame.agents:
        d = base / str(agent.agent_id)
        h = d if het is None else het / str(agent.agent_id)
        for folder in {d, h}:
            folder.mkdir(parents=True, exist_ok=True)
        ts = frame.timestamp
        written.append(write_pcd(d / f"{ts}.pcd", agent.lidar, data=pcd_data))
        for n, pts in sorted(agent.lidar_beams.items()):
            written.append(write_pcd(h / f"{ts}_{int(n)}.pcd", pts, data=pcd_data))
        ids = agent.visible_ids if any_visible else sorted(frame.objects)
        dump_yaml(d / f"{ts}.yaml", agent_yaml(agent, frame.objects, ids))
        written.append(d / f"{ts}.yaml")
        if bev_visibility:
            written.append(write_visibility_png(d / f"{ts}_bev_visibility.png", visibility_mask(agent)))
        if not write_cameras:
            continue
        for pos, cam in enumerate(agent.cameras):
            i = _camera_index(cam, pos)
            if cam.image is not None:
                write_rgb_png(d / f"{ts}_camera{i}.png", cam.image)
                written.append(d / f"{ts}_camera{i}.png")
            if cam.depth is not None:
                write_depth_png(h / f"{ts}_depth{i}.png", cam.depth)
                written.append(h / f"{ts}_depth{i}.png")
    return sorted(written)


def write_data_protocol(root, split: str, scenario: str, protocol: Mapping) -> Path:
    """``<root>/<split>/<scenario>/data_protocol.yaml`` (simulation settings)."""
    path = Path(root) / str(split) / scenario / "data_protocol.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    dump_yaml(path, plain(dict(protocol)))
    return path


def write_modality_json(path, assignment: Mapping[str, Mapping]) -> Path:
    """Write ``{scenario: {agent_id_str: type}}`` (sorted keys, HEAL's format), atomically (jobs
    sharing the dataset read it while a rerun of the simulator writes it) and only when it changes."""
    path = Path(path)
    table: Dict[str, Dict[str, str]] = {
        str(s): {str(a): str(t) for a, t in agents.items()} for s, agents in assignment.items()}
    text = json.dumps(table, indent=2, sort_keys=True) + "\n"
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return path
    atomic_write_bytes(path, text.encode("utf-8"))
    return path
