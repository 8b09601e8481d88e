"""The heterogeneous cooperative detector: one encoder stack per agent type, a
communication link, fusion and a shared anchor head.

Fusion methods (``fusion``):

* ``none``: the ego's own feature only (train and test on ``cooperation="ego_only"``).
* ``early``: the dataset merged every LiDAR agent's points into the ego frame;
  the model sees one cloud per sample (``cooperation="early"``).
* ``late``: trained like ``none`` (each agent a detector of its own view;
  ``forward`` is the ego's view); ``predict`` lets every agent detect in its own frame, boxes move to the ego frame
  and are merged by rotated NMS. Bytes = boxes sent.
* ``intermediate``: per-agent BEV features go through ``link`` (full feature or
  GenComm message), are fused per pixel (``fusion_op``) and detected.

Shapes: N agents in the batch (all samples flattened, ego first per sample),
B samples, features (N, C, H, W) on the common :class:`BEVGrid`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Literal, Optional, Union

import torch
from torch import Tensor, nn

from opencood_ext.models import build
from opencood_ext.models.anchors import AnchorGenerator, BoxCoder, Targets, assign_targets
from opencood_ext.models.encoder_stack import EncoderStack
from opencood_ext.models.fusion import AttFusion, MaxFusion
from opencood_ext.models.head import AnchorHead, HeadOutput
from opencood_ext.models.losses import DetectionLoss
from opencood_ext.geometry.iou import rotated_nms
from opencood_ext.models.warp import warp_to_ego
from opencood_ext.postprocess import Detections, decode_detections

from .links import LINKS, LinkOutput
from .losses import LossOutput

BOX_BYTES = 8 * 4  # late fusion: 7 box values + score as float32


@dataclass
class ModelOutput:
    """head: (B, ...) maps on the ego grid.
    depth_logits: per camera type (n_t, Ncam, D, h, w). link: the link's output."""

    head: HeadOutput
    depth_logits: Dict[str, Tensor] = field(default_factory=dict)
    link: Optional[LinkOutput] = None


def transform_boxes(boxes: Tensor, T: Tensor) -> Tensor:
    """(P, 7) boxes by a rigid (4, 4) ``T`` (yaw from T's xy rotation)."""
    if len(boxes) == 0:
        return boxes
    out = boxes.clone()
    out[:, :3] = boxes[:, :3] @ T[:3, :3].T + T[:3, 3]
    out[:, 6] = boxes[:, 6] + torch.atan2(T[1, 0], T[0, 0])
    return out


