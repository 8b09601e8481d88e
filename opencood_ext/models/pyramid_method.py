"""``model.fusion: pyramid``: HEAL's cooperation (``heter_pyramid_collab``), an intermediate fusion
whose receiver runs :class:`~.pyramid_fusion.PyramidFusion` in HEAL's order.

Collaborators send their full BEV feature (link ``full_feature``: the payload is the feature, in the
sender's frame). The receiver stacks, per sample, its own feature (its input frame) and the arrived
payloads (their senders' frames) with the transforms into its ego frame (``T_ego_from_agent`` of its
own row, augmentation included; each message's from its header pose and the receiver's own pose),
and :meth:`PyramidFusion.collab` runs the multi-scale ResNet on every row in its own frame, then warps
and fuses each level. In training the foreground loss (``losses["occupancy"]``) is taken on every row's
own occupancy maps against that row's own targets: the sample's ground truth moved into the row's frame
(:func:`~.fusion_methods.transform_boxes` by the inverse of its transform), kept where all 8 corners
lie inside the detection range, assigned to the anchors as the detection loss assigns them (HEAL uses
each agent's own label list, ``label_dict_single``; ours is the frame's, seen from the agent).

Requires ``model.fusion_op: pyramid`` and ``model.link.type: full_feature``, or ``stamp_collab``
(STAMP's own collaboration, :mod:`opencood_ext.methods.stamp_collab`): its receiver turns each payload
into its own feature space in the sender's frame (``to_receiver_space``) and says what it fuses of its
own feature (``own``) before the pyramid runs.
"""
from __future__ import annotations

from typing import List

import torch
from torch import Tensor

from ..geometry.boxes import boxes_inside_range
from .fusion_methods import FUSION_METHODS, IntermediateFusion, ModelOutput, ego_types, transform_boxes
from .links import FullFeatureLink
from .pyramid_fusion import PyramidFusion


@FUSION_METHODS.register("pyramid")
class PyramidFusionMethod(IntermediateFusion):
    """HEAL's Pyramid Fusion cooperation (module docstring); sends like ``intermediate``."""

    name = "pyramid"

    @staticmethod
    def check(model) -> None:
        """ValueError (one line) unless ``model`` has the pyramid op and the full-feature link."""
        if not isinstance(model.fuse, PyramidFusion):
            raise ValueError(f"model.fusion 'pyramid' needs model.fusion_op: pyramid (got "
                             f"{type(model.fuse).__name__})")
        if not isinstance(model.link, FullFeatureLink) and not hasattr(model.link, "to_receiver_space"):
            raise ValueError(f"model.fusion 'pyramid' fuses the senders' features in their own frames: it needs "
                             f"model.link.type full_feature or stamp_collab (got {type(model.link).__name__})")

    def receive(self, model, batch, feats, arrived) -> ModelOutput:
        self.check(model)
        device = feats.device
        ego_rows = batch.ego_index.tolist()
        T_own = batch.T_ego_from_agent[batch.ego_index.to(batch.T_ego_from_agent.device)].to(device)  # (B, 4, 4)
        T_msg = arrived.T_ego_from_sender(batch.T_ego_from_world).to(device) if len(arrived) else None
        payload = arrived.stacked().to(device) if len(arrived) else None
        receivers = ego_types(batch)
        if payload is not None and hasattr(model.link, "to_receiver_space"):  # STAMP: reverted, sender frames
            payload = model.link.to_receiver_space(payload, list(arrived.agent_type),
                                                   [receivers[b] for b in arrived.receiver])
        own = model.link.own(feats[ego_rows], receivers) if hasattr(model.link, "own") else feats[ego_rows]
        order = sorted(range(len(arrived)), key=lambda k: (arrived.receiver[k], arrived.source_row[k]))
        rows, transforms, counts, sample = [], [], [], []
        for b, r in enumerate(ego_rows):
            mine = [k for k in order if arrived.receiver[k] == b]
            rows += [own[b:b + 1]] + [payload[k:k + 1] for k in mine]
            transforms += [T_own[b:b + 1]] + [T_msg[k:k + 1] for k in mine]
            counts.append(1 + len(mine))
            sample += [b] * (1 + len(mine))
        T = torch.cat(transforms).float()
        fused, occupancy = model.fuse.collab(torch.cat(rows), counts, T, model.lidar_range)
        losses = {}
        if model.training and any(w > 0 for w in model.fuse.occupancy_weights):
            labels = own_frame_labels(model, batch, T, sample).to(device)
            losses["occupancy"] = model.fuse.occupancy_loss(
                occupancy, labels, model.criterion.focal_alpha, model.criterion.focal_gamma)
        return ModelOutput(model.detect(fused), losses=losses)


def own_frame_labels(model, batch, T_ego_from_row: Tensor, sample: List[int]) -> Tensor:
    """(R, H, W, K) anchor labels of each row in its own frame: sample ``sample[i]``'s ground truth moved
    by the inverse of ``T_ego_from_row[i]`` (4, 4), boxes with all corners inside the detection range."""
    T_row_from_ego = torch.linalg.inv(T_ego_from_row.detach().double().cpu())
    boxes, classes = [], []
    for i, b in enumerate(sample):
        gt = batch.gt_boxes[b].detach().cpu().double().reshape(-1, 7)
        cls = batch.gt_classes[b].cpu() if batch.gt_classes else torch.zeros(len(gt), dtype=torch.long)
        moved = transform_boxes(gt, T_row_from_ego[i])
        keep = torch.from_numpy(boxes_inside_range(moved, model.lidar_range)) if len(moved) else \
            torch.zeros(0, dtype=torch.bool)
        boxes.append(moved[keep].float())
        classes.append(cls[keep])
    H, W = model.grid.shape
    return model.targets(boxes, classes).labels.reshape(len(sample), H, W, -1)
