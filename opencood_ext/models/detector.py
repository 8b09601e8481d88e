"""The heterogeneous cooperative detector: one encoder stack per agent type, a
fusion method, a fusion op and a shared anchor head.

The fusion method (``fusion``: none / early / late / intermediate, the registry
:data:`~opencood_ext.models.fusion_methods.FUSION_METHODS`) says what each
collaborator sends and what the ego does with it; intermediate fusion also
names a ``link`` (:data:`~opencood_ext.models.links.LINKS`: the full feature,
GenComm's message, ...). One path for everything (training, evaluation, the
live demo)::

    encode(batch)                       per-agent BEV features, each in its own frame
    method.send(...)        -> Messages collaborators' payloads + their poses (headers)
    transmit(...)           -> Delivery in memory (training) or as bytes through the channel
    method.receive/detect   -> head maps / detections, from what ARRIVED and the ego's own pose

Shapes: N agents in the batch (all samples flattened, ego first per sample),
B samples, features (N, C, H, W) on the common :class:`BEVGrid`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
from torch import Tensor, nn

from ..comm.channel import ChannelConfig
from ..geometry.boxes import boxes_inside_range
from ..comm.messages import Acceptance, Delivery, ReceiverContext, transmit
from ..comm.receiver import ReceiverConfig
from ..protocol import Computation, computation_of, post_fusion_layers_of
from ..postprocess import Detections, decode_detections, reference_candidates, reference_rules
from ..registry import Registry
from . import build
from .anchors import AnchorGenerator, BoxCoder, Targets, assign_targets, assign_targets_reference
from .encoder_stack import EncoderStack
from .feature_cache import Encoded, FeatureCache, frozen
from .fusion import AttFusion, MaxFusion
from .fusion_methods import FUSION_METHODS, ModelOutput
from .head import AnchorHead, HeadOutput
from .links import LINKS
from .losses import DetectionLoss, LossOutput
from .pyramid_fusion import PyramidFusion
from .v2xvit import V2XViTFusion
from .warp import warp_rule

FUSION_OPS = Registry("fusion op", "fusion of the ego's and the received features (model.fusion_op, "
                      "its arguments in model.fusion_args)",
                      {"att": AttFusion, "max": MaxFusion, "v2xvit": V2XViTFusion, "pyramid": PyramidFusion})


@dataclass
class Encodings:
    """What :meth:`CooperativeDetector.encode` gives. feats: (N, C, H, W), each agent's feature in its
    own frame (None when the batch has no encoder input, as in early fusion); depth_logits: per camera
    type encoded now, (n_t, Ncam, D, h, w); depth_terms: per camera type a feature cache served,
    the depth loss as (sum, count) per agent (:func:`~.lss.depth_loss_terms`)."""

    feats: Optional[Tensor]
    depth_logits: Dict[str, Tensor] = dataclasses.field(default_factory=dict)
    depth_terms: Dict[str, Tuple[Tensor, Tensor]] = dataclasses.field(default_factory=dict)


@dataclass
class Prediction:
    """detections: B :class:`Detections` in each ego frame. delivery: what was sent, what arrived,
    bytes per message, what was lost or rejected (:class:`~opencood_ext.comm.messages.Delivery`)."""

    detections: List[Detections]
    delivery: Delivery


class CooperativeDetector(nn.Module):
    """See the module docstring. Constructor arguments are the ``model:`` config.

    agent_types: ``{type: {encoder: {...}, backbone: {...}, shrink_channels: 128}}``.
    lidar_range: the ego detection area (from ``data.lidar_range``).
    link: ``{type: full_feature | gencomm, ...}`` for intermediate fusion.
    fusion_op / fusion_args: the fusion op (:data:`FUSION_OPS`) and its constructor arguments
        (the width ``channels`` is derived), e.g. ``fusion_op: v2xvit, fusion_args: {depth: 1}``.
    anchors: AnchorGenerator arguments except the grid (sizes, rotations, z_center).
    pos_iou / neg_iou: target assignment thresholds (one, or one per class).
    loss: DetectionLoss arguments. depth_weight: LSS depth supervision weight.
    score_threshold / nms_iou / max_boxes: post-processing (docs/formats.md section 4).
    train_message_drop: probability that each collaborator's message is lost in a training step
        (messages travel in memory there); 0 = never. Teaches the receiver to cope without them.
    voxel_caps: derived from ``data.agent_types``: ``{type: (max_points_per_voxel, max_voxels)}``,
        used where the receiver voxelises (early fusion's merged cloud; None = every grid cell).
    protocol: whose computation the model runs (the experiment's top-level ``protocol:``, passed
        by :func:`~opencood_ext.experiment.build_model`). "native": this project's own. "reference":
        the GenComm reference / HEAL code's: the link also turns the ego's own feature into what
        the reference fuses (GenComm: generated from its own message and enhanced), fusion has no
        coverage masks (OpenCOOD's AttFusion / max over the zero-padded warps), anchor targets
        by the reference's axis-aligned rule (:func:`~.anchors.assign_targets_reference`).
        "equalized": native's computation with the shared post-fusion block (``post_fusion_layers``).
        ``computation`` is what the parts follow ("native" or "reference", :func:`computation_of`).
    post_fusion_layers: 3x3 conv-BN-ReLU layers (C -> C) between fusion and the 1x1 head,
        for every fusion method alike (0: the head reads each fused cell alone); unset: the
        protocol's (:func:`post_fusion_layers_of`: equalized 2, native and reference 0). A warped
        collaborator feature says its boxes' sub-cell offsets and yaw in the sender's grid and
        axes; only layers that see neighbouring cells can read the rotated map (README).
    """

    def __init__(self, agent_types: Dict[str, dict], lidar_range, fusion: str = "intermediate",
                 fusion_op: str = "att", fusion_args: Optional[dict] = None, link: Optional[dict] = None,
                 anchors: Optional[dict] = None, pos_iou: Union[float, List[float]] = 0.6,
                 neg_iou: Union[float, List[float]] = 0.45,
                 loss: Optional[dict] = None, depth_weight: float = 1.0,
                 score_threshold: float = 0.2, nms_iou: float = 0.15, max_boxes: int = 150,
                 post_fusion_layers: Optional[int] = None, train_message_drop: float = 0.0,
                 voxel_caps: Optional[Dict[str, Tuple[int, Optional[int]]]] = None,
                 protocol: Protocol = "native"):
        super().__init__()
        if not agent_types:
            raise ValueError("model.agent_types is empty: name at least one agent type")
        self.computation: Computation = computation_of(protocol)
        self.protocol: Protocol = protocol
        self.lidar_range = [float(v) for v in lidar_range]
        self.method = FUSION_METHODS.get_class(fusion, "model.fusion")()
        if not 0.0 <= float(train_message_drop) <= 1.0:
            raise ValueError(f"model.train_message_drop must be a probability in [0, 1], got {train_message_drop}")
        self.train_message_drop = float(train_message_drop)
        self.voxel_caps = dict(voxel_caps or {})
        self.wire_dtype: Optional[str] = None  # run-time override of the payload dtype (float kinds)
        # diagnostic: senders of these types send all-zero payloads (tools/inference.py --blank_messages)
        self.blank_message_types: Set[str] = set()
        # the receiver's bounds and the alliance key (the experiment's receiver: section; set by build_model)
        self.receiver = ReceiverConfig()
        # late fusion of separately trained models: a type's own detector (sender_detections)
        self.sender_detectors = nn.ModuleDict()
        # frozen encoder stacks' outputs kept on disk (tools set it: --feature_cache); None: encode every time
        self.feature_cache: Optional[FeatureCache] = None
        self._type_specs = {t: dict(spec) for t, spec in agent_types.items()}
        self.encoders = nn.ModuleDict({
            t: build(spec, {"stack": EncoderStack}, f"model.agent_types.{t}", default_type="stack",
                     lidar_range=self.lidar_range, protocol=self.computation)
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
            if self.method.needs_link else None
        if hasattr(self.link, "use_protocol"):
            self.link.use_protocol(protocol)  # GenComm: the protocol decides its generation order
        padded = {t: (s.uncropped, s.crop) for t, s in self.encoders.items() if s.crop is not None}
        if self.computation == "reference" and padded and hasattr(self.link, "extract_before_padding"):
            self.link.extract_before_padding(padded)  # the reference GenComm: a camera's message before its pad
        FUSION_OPS.get_class(fusion_op, "model.fusion_op")
        if not isinstance(fusion_args or {}, dict) or "type" in (fusion_args or {}):
            raise ValueError(f"model.fusion_args: a mapping of model.fusion_op's arguments, without 'type' "
                             f"(the op is named by model.fusion_op), got {fusion_args!r}")
        self.fuse = build({**dict(fusion_args or {}), "type": fusion_op}, FUSION_OPS, "model.fusion_args",
                          channels=self.channels)
        post_fusion_layers = post_fusion_layers_of(protocol, post_fusion_layers)
        if post_fusion_layers < 0:
            raise ValueError(f"model.post_fusion_layers must be >= 0, got {post_fusion_layers}")
        fused = getattr(self.fuse, "out_channels", self.channels)  # a fusion op may change the width
        self.post_fusion = nn.Sequential(*[
            nn.Sequential(nn.Conv2d(fused, fused, 3, padding=1, bias=False),
                          nn.BatchNorm2d(fused), nn.ReLU(inplace=True))
            for _ in range(post_fusion_layers)])
        self.anchor_gen = AnchorGenerator(self.lidar_range, self.grid.shape, **dict(anchors or {}),
                                          protocol=self.computation)
        self.register_buffer("anchors", self.anchor_gen.flat(), persistent=False)
        # the reference's direction head has a bin pair per rotation, shared by the classes (V2X-Real)
        self.head = AnchorHead(fused, num_anchors_per_loc=self.anchor_gen.num_per_loc,
                               num_classes=self.anchor_gen.num_classes,
                               dir_slots=self.anchor_gen.num_rotations if self.computation == "reference" else None)
        self.coder = BoxCoder()
        self.pos_iou, self.neg_iou = pos_iou, neg_iou
        self.criterion = DetectionLoss(**dict(loss or {}))
        self.depth_weight = float(depth_weight)
        self.post = dict(score_threshold=score_threshold, nms_iou=nms_iou, max_boxes=max_boxes)

    @property
    def receiver(self) -> ReceiverConfig:
        """The receiver's bounds and key references (:class:`~opencood_ext.comm.receiver.ReceiverConfig`).
        Setting it loads the keys it names (ValueError, one line, when missing) into :attr:`security`,
        never a config or a state dict."""
        return self._receiver

    @receiver.setter
    def receiver(self, cfg: ReceiverConfig) -> None:
        self._receiver, self.security = cfg, cfg.load_security()

    @property
    def authenticated(self) -> bool:
        """Whether this model signs what it sends and accepts only signed messages."""
        return self.security.signed

    @property
    def signing_key(self) -> Optional[bytes]:
        """The alliance HMAC key its senders sign with (None: unsigned or per-sender keys)."""
        return self.security.hmac_key

    def acceptance(self) -> Acceptance:
        """What this receiver accepts: its fusion method's :meth:`accept` under ``receiver``'s bounds."""
        return self.method.accept(self).bounded_by(self._receiver, self.security)

    def receiver_contexts(self, batch) -> List[ReceiverContext]:
        """Per sample b, what its ego knows besides the packets: its time (its data's timestamp), its
        id, the frame's alliance registry ``{agent id: agent type}`` of the sample's agents (whom it
        expects, with their types) and, with per-sender keys, its replay window (kept across frames)."""
        n = batch.num_agents
        times = batch.agent_times or [0.0] * n
        sample = batch.sample_index.tolist()
        out = []
        for b, e in enumerate(batch.ego_index.tolist()):
            registry = {int(batch.agent_ids[r]): batch.agent_types[r] for r in range(n) if sample[r] == b}
            own = int(batch.agent_ids[e])
            out.append(ReceiverContext(float(times[e]), own, registry, self.security.window(own)))
        return out

    @property
    def fusion(self) -> str:
        """The fusion method's name (``model.fusion``)."""
        return self.method.name

    def set_fusion(self, name: str) -> None:
        """Run the trained model with another fusion method (e.g. late fusion of an ego-only detector,
        or any cooperative model with its collaborators off: "none")."""
        method = FUSION_METHODS.get_class(name, "fusion method")()
        if method.needs_link and self.link is None:
            raise ValueError(f"fusion '{name}' needs a link, and this model was trained without one; "
                             f"it can run {sorted(k for k, c in FUSION_METHODS.items() if not c.needs_link)}")
        width = getattr(self.fuse, "out_channels", self.channels)
        if not method.uses_fusion_op and width != self.channels:
            raise ValueError(f"fusion '{name}' detects on an agent's own {self.channels}-channel feature, but this "
                             f"model's head reads its fusion op's {width} channels ({type(self.fuse).__name__}); "
                             f"evaluate it with fusion {self.method.name}")
        self.method = method

    # ------------------------------------------------------------------ features
    def voxel_sizes(self) -> Dict[str, Optional[tuple]]:
        return {t: s.voxel_size for t, s in self.encoders.items()}

    def encode(self, batch) -> Encodings:
        """Every agent's BEV feature, each in its agent's frame, and the camera types' depth outputs.
        With :attr:`feature_cache` set, frozen stacks (:func:`~.feature_cache.frozen`) are served
        through it; an augmented ego's input (training) is encoded every time and never stored."""
        H, W = self.grid.shape
        out = Encodings(feats=None)
        cache = self.feature_cache
        egos = set(batch.ego_index.tolist()) if self.training else set()
        for t, inp in batch.inputs.items():
            if t not in self.encoders:
                raise KeyError(f"batch has agent type {t} but the model knows {sorted(self.encoders)}")
            stack = self.encoders[t]
            if cache is not None and frozen(stack):
                store = [int(i) not in egos for i in batch.type_index[t]]
                enc = cache.encode(stack, (self._type_specs[t], self.lidar_range), inp, store)
            else:
                plain = stack(inp)
                enc = Encoded(bev=plain.bev, depth_logits=plain.depth_logits)
            if out.feats is None:
                out.feats = enc.bev.new_zeros(batch.num_agents, self.channels, H, W)
            out.feats = out.feats.index_copy(0, batch.type_index[t].to(enc.bev.device), enc.bev)
            if enc.depth_logits is not None:
                out.depth_logits[t] = enc.depth_logits
            if enc.depth_terms is not None:
                out.depth_terms[t] = enc.depth_terms
        return out

    def detect(self, bev: Tensor) -> HeadOutput:
        """(N, C, H, W) fused (or single-agent) BEV maps -> head maps: the post-fusion layers,
        then the 1x1 head. Every detection path goes through here."""
        return self.head(self.post_fusion(bev))

    def own_view(self, bev: Tensor, agent_types: List[str]) -> Tensor:
        """(N, C, H, W) agents' own BEV maps (any frame) -> what this model's post-fusion layers read
        of an agent's own feature. Under computation "reference" the link's ``own`` (the reference
        GenComm regenerates every agent's own feature from its message, whether or not anything
        else arrives, and its head only ever saw that); otherwise the maps themselves. Fusion
        ``none``, late fusion and intermediate fusion's ego row all read through here, so one set of
        weights detects alike alone and with collaborators (issue 31's reference pair: without it a
        GenComm stage 1 detected nothing alone)."""
        if self.computation == "reference" and hasattr(self.link, "own"):
            return self.link.own(bev, agent_types)
        return bev

    def sender_detections(self, bev: Tensor, agent_types: List[str], candidates: bool = False) -> List[Detections]:
        """Late fusion's sender side: each agent's own boxes from its (N, C, H, W) map, unfiltered by
        the receiver's range. A type in ``sender_detectors`` detects with its own separately trained
        model (late fusion of stage-1 runs, :func:`opencood_ext.runs.late_fusion_of`); the others
        with this model's head. ``candidates``: the reference's per-agent part only (thresholded,
        decoded, direction applied: :meth:`candidates`), which its late fusion merges in the ego frame."""
        out: List[Optional[Detections]] = [None] * len(agent_types)
        for t in dict.fromkeys(agent_types):
            rows = [i for i, a in enumerate(agent_types) if a == t]
            own = self.sender_detectors[t] if t in self.sender_detectors else self
            head = own.detect(own.own_view(bev[rows], [t] * len(rows)))
            for i, d in zip(rows, own.candidates(head) if candidates else own.decode(head, gt_range=None)):
                out[i] = d
        return out

    def candidates(self, head: HeadOutput) -> List[Detections]:
        """The reference's per-agent post-processing (:func:`~opencood_ext.postprocess.reference_candidates`,
        this model's threshold and anchors): what its late fusion projects to the ego and merges."""
        return reference_candidates(head, self.anchors, self.post["score_threshold"], self.coder,
                                    reference_rules(self.anchor_gen.num_classes))

    def decode(self, head: HeadOutput, gt_range: Union[str, None, Sequence[float]] = "ego") -> List[Detections]:
        """Head maps -> detections (post-processing settings of this model); ``gt_range`` "ego"
        keeps boxes inside the ego's detection area, None keeps all."""
        r = self.lidar_range if gt_range == "ego" else gt_range
        return decode_detections(head, self.anchors, coder=self.coder, gt_range=r, protocol=self.computation,
                                 **self.post)

    def in_range(self, boxes: Tensor) -> Tensor:
        """(P,) bool: boxes (P, 7) kept in the ego's detection area: the field's rule, all 8 corners
        inside, z included (:func:`~opencood_ext.geometry.boxes.boxes_inside_range`)."""
        return torch.from_numpy(boxes_inside_range(boxes, self.lidar_range)).to(boxes.device)

    # ------------------------------------------------------------------ one path
    def deliver(self, messages, channel: Optional[ChannelConfig] = None, keys=None, wire: Optional[bool] = None,
                contexts: Optional[Sequence[ReceiverContext]] = None) -> Delivery:
        """Move ``messages`` to their receivers: in memory while training (with
        ``train_message_drop``), else as bytes through ``channel`` (:func:`transmit`), signed
        with the alliance key when one is set and received under :meth:`acceptance`, each
        receiver's ``contexts`` and the per-frame budget of ``receiver``."""
        wire = (not self.training) if wire is None else wire
        if self.blank_message_types and len(messages):
            messages = messages.blanked(self.blank_message_types)
        dtype = self.method.wire_dtype(self)
        if self.wire_dtype is not None and messages.kind != "codes":
            dtype = self.wire_dtype
        return transmit(messages, wire=wire, dtype=dtype, channel=channel, keys=keys,
                        accept=self.acceptance(), contexts=contexts, budget=self._receiver.budget(),
                        signers=self.security.signers,
                        train_drop=self.train_message_drop if self.training else 0.0)

    def forward(self, batch) -> ModelOutput:
        """Training and validation: messages travel in memory, so gradients reach the senders.
        Every warp inside follows the protocol's rule (:func:`~.warp.warp_rule`)."""
        enc = self.encode(batch)
        arrived = self.deliver(self.method.send(self, batch, enc.feats), wire=False).arrived
        with warp_rule(self.computation):
            out = self.method.receive(self, batch, enc.feats, arrived)
        out.depth_logits, out.depth_terms = enc.depth_logits, enc.depth_terms
        return out

    # ------------------------------------------------------------------ loss
    def targets(self, gt_boxes: List[Tensor], gt_classes: List[Tensor]) -> Targets:
        # the reference's targets use its float64 anchors (their float32 rounding can break IoU ties otherwise)
        anchors = self.anchor_gen.flat64() if self.computation == "reference" else self.anchors.cpu()
        anchor_classes = self.anchor_gen.flat_classes()
        assign = assign_targets_reference if self.computation == "reference" else assign_targets
        items = [assign(anchors, g.cpu().float(), self.pos_iou, self.neg_iou, self.coder,
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
        for t, (ce_sum, count) in out.depth_terms.items():  # agents a feature cache served
            if batch.inputs[t].depth is not None and self.depth_weight > 0:
                n = count.sum()
                d = self.depth_weight * (ce_sum.sum() / n if int(n) > 0 else ce_sum.sum() * 0.0)
                parts[f"depth_{t}"] = d
                total = total + d
        for k, v in out.losses.items():
            parts[k] = v
            total = total + v
        return LossOutput(total=total, parts=parts, detection=terms.total)  # cls + box + dir

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def predict(self, batch, channel: Optional[ChannelConfig] = None, keys=None, now=None) -> Prediction:
        """Inference: every message goes through the wire (encode, ``channel``, decode, the
        receiver's acceptance rules and per-frame checks, :meth:`receiver_contexts`). keys(b): the
        channel's draw key for sample b (default b). now: per sample, the receiver's time (default:
        its own data's timestamp)."""
        feats = self.encode(batch).feats
        contexts = self.receiver_contexts(batch)
        if now is not None:
            contexts = [dataclasses.replace(c, now=float(t)) for c, t in zip(contexts, now)]
        delivery = self.deliver(self.method.send(self, batch, feats), channel=channel, keys=keys, wire=True,
                                contexts=contexts)
        with warp_rule(self.computation):
            return Prediction(self.method.detect(self, batch, feats, delivery.arrived), delivery)
