"""Fusion methods: what a collaborator sends, what the receiving ego does with it,
and what it costs in bytes, one registered class per method.

Every method implements the same sender / receiver split (the detector
(:mod:`.detector`) calls it for training, evaluation and the live demo alike):

* ``send(model, batch, feats) -> Messages``: every collaborator's message, in
  its own frame, with its pose in the header (:mod:`opencood_ext.comm.messages`);
* ``receive(model, batch, feats, arrived) -> ModelOutput``: the ego's head maps
  from its own input and the messages that ARRIVED, placed with the poses in
  their headers and the ego's own pose (``batch.T_ego_from_world``);
* ``detect(model, batch, feats, arrived) -> [Detections]``: decoded boxes
  (late fusion merges boxes instead of head maps);
* ``accept(model)``: what this receiver can use (kind, shape, known types, box
  contents); the detector bounds it further by its ``receiver:`` config
  (:meth:`~opencood_ext.models.detector.CooperativeDetector.acceptance`); anything
  else is rejected on arrival.

Between send and receive the messages travel in memory (training) or as bytes
through the channel (inference: :func:`opencood_ext.comm.messages.transmit`).

========== ======================= ================================= ==========================
method     sample holds            message                           receiver
========== ======================= ================================= ==========================
none       the ego only            nothing                           detects on its own feature
early      every LiDAR agent's     its raw points (1, P, 4)          merges, voxelises, encodes
           raw points
late       the ego (training);     its decoded boxes (1, P, 9)       moves them in, rotated NMS
           every agent (eval)      (reference: its candidates)       (reference: the reference's merge)
intermed.  every agent             the link's payload (m, H, W) of   link.receive, fuse, detect
                                   the link's kind (bev or codes)
========== ======================= ================================= ==========================
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..comm.messages import Acceptance, Messages
from ..comm.wire import BoxRules
from ..data.inputs import LidarInput
from ..data.voxelize import Voxelizer, collate_voxels, grid_shape
from ..geometry.iou import rotated_nms
from ..postprocess import Detections, reference_merge, reference_rules
from ..registry import Registry
from .ego_type_target import attach_ego_type_features
from .head import HeadOutput
from .links import Arrival
from .warp import warp_mask, warp_to_ego

FUSION_METHODS = Registry("fusion method", "what agents send and how the ego uses it (config key model.fusion)")


@dataclass
class ModelOutput:
    """head: (B, ...) maps on the ego grid. depth_logits: per camera type (n_t, Ncam, D, h, w);
    depth_terms: per camera type a feature cache served, the depth loss as (sum, count) per agent.
    losses: auxiliary named losses of the receiver (e.g. GenComm's generation loss)."""

    head: HeadOutput
    depth_logits: Dict[str, Tensor] = field(default_factory=dict)
    depth_terms: Dict[str, Tuple[Tensor, Tensor]] = field(default_factory=dict)
    losses: Dict[str, Tensor] = field(default_factory=dict)


def transform_boxes(boxes: Tensor, T: Tensor) -> Tensor:
    """(P, 7+) boxes [x, y, z, l, w, h, yaw, ...] by a rigid (4, 4) ``T`` (yaw from T's xy rotation)."""
    if len(boxes) == 0:
        return boxes
    out = boxes.clone()
    out[:, :3] = boxes[:, :3] @ T[:3, :3].T + T[:3, 3]
    out[:, 6] = boxes[:, 6] + torch.atan2(T[1, 0], T[0, 0])
    return out


def _collaborators(batch) -> List[int]:
    ego = set(batch.ego_index.tolist())
    return [i for i in range(batch.num_agents) if i not in ego]


def _messages(batch, rows: List[int], kind: str, payload: List[Tensor]) -> Messages:
    """The messages agents ``rows`` of ``batch`` send: their ids, types, times and poses."""
    sample = batch.sample_index.tolist()
    times = batch.agent_times or [0.0] * batch.num_agents
    return Messages(kind, [sample[r] for r in rows], list(rows), [int(batch.agent_ids[r]) for r in rows],
                    [batch.agent_types[r] for r in rows], [float(times[r]) for r in rows],
                    batch.T_world_from_agent[rows].double().cpu() if rows else torch.zeros(0, 4, 4, dtype=torch.float64),
                    payload)


def _ages(model, batch, arrived: Messages, per_sample: List[List[int]], device) -> Dict[str, Tensor]:
    """``{"delays": (sum N,)}`` for a fusion op that encodes how old each row is (V2X-ViT's delay
    encoding: ``model.fuse.needs_delays``), else {}: rows as fused (per sample the ego, age 0, then
    its messages ``per_sample[b]``), ages = the ego's data time - the message's, in timestamp units."""
    if not getattr(model.fuse, "needs_delays", False):
        return {}
    times = batch.agent_times or [0.0] * batch.num_agents
    ego_t = [times[r] for r in batch.ego_index.tolist()]
    ages = [a for b, mine in enumerate(per_sample) for a in [0.0] + [ego_t[b] - arrived.timestamp[k] for k in mine]]
    return {"delays": torch.tensor(ages, dtype=torch.float32, device=device)}


def ego_features(model, batch, feats: Tensor) -> Tensor:
    """(B, C, H, W) each ego's own feature in its (augmented) ego frame: the ego's input frame is
    its own, so only a camera ego's feature turns (by the augmentation) here."""
    ego = batch.ego_index.to(feats.device)
    T = (batch.T_ego_from_world @ batch.T_world_from_agent[batch.ego_index.to(batch.T_ego_from_world.device)]).float()
    return warp_to_ego(feats[ego], T.to(feats.device), model.lidar_range)


def ego_types(batch) -> List[str]:
    """Each sample's ego agent type, in sample order."""
    return [batch.agent_types[r] for r in batch.ego_index.tolist()]


def ego_view(model, batch, feats: Tensor) -> Tensor:
    """(B, C, H, W) what each ego's head reads of its own feature alone: :func:`ego_features`
    through :meth:`~.detector.CooperativeDetector.own_view` (the reference GenComm's regeneration
    under protocol ``reference``)."""
    return model.own_view(ego_features(model, batch, feats), ego_types(batch))


class FusionMethod:
    """Base of the registered methods (module docstring). Stateless: the modules live on the model."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "bev"
    needs_link: ClassVar[bool] = False
    # the head reads what model.fuse outputs (False: an agent's own feature goes to model.detect)
    uses_fusion_op: ClassVar[bool] = False
    random_ego_in_training: ClassVar[bool] = False

    def dataset_agents(self, train: bool) -> str:
        """What a dataset sample holds for this method: "ego_only", "all" or "early"."""
        return "all"

    def send(self, model, batch, feats: Optional[Tensor]) -> Messages:
        return Messages.empty(self.kind)

    def wire_dtype(self, model) -> str:
        return "float32"

    def accept(self, model) -> Acceptance:
        return Acceptance(kind=self.kind, agent_types=set(model.encoders))

    def receive(self, model, batch, feats: Optional[Tensor], arrived: Messages) -> ModelOutput:
        raise NotImplementedError

    def detect(self, model, batch, feats: Optional[Tensor], arrived: Messages) -> List[Detections]:
        out = self.receive(model, batch, feats, arrived)
        return model.decode(out.head)


@FUSION_METHODS.register("none")
class NoFusion(FusionMethod):
    """The ego's own feature only; nothing is sent."""

    name = "none"

    def dataset_agents(self, train: bool) -> str:
        return "ego_only"

    def receive(self, model, batch, feats, arrived) -> ModelOutput:
        return ModelOutput(model.detect(ego_view(model, batch, feats)))


@FUSION_METHODS.register("late")
class LateFusion(FusionMethod):
    """Each agent detects in its own frame and sends its boxes; the ego moves them into its frame
    and merges all by rotated NMS. Trained like ``none``, but with a random vehicle as the ego of
    each training sample, so the one detector learns every agent's view.

    Under ``protocol: reference`` the merge is the reference's (GenComm / HEAL
    ``VoxelPostprocessor.post_process`` on every agent's maps): each agent sends its candidates
    (thresholded, decoded, direction applied: :meth:`~.detector.CooperativeDetector.candidates`,
    less those no pose can keep, :meth:`~opencood_ext.postprocess.ReferenceRules.may_survive`),
    the ego moves them in and applies the size and z filters, the top 1000, NMS and the range mask
    once over all (:func:`~opencood_ext.postprocess.reference_merge`), no cap."""

    name = "late"
    kind = "boxes"
    random_ego_in_training = True

    def dataset_agents(self, train: bool) -> str:
        return "ego_only" if train else "all"

    def accept(self, model) -> Acceptance:
        # every box is checked: sizes > 0 and bounded, scores in [0, 1], labels in the model's classes
        return Acceptance(kind=self.kind, agent_types=set(model.encoders),
                          boxes=BoxRules(num_classes=model.anchor_gen.num_classes))

    def send(self, model, batch, feats) -> Messages:
        rows = _collaborators(batch)
        if not rows:
            return Messages.empty(self.kind)
        reference = model.computation == "reference"
        dets = model.sender_detections(feats[rows], [batch.agent_types[r] for r in rows], candidates=reference)
        if reference:
            rules = reference_rules(model.anchor_gen.num_classes)
            kept = [rules.may_survive(d.boxes) for d in dets]
            dets = [Detections(d.boxes[k], d.scores[k], d.labels[k]) for d, k in zip(dets, kept)]
        payload = [torch.cat([d.boxes, d.scores[:, None], d.labels[:, None].to(d.boxes.dtype)], dim=1).float()
                   for d in dets]
        return _messages(batch, rows, self.kind, payload)

    def receive(self, model, batch, feats, arrived) -> ModelOutput:
        return ModelOutput(model.detect(ego_view(model, batch, feats)))

    @staticmethod
    def _arrived_boxes(arrived: Messages, k: int, T: Tensor, device) -> Tuple[Tensor, Tensor, Tensor]:
        """Message ``k``'s boxes moved into its receiver's frame by ``T`` (4, 4), its scores and labels."""
        p = arrived.payload[k].reshape(-1, 9).to(device)
        return transform_boxes(p[:, :7], T), p[:, 7], p[:, 8].round().long()

    def detect(self, model, batch, feats, arrived) -> List[Detections]:
        if model.computation == "reference":
            return self._detect_reference(model, batch, feats, arrived)
        # the ego's own boxes decoded exactly as without fusion (range filter before the max_boxes cut),
        # so a sample whose messages were all lost detects exactly as fusion "none" does
        own = model.decode(model.detect(ego_view(model, batch, feats)))
        T = arrived.T_ego_from_sender(batch.T_ego_from_world).to(feats.device)
        out = []
        for b, d in enumerate(own):
            mine = [k for k, r in enumerate(arrived.receiver) if r == b]
            if not mine:
                out.append(d)
                continue
            parts = [(d.boxes, d.scores, d.labels)] + [self._arrived_boxes(arrived, k, T[k], feats.device)
                                                        for k in mine]
            boxes, scores, labels = (torch.cat(x) for x in zip(*parts))
            keep = rotated_nms(boxes, scores, model.post["nms_iou"], model.post["max_boxes"]) if len(boxes) \
                else torch.zeros(0, dtype=torch.long)
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
            inside = model.in_range(boxes)
            out.append(Detections(boxes=boxes[inside], scores=scores[inside], labels=labels[inside]))
        return out

    def _detect_reference(self, model, batch, feats, arrived) -> List[Detections]:
        """The reference's late merge: per sample the ego's candidates, then each arrived message's
        moved into the ego frame (in agent order, the reference's: it decides score ties), merged
        once. With no message it is the ego's reference decoding (fusion ``none``)."""
        rules = reference_rules(model.anchor_gen.num_classes)
        own = model.candidates(model.detect(ego_view(model, batch, feats)))
        T = arrived.T_ego_from_sender(batch.T_ego_from_world).to(feats.device)
        out = []
        for b, d in enumerate(own):
            mine = sorted((k for k, r in enumerate(arrived.receiver) if r == b), key=lambda k: arrived.source_row[k])
            parts = [(d.boxes, d.scores, d.labels)] + [self._arrived_boxes(arrived, k, T[k], feats.device)
                                                        for k in mine]
            boxes, scores, labels = (torch.cat(x) for x in zip(*parts))
            out.append(reference_merge(boxes, scores, labels, model.post["nms_iou"], model.lidar_range, rules))
        return out


@FUSION_METHODS.register("early")
class EarlyFusion(FusionMethod):
    """Collaborators send their raw LiDAR points; the ego moves them into its frame, merges them
    with its own, voxelises the merged cloud for its own encoder and detects."""

    name = "early"
    kind = "points"

    def dataset_agents(self, train: bool) -> str:
        return "early"

    def accept(self, model) -> Acceptance:
        # raw points need no encoder of the sender's type: the ego's own encoder reads the merged cloud
        return Acceptance(kind=self.kind)

    def send(self, model, batch, feats) -> Messages:
        rows = [r for r in _collaborators(batch) if batch.points and batch.points[r] is not None]
        return _messages(batch, rows, self.kind, [batch.points[r].float() for r in rows])

    def _voxelizer(self, model, agent_type: str) -> Voxelizer:
        cache = model.__dict__.setdefault("_early_voxelizers", {})
        if agent_type not in cache:
            stack = model.encoders[agent_type]
            if stack.voxel_size is None:
                raise ValueError(f"early fusion needs a LiDAR ego; type {agent_type} has a camera encoder")
            per_voxel, max_voxels = model.voxel_caps.get(agent_type, (32, None))
            if max_voxels is None:  # the merged cloud of many agents: room for every cell of the grid
                max_voxels = math.prod(grid_shape(model.lidar_range, stack.voxel_size))
            cache[agent_type] = Voxelizer(stack.voxel_size, model.lidar_range, per_voxel, max_voxels)
        return cache[agent_type]

    def receive(self, model, batch, feats, arrived) -> ModelOutput:
        if not batch.points:
            raise ValueError("early fusion needs raw points in the batch (a dataset built for 'early')")
        T = arrived.T_ego_from_sender(batch.T_ego_from_world)
        ego_rows = batch.ego_index.tolist()
        ego_type = batch.agent_types[ego_rows[0]]
        if any(batch.agent_types[r] != ego_type for r in ego_rows):
            raise ValueError("early fusion: every sample of a batch needs the same ego type")
        vox = self._voxelizer(model, ego_type)
        voxels = []
        for b, r in enumerate(ego_rows):
            clouds = [batch.points[r].cpu()]  # the ego's own points are in its frame already
            for k in (k for k, rr in enumerate(arrived.receiver) if rr == b):
                p = arrived.payload[k].reshape(-1, 4).cpu().double()
                Tk = T[k].double()
                clouds.append(torch.cat([p[:, :3] @ Tk[:3, :3].T + Tk[:3, 3], p[:, 3:]], dim=1).float())
            voxels.append(vox(torch.cat(clouds)))
        inp = LidarInput.from_batch(collate_voxels(voxels), len(voxels))
        device = next(model.parameters()).device
        out = model.encoders[ego_type](inp.to(device))
        return ModelOutput(model.detect(out.bev))


@FUSION_METHODS.register("intermediate")
class IntermediateFusion(FusionMethod):
    """Collaborators send what their link's sender side makes of their BEV feature; the ego's link
    turns each arrived message into an ego-frame feature, the fusion op merges them per pixel with
    the ego's own, the head detects."""

    name = "intermediate"
    needs_link = True
    uses_fusion_op = True

    def send(self, model, batch, feats) -> Messages:
        rows = _collaborators(batch)
        if not rows:
            return Messages.empty(model.link.kind)
        payload = model.link.send(feats[rows], [batch.agent_types[r] for r in rows])
        return _messages(batch, rows, model.link.kind, list(payload))

    def wire_dtype(self, model) -> str:
        return model.link.wire_dtype

    def accept(self, model) -> Acceptance:
        # the link says what crosses the wire: its kind ("bev" maps, or "codes": integer codebook
        # indices sent as uint8 / uint16), payload_channels planes on the grid, and wire_dtype
        return Acceptance(kind=model.link.kind, shape=(model.link.payload_channels, *model.grid.shape),
                          agent_types=set(model.encoders))

    def receive(self, model, batch, feats, arrived) -> ModelOutput:
        own = ego_features(model, batch, feats)  # (B, C, H, W)
        B = own.shape[0]
        reference = model.computation == "reference"
        receivers = ego_types(batch)
        # under the reference protocol the ego fuses what the link makes of its own feature (the
        # reference GenComm: generated from its own message and enhanced); the link still reads the
        # ego's real feature (``own``) as the receiver's
        mine_own = model.own_view(own, receivers)
        H, W = model.grid.shape
        if not len(arrived):
            extra = _ages(model, batch, arrived, [[]] * B, own.device)
            losses = {}
            if reference and model.training and hasattr(model.link, "own"):
                # the reference GenComm's generation loss covers an ego that received nothing too
                alone = Arrival(own.new_zeros(0, 4, 4), [], own[:0], [], own.new_zeros(0, 1, H, W),
                                protocol="reference")
                losses = model.link.losses(own[:0], own[:0], alone)
            return ModelOutput(model.detect(model.fuse(mine_own, [1] * B, None, **extra)), losses=losses)
        device = own.device
        T = arrived.T_ego_from_sender(batch.T_ego_from_world).to(device)
        valid = warp_mask(T, model.lidar_range, (H, W), device=device)
        receiver = torch.as_tensor(arrived.receiver, device=device)
        arrival = Arrival(T, list(arrived.agent_type), own[receiver], [receivers[r] for r in arrived.receiver], valid,
                          protocol=model.computation)
        if model.training and getattr(model.link, "needs_ego_type_features", False):  # GenComm's ego-encoder target
            attach_ego_type_features(model, batch, arrived.source_row, arrival)
        got = model.link.receive(arrived.stacked().to(device), arrival)
        losses = model.link.losses(got, feats[torch.as_tensor(arrived.source_row, device=device)], arrival) \
            if model.training else {}
        # per sample: the ego first, then its arrived messages in send order
        order = sorted(range(len(arrived)), key=lambda k: (arrived.receiver[k], arrived.source_row[k]))
        rows, masks, counts, per_sample = [], [], [], []
        for b in range(B):
            mine = [k for k in order if arrived.receiver[k] == b]
            rows += [mine_own[b:b + 1]] + [got[k:k + 1] for k in mine]
            masks += [torch.ones(1, 1, H, W, device=device)] + [valid[k:k + 1] for k in mine]
            counts.append(1 + len(mine))
            per_sample.append(mine)
        # the reference fuses the zero-padded warps as they are (OpenCOOD's AttFusion / max): no masks
        fused = model.fuse(torch.cat(rows), counts, None if reference else torch.cat(masks),
                           **_ages(model, batch, arrived, per_sample, device))
        return ModelOutput(model.detect(fused), losses=losses)