class CooperativeDetector(nn.Module):
    """See the module docstring. Constructor arguments are the ``model:`` config.

    agent_types: ``{type: {encoder: {...}, backbone: {...}, shrink_channels: 128}}``.
    lidar_range: the ego detection area (from ``data.lidar_range``).
    link: ``{type: full_feature | gencomm, ...}`` for intermediate fusion.
    anchors: AnchorGenerator arguments except the grid (sizes, rotations, z_center).
    pos_iou / neg_iou: target assignment thresholds (one, or one per class).
    loss: DetectionLoss arguments. depth_weight: LSS depth supervision weight.
    score_threshold / nms_iou / max_boxes: post-processing (FORMATS.md section 4).
    post_fusion_layers: 3x3 conv-BN-ReLU layers (C -> C) between fusion and the 1x1 head,
        for every fusion method alike (0: the head reads each fused cell alone). A warped
        collaborator feature says its boxes' sub-cell offsets and yaw in the sender's grid and
        axes; only layers that see neighbouring cells can read the rotated map (README).
    """

    def __init__(self, agent_types: Dict[str, dict], lidar_range,
                 fusion: Literal["none", "early", "late", "intermediate"] = "intermediate",
                 fusion_op: Literal["att", "max"] = "att", link: Optional[dict] = None,
                 anchors: Optional[dict] = None, pos_iou: Union[float, List[float]] = 0.6,
                 neg_iou: Union[float, List[float]] = 0.45,
                 loss: Optional[dict] = None, depth_weight: float = 1.0,
                 score_threshold: float = 0.2, nms_iou: float = 0.15, max_boxes: int = 150,
                 post_fusion_layers: int = 0):
        super().__init__()
        if not agent_types:
            raise ValueError("model.agent_types is empty: name at least one agent type")
        self.lidar_range = [float(v) for v in lidar_range]
        self.fusion = fusion
        self.encoders = nn.ModuleDict({
            t: build(spec, {"stack": EncoderStack}, f"model.agent_types.{t}", default_type="stack",
                     lidar_range=self.lidar_range)
            for t, spec in agent_types.items()})
        grids = {t: s.grid for t, s in self.encoders.items()}
        first_t, first = next(iter(grids.items()))
        for t, g in grids.items():
            if not g.matches(first):
                raise ValueError(f"model.agent_types: type {t} ends on BEV grid {g} but {first_t} on {first}; "
                                 f"every type must produce the same feature grid to be fused")
        channels = {s.out_channels for s in self.encoders.values()}
        if len(channels) != 1:
            raise ValueError(f"model.agent_types: every type must output the same channels, got {channels}")
        self.channels = channels.pop()
        self.grid = first
        spec = dict(link or {"type": "full_feature"})
        self.link = build(spec, LINKS, "model.link", channels=self.channels,
                          agent_types=list(agent_types), lidar_range=self.lidar_range) \
            if fusion == "intermediate" else None
        self.fuse = (AttFusion(self.channels) if fusion_op == "att" else MaxFusion())
        if post_fusion_layers < 0:
            raise ValueError(f"model.post_fusion_layers must be >= 0, got {post_fusion_layers}")
        self.post_fusion = nn.Sequential(*[
            nn.Sequential(nn.Conv2d(self.channels, self.channels, 3, padding=1, bias=False),
                          nn.BatchNorm2d(self.channels), nn.ReLU(inplace=True))
            for _ in range(post_fusion_layers)])
        self.anchor_gen = AnchorGenerator(self.lidar_range, self.grid.shape, **dict(anchors or {}))
        self.register_buffer("anchors", self.anchor_gen.flat(), persistent=False)
        self.head = AnchorHead(self.channels, num_anchors_per_loc=self.anchor_gen.num_per_loc,
                               num_classes=self.anchor_gen.num_classes)
        self.coder = BoxCoder()
        self.pos_iou, self.neg_iou = pos_iou, neg_iou
        self.criterion = DetectionLoss(**dict(loss or {}))
        self.depth_weight = float(depth_weight)
        self.post = dict(score_threshold=score_threshold, nms_iou=nms_iou, max_boxes=max_boxes)

    # ------------------------------------------------------------------ features
    def voxel_sizes(self) -> Dict[str, Optional[tuple]]:
        return {t: s.voxel_size for t, s in self.encoders.items()}

    def encode(self, batch) -> tuple:
        """-> features (N, C, H, W) each in its agent's frame, depth logits per camera type."""
        H, W = self.grid.shape
        feats = None
        depth = {}
        for t, inp in batch.inputs.items():
            if t not in self.encoders:
                raise KeyError(f"batch has agent type {t} but the model knows {sorted(self.encoders)}")
            out = self.encoders[t](inp)
            if feats is None:
                feats = out.bev.new_zeros(batch.num_agents, self.channels, H, W)
            feats = feats.index_copy(0, batch.type_index[t].to(out.bev.device), out.bev)
            if out.depth_logits is not None:
                depth[t] = out.depth_logits
        return feats, depth

    def detect(self, bev: Tensor) -> HeadOutput:
        """(N, C, H, W) fused (or single-agent) BEV maps -> head maps: the post-fusion layers,
        then the 1x1 head. Every detection path goes through here (training, late fusion, live demo)."""
        return self.head(self.post_fusion(bev))

    def forward(self, batch) -> ModelOutput:
        feats, depth = self.encode(batch)
        ego_index = batch.ego_index.to(feats.device)
        if self.fusion == "intermediate":
            link = self.link(feats, batch)
            fused = self.fuse(link.features, batch.agents_per_sample, link.valid)
            return ModelOutput(self.detect(fused), depth_logits=depth, link=link)
        ego = warp_to_ego(feats[ego_index], batch.T_ego_from_agent[ego_index].to(feats.device), self.lidar_range)
        return ModelOutput(self.detect(ego), depth_logits=depth)

    # ------------------------------------------------------------------ loss
    def targets(self, gt_boxes: List[Tensor], gt_classes: List[Tensor]) -> Targets:
        anchors = self.anchors.cpu()
        anchor_classes = self.anchor_gen.flat_classes()
        items = [assign_targets(anchors, g.cpu().float(), self.pos_iou, self.neg_iou, self.coder,
                                gt_classes=c.cpu(), anchor_classes=anchor_classes)
                 for g, c in zip(gt_boxes, gt_classes)]
        return Targets.stack(items)

    def loss(self, out: ModelOutput, batch) -> LossOutput:
        targets = self.targets(batch.gt_boxes, batch.gt_classes).to(out.head.cls.device)
        terms = self.criterion(out.head, targets)
        parts = {"cls": terms.cls, "box": terms.box, "dir": terms.dir}
        total = terms.total
        for t, logits in out.depth_logits.items():
            inp = batch.inputs[t]
            if inp.depth is not None and self.depth_weight > 0:
                d = self.depth_weight * self.encoders[t].encoder.depth_loss(logits, inp.depth)
                parts[f"depth_{t}"] = d
                total = total + d
        if out.link is not None:
            for k, v in out.link.losses.items():
                parts[k] = v
                total = total + v
        return LossOutput(total=total, parts=parts)

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def predict(self, batch) -> tuple:
        """-> (list of B :class:`Detections` in each ego frame, (N,) bytes each agent sent)."""
        n = batch.num_agents
        nbytes = torch.zeros(n, dtype=torch.long)
        if self.fusion == "late":
            feats, _ = self.encode(batch)  # every agent detects in its own frame
            per_agent = decode_detections(self.detect(feats), self.anchors, coder=self.coder, **self.post)
            dets = []
            start = 0
            ego_index = batch.ego_index.tolist()
            for b, count in enumerate(batch.agents_per_sample):
                boxes, scores, labels = [], [], []
                for i in range(start, start + count):
                    d = per_agent[i]
                    boxes.append(transform_boxes(d.boxes, batch.T_ego_from_agent[i].to(d.boxes.device)))
                    scores.append(d.scores)
                    labels.append(d.labels)
                    if i != ego_index[b]:
                        nbytes[i] = len(d.boxes) * BOX_BYTES
                start += count
                boxes, scores, labels = torch.cat(boxes), torch.cat(scores), torch.cat(labels)
                keep = rotated_nms(boxes, scores, self.post["nms_iou"], self.post["max_boxes"]) if len(boxes) \
                    else torch.zeros(0, dtype=torch.long)
                boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
                r = self.lidar_range
                inside = (boxes[:, 0] >= r[0]) & (boxes[:, 0] <= r[3]) & (boxes[:, 1] >= r[1]) & (boxes[:, 1] <= r[4])
                dets.append(Detections(boxes=boxes[inside], scores=scores[inside], labels=labels[inside]))
            return dets, nbytes
        out = self.forward(batch)
        dets = decode_detections(out.head, self.anchors, coder=self.coder, gt_range=self.lidar_range, **self.post)
        if out.link is not None and out.link.bytes_sent is not None:
            nbytes = out.link.bytes_sent.cpu()
        return dets, nbytes
