"""Fusion op, anchors, targets and loss weights of a converted hypes yaml (``model:`` keys).

V2X-Real's three classes come from ``postprocess.anchor_args.anchor_generator_config``:
one anchor size, bottom height and (matched, unmatched) IoU pair per class, the rotations
in radians there (degrees in ``anchor_args.r``), the bottom height used as the anchors'
z as the reference's ``generate_anchor_box_v2xreal`` does. Under ``protocol: reference`` (every
converted config's) the model builds the reference's direction head for it (a bin pair per
rotation, shared by the classes), and its V2X-Real loss has no direction term (``dir_weight: 0``).
STAMP's files name a fusion per type (all must agree: ours has one).
"""
from __future__ import annotations

import math
from typing import Dict, List

from .hypes_keys import FUSION_OPS
from .hypes_reader import HypesReader

# the reference's SUPER_CLASS_MAP (opencood/data_utils/__init__.py): V2X-Real object types per class
V2XREAL_CLASS_GROUPS: Dict[str, List[str]] = {
    "vehicle": ["LongVehicle", "Car", "PoliceCar"],
    "pedestrian": ["Child", "RoadWorker", "Pedestrian", "Scooter", "ScooterRider", "Motorcycle", "MotorcyleRider",
                   "BicycleRider"],
    "truck": ["Truck", "Van", "TrashCan", "ConcreteTruck", "Bus"],
}
_PER_CLASS = ("anchor_sizes", "anchor_rotations", "anchor_bottom_heights", "feature_map_stride",
              "matched_threshold", "unmatched_threshold")


def fusion_op(r: HypesReader, types: List[str]) -> str:
    """``model.fusion_op`` from model.args.fusion_method, or from the per-type ones (STAMP)."""
    key = "model.args.fusion_method"
    if not r.has(key):
        per = {m: r.get(f"model.args.{m}.fusion_method") for m in types if r.has(f"model.args.{m}.fusion_method")}
        if len(set(per.values())) > 1:
            r.refuse(f"model.args.{types[-1]}.fusion_method",
                     f"the types fuse differently ({per}); the converted model has one fusion")
        if per:
            key = f"model.args.{next(iter(per))}.fusion_method"
    op = r.get(key, "att")
    if op not in FUSION_OPS:
        r.refuse(key, f"fusion {op!r} not supported; one of {sorted(FUSION_OPS)}")
    return FUSION_OPS.get(op, "att")


def anchors(r: HypesReader) -> dict:
    """``anchors``, ``pos_iou`` and ``neg_iou`` of our ``model:`` section."""
    table = r.get("postprocess.anchor_args.anchor_generator_config", None)
    # STAMP's adapter stage builds no head and states no model.args.num_class: the table's classes then
    ncls = r.get("model.args.num_class", len(table) if isinstance(table, list) and
                 r.has("heter.protocol_modality") else 1)
    rot = r.get("postprocess.anchor_args.r", [0, 90])
    for key in ("postprocess.anchor_args.num", "model.args.anchor_number"):
        if r.has(key) and r.get(key) != len(rot):
            r.refuse(key, f"is {r.get(key)} but anchor_args.r has {len(rot)} rotations (one anchor each)")
    out = {"pos_iou": r.get("postprocess.target_args.pos_threshold", 0.6),
           "neg_iou": r.get("postprocess.target_args.neg_threshold", 0.45)}
    if table is None:
        if ncls != 1:
            r.refuse("model.args.num_class", f"{ncls} classes need postprocess.anchor_args.anchor_generator_config")
        out["anchors"] = {"sizes": [[r.get(f"postprocess.anchor_args.{k}") for k in "lwh"]],
                          "rotations": [math.radians(float(a)) for a in rot], "z_center": -1.0,
                          "margin": anchor_margin(r)}
        return out
    key = "postprocess.anchor_args.anchor_generator_config"
    if not isinstance(table, list) or len(table) != ncls or not all(
            isinstance(c, dict) and all(k in c for k in _PER_CLASS) for c in table):
        r.refuse(key, f"must list {ncls} classes (model.args.num_class), each with {list(_PER_CLASS)}")
        return out
    stride = r.get("postprocess.anchor_args.feature_stride", None)
    for c in table:
        name = c.get("class_name", "?")
        if len(c["anchor_sizes"]) != 1 or len(c["anchor_bottom_heights"]) != 1:
            r.refuse(key, f"class {name}: one anchor size and one bottom height per class only")
        if list(c["anchor_rotations"]) != list(table[0]["anchor_rotations"]):
            r.refuse(key, f"class {name}: every class must use the same anchor_rotations")
        if stride is not None and c["feature_map_stride"] != stride:
            r.refuse(key, f"class {name}: feature_map_stride {c['feature_map_stride']} is not anchor_args."
                          f"feature_stride {stride}")
        if not c.get("align_center", False):
            r.refuse(key, f"class {name}: align_center false (anchors from edge to edge); ours sit at cell centres")
    out["anchors"] = {"sizes": [[float(v) for v in c["anchor_sizes"][0]] for c in table],
                      "size_classes": list(range(ncls)),
                      "rotations": [float(a) for a in table[0]["anchor_rotations"]],
                      "z_center": [float(c["anchor_bottom_heights"][0]) for c in table]}
    out["pos_iou"] = [float(c["matched_threshold"]) for c in table]
    out["neg_iou"] = [float(c["unmatched_threshold"]) for c in table]
    return out


