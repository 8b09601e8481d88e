"""Pose, box and rotated-IoU math. See each module's docstring for frames and shapes."""
from .boxes import (boxes_inside_range, boxes_to_corners, corners_to_boxes, limit_period, object_corners_world,
                    objects_to_boxes, points_in_boxes, points_per_box)
from .transforms import (invert_transform, matrix_to_pose, pose_to_matrix, relative_transform,
                         transform_points)

__all__ = [
    "pose_to_matrix", "matrix_to_pose", "invert_transform", "relative_transform",
    "transform_points", "boxes_inside_range", "boxes_to_corners", "corners_to_boxes", "object_corners_world",
    "objects_to_boxes", "points_in_boxes", "points_per_box", "limit_period",
    "bev_iou", "bev_iou_aligned", "bev_corners", "rotated_nms",
]

_TORCH_NAMES = {"bev_iou", "bev_iou_aligned", "bev_corners", "rotated_nms"}


def __getattr__(name):
    # The IoU functions need torch; importing it lazily keeps the numpy-only data
    # layer (readers, inspect tool) quick to start.
    if name in _TORCH_NAMES:
        from . import iou
        return getattr(iou, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
