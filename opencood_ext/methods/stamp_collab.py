"""STAMP's own collaboration model (taco-group/STAMP ``collab_w_adapter``, ``stage: infer``) seen
from an ego of one agent type: the link between the agents' encoder stacks and that type's own
Pyramid Fusion and heads.

In STAMP's repository every agent type ``m`` is a whole model (encoder, ResNet BEV backbone,
aligner, its own PyramidFusion, ``shrink_conv`` and 1x1 heads) plus an adapter ``m -> protocol``
and a reverter ``protocol -> m`` (AdapterConvNext: 1x1 conv C -> dim, ConvNeXt blocks, 1x1 conv
dim -> C; a 3x3 "smoothing" conv is built and never applied). At inference, for a sample whose
ego is of type ``E`` (the reference evaluates ``output_dict[agent_modality_list[0]]``, the ego's
type), every agent's (C, H, W) feature, in its own frame, becomes:

* the feature itself when the agent is of type ``E`` (the ego's included: same space);
* ``reverter_E(adapter_s(feature))`` when it is of another type ``s`` (both maps in the sender's
  frame, before any warp);

and ``E``'s PyramidFusion fuses those rows (warping each level into the ego frame), ``E``'s
shrink_conv and heads detect. The other types' fusion and heads, ``E``'s adapter and the other
types' reverters are not read for an ``E`` ego: this model is the reference's computation for
samples whose ego is of type :attr:`ego`, and refuses a receiver of another type.

As messages: a sender of type ``E`` sends its feature, any other sender its protocol feature
``adapter_s(f)`` (C channels, kind "bev", its own frame); the receiver (type ``E``) applies its
reverter to protocol messages in the sender's frame (:meth:`to_receiver_space`), and the
``pyramid`` fusion method warps and fuses (:mod:`opencood_ext.models.pyramid_method`).

``ego_of_any_type`` (the GenComm reference's ``heter_model_baseline_w_stamp_infer``: ONE fusion and
head, type ``E``'s, serve every sample): an ego of another type ``t`` is not refused; its own
feature is fused as ``reverter_E(adapter_t(f))``, like any non-``E`` agent's.

``cycle_own`` (STAMP's adapter-training stages with outputs: every agent is of type ``E`` there,
the protocol type's stack feeds only the alignment loss, and the ``E`` output fuses every agent's
``reverter_E(adapter_E(f))``, the ego's too) holds ``E``'s adapter only, sends every feature through
it and reverts every row, the ego's own included (:meth:`own`).

``adapter`` picks STAMP's variant by its yamls' ``core_method`` (:mod:`.stamp_adapters`): the
ConvNeXt one, the 1x1 conv or the attention adapter. The attention adapter couples the rows of one
call (its attention runs across them): as in the reference, an adapter sees every sender of its type
in the batch at once and the reverter the protocol features of one sending type at a time. Where the
reference's groups hold the ego's own row too (``cycle_own``, ``ego_of_any_type``), ours adapts the
ego apart from its collaborators, so those two are refused with the attention adapter.
"""
from __future__ import annotations

from typing import Dict, List, Literal, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from ..models.links import LINKS, Arrival
from ..models.warp import warp_to_ego
from .stamp_adapters import ROW_COUPLED, AdapterKind, build_adapter

#: reference key prefixes of one type's own fusion and heads in collab_w_adapter
TYPE_OUTPUT_PARTS = ("pyramid_backbone", "shrink_conv", "cls_head", "reg_head", "dir_head")