def anchor_margin(r: HypesReader) -> List[float]:
    """``model.anchors.margin``: the reference's ``VoxelPostprocessor.generate_anchor_box`` lays the
    anchors' centres at ``linspace(min + v, max - v, cells)`` per axis, ``v`` the voxel size its yaml
    parser stores as ``anchor_args.vw`` / ``vh``: the top-level ``preprocess.args.voxel_size``
    (GenComm / HEAL's ``load_general_params`` and the other parsers), or a STAMP type's own
    ``postprocess.voxel_size``. It is not half a feature cell: GenComm's 1.6 m cells over 0.4 m
    voxels put the anchors up to 0.4 m off the cells' centres."""
    for key in ("preprocess.args.voxel_size", "postprocess.voxel_size"):
        voxel = r.get(key, None)
        if voxel is not None:
            if not (isinstance(voxel, list) and len(voxel) >= 2 and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in voxel[:2])):
                r.refuse(key, f"is {voxel!r}; the anchors' margin needs a voxel size [vx, vy, ...] in metres")
                return [0.0, 0.0]
            return [float(voxel[0]), float(voxel[1])]
    r.refuse("preprocess.args.voxel_size", "absent: the reference's anchors lie from min + voxel size to max - "
             "voxel size (VoxelPostprocessor.generate_anchor_box), so the anchors cannot be placed")
    return [0.0, 0.0]


def loss_weights(r: HypesReader) -> dict:
    """``model.loss``: the detection loss's weights (OPV2V / DAIR-V2X losses, or V2X-Real's, whose
    focal parameters and smooth-L1 beta are hard-coded at our defaults and which has no direction term)."""
    loss = {}
    for key, ours in (("cls.weight", "cls_weight"), ("reg.weight", "box_weight"), ("dir.weight", "dir_weight"),
                      ("cls.alpha", "focal_alpha"), ("cls.gamma", "focal_gamma"), ("cls_weight", "cls_weight"),
                      ("reg", "box_weight"), ("pos_cls_weight", "pos_cls_weight")):
        if r.has(f"loss.args.{key}"):
            loss[ours] = r.get(f"loss.args.{key}")
    if r.has("loss.args.reg.sigma"):
        loss["smooth_l1_beta"] = 1.0 / float(r.get("loss.args.reg.sigma")) ** 2
    if "v2xreal" in str(r.get("loss.core_method", "")):
        loss["dir_weight"] = 0.0
    return loss
