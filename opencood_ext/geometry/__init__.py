"""Pose, box and rotated-IoU math. See each module's docstring for frames and shapes."""
from .boxes import (boxes_to_corners, corners_to_boxes, limit_period, object_corners_world,
                    objects_to_boxes, points_in_boxes)
from .iou import bev_corners, bev_iou, bev_iou_aligned, rotated_nms
from .transforms import (invert_transform, matrix_to_pose, pose_to_matrix, relative_transform,
                         transform_points)

__all__ = [
    "pose_to_matrix", "matrix_to_pose", "invert_transform", "relative_transform",
    "transform_points", "boxes_to_corners", "corners_to_boxes", "object_corners_world",
    "objects_to_boxes", "points_in_boxes", "limit_period",
    "bev_iou", "bev_iou_aligned", "bev_corners", "rotated_nms",
]