@LINKS.register("stamp_collab")
class StampCollabLink(nn.Module):
    """The module docstring's link for an ego of type ``ego``.

    channels, agent_types, lidar_range: derived. ego: the agent type whose fusion and heads the model
    holds (STAMP's ``ego_modality``). hidden_channels / blocks / kernel_size: every adapter's and
    reverter's size (STAMP's submodule_args dim / num_of_blocks / kernel_size). cycle_own: the
    adapter-training stages' computation (module docstring). ego_of_any_type: one model for egos of every
    type (module docstring). wire_dtype: payload dtype on the wire.
    adapter: STAMP's variant (``adapterconvnext``, ``adapterconv``, ``adapteratt``), with its own sizes:
    ConvNeXt hidden_channels / blocks / kernel_size (defaults 64 / 3 / 7); the 1x1 conv none; attention
    hidden_channels / blocks (its depth) / num_heads / patch_size (defaults 64 / 3 / 4 / 16) and
    feature_shape, the feature grid [H, W]. A size the variant does not read must be unset.
    """

    kind = "bev"

    def __init__(self, channels: int, agent_types: List[str], lidar_range, ego: str,
                 hidden_channels: Optional[int] = None, blocks: Optional[int] = None,
                 kernel_size: Optional[int] = None, cycle_own: bool = False, ego_of_any_type: bool = False,
                 wire_dtype: Literal["float32", "float16", "int8"] = "float32",
                 adapter: AdapterKind = "adapterconvnext", num_heads: Optional[int] = None,
                 patch_size: Optional[int] = None, feature_shape: Optional[List[int]] = None):
        super().__init__()
        if ego not in agent_types:
            raise ValueError(f"model.link.ego {ego!r} must be one of the agent types {list(agent_types)}")
        self.lidar_range = list(lidar_range)
        self.ego = ego
        self.cycle_own = bool(cycle_own)
        self.ego_of_any_type = bool(ego_of_any_type)
        if self.cycle_own and self.ego_of_any_type:
            raise ValueError("model.link: cycle_own and ego_of_any_type are two different reference models; "
                             "set one")
        if adapter in ROW_COUPLED and (self.cycle_own or self.ego_of_any_type):
            raise ValueError(f"model.link.adapter {adapter}: its attention couples the rows adapted together and "
                             f"the reference adapts the ego with its collaborators; here the ego's own row is "
                             f"adapted apart (cycle_own / ego_of_any_type): not the reference's computation")
        self.adapter_kind = adapter
        size = dict(hidden_channels=hidden_channels, blocks=blocks, kernel_size=kernel_size, num_heads=num_heads,
                    patch_size=patch_size, feature_shape=feature_shape)
        # the adapter stages' agents are all of the ego type (the protocol type's stack feeds only their loss)
        senders = [ego] if self.cycle_own else [t for t in agent_types if t != ego]
        self.adapter = nn.ModuleDict({t: build_adapter(adapter, channels, **size) for t in senders})
        self.reverter = nn.ModuleDict({ego: build_adapter(adapter, channels, **size)} if senders else {})
        self.payload_channels = int(channels)
        self.wire_dtype = wire_dtype

    def _adapted(self, t: str) -> bool:
        return t in self.adapter

    def send(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """Sender side: (n, C, H, W) own-frame features -> the same, each through its type's adapter
        unless it is of the ego type (sent as it is)."""
        out = features
        for t in dict.fromkeys(agent_types):
            if not self._adapted(t):
                if t != self.ego:
                    raise ValueError(f"agent type {t} has no STAMP adapter in this model (adapters: "
                                     f"{sorted(self.adapter)}; ego type {self.ego})")
                continue
            idx = torch.as_tensor([i for i, a in enumerate(agent_types) if a == t], device=features.device)
            out = out.index_copy(0, idx, self.adapter[t](features[idx]))
        return out

    def _check_receivers(self, receiver_types: List[str]) -> None:
        wrong = [] if self.ego_of_any_type else sorted(set(receiver_types) - {self.ego})
        if wrong:
            raise ValueError(f"this STAMP collaboration model holds type {self.ego}'s fusion and heads "
                             f"(model.link.ego); an ego of type {wrong[0]} runs its own in the reference: "
                             f"convert the file with its ego_modality set to {wrong[0]}")

    def to_receiver_space(self, payload: Tensor, sender_types: List[str], receiver_types: List[str]) -> Tensor:
        """(n, C, H, W) payloads in their senders' frames -> the receiver's feature space, same frames:
        protocol messages through the receiver's reverter, one call per sending type (the reference's
        grouping), the ego type's own features as they are."""
        self._check_receivers(receiver_types)
        out = payload
        for s in dict.fromkeys(sender_types):
            if not self._adapted(s):
                continue
            idx = torch.as_tensor([i for i, a in enumerate(sender_types) if a == s], device=payload.device)
            out = out.index_copy(0, idx, self.reverter[self.ego](payload[idx]))
        return out

    def receive(self, payload: Tensor, arrival: Arrival) -> Tensor:
        """Receiver side for fusion methods that fuse ego-frame features: reverted, then warped."""
        got = self.to_receiver_space(payload, arrival.sender_types, arrival.receiver_types)
        return warp_to_ego(got, arrival.T_ego_from_sender, self.lidar_range)

    def own(self, features: Tensor, agent_types: List[str]) -> Tensor:
        """What the ego fuses of its own (n, C, H, W) feature: itself, or with ``cycle_own`` its
        round trip through the protocol space."""
        self._check_receivers(agent_types)
        if self.cycle_own:
            return self.reverter[self.ego](self.adapter[self.ego](features))
        rows = [i for i, t in enumerate(agent_types) if t != self.ego]  # ego_of_any_type: another type's ego
        if not rows:
            return features
        idx = torch.as_tensor(rows, device=features.device)
        adapted = self.send(features[idx], [agent_types[i] for i in rows])
        return features.index_copy(0, idx, self.reverter[self.ego](adapted))

    def losses(self, received: Tensor, sender_features: Tensor, arrival: Arrival) -> Dict[str, Tensor]:
        return {}

    # ------------------------------------------------------------------ reference checkpoints
    def reference_view(self, ref: Mapping[str, Tensor], types: List[str]) -> Tuple[Dict[str, Tensor],
                                                                                   Dict[str, str], Dict[str, str]]:
        """A collab_w_adapter state dict seen as the single-model layout the weight importer maps
        (:mod:`opencood_ext.interop.weights`): ``pyramid_backbone_<E>.*`` -> ``pyramid_backbone.*``,
        likewise ``shrink_conv_<E>``, ``{cls,reg,dir}_head_<E>``. -> (view, {view key: original key},
        {original key: why it is not read}) for the other types' fusion and heads and the adapters /
        reverters this ego never applies."""
        view, names, unread = {}, {}, {}
        parts = tuple(f"{p}_" for p in TYPE_OUTPUT_PARTS)
        for k, v in ref.items():
            head = k.split(".", 1)[0]
            if head.startswith(parts):
                part, t = head.rsplit("_", 1)
                if t == self.ego:
                    new = part + k[len(head):]
                    view[new], names[new] = v, k
                else:
                    unread[k] = (f"type {t}'s own fusion and heads: the reference runs them for an ego of type "
                                 f"{t}; this model's ego type is {self.ego}")
                continue
            if head.startswith(("adapter_", "reverter_")):
                kind, t = head.split("_", 1)
                used = t in self.adapter if kind == "adapter" else t in self.reverter
                if not used:
                    unread[k] = (f"{head}: never applied for an ego of type {self.ego}" if t in types else
                                 f"{head}: type {t} is not one of this model's agent types")
                    continue
            view[k], names[k] = v, k
        return view, names, unread
