"""Messages of a batch and their transmission: the one path from a sender's
payload to what a receiver gets, for every fusion method.

:class:`Messages` holds what the collaborators of a collated batch send, one
entry per message: the payload in the SENDER's frame and what the header
carries (sender id, agent type, timestamp, ``pose`` = T_world_from_sender).
``receiver`` says which sample's ego it is for. ``source_row`` is local
bookkeeping (the sender's row in the batch, for training losses and
analysis); it never crosses the wire and no receiver uses it to place a
message.

:func:`transmit` moves a batch's messages to their receivers:

* in memory (training, validation): payload tensors pass as they are, so
  gradients flow from the receiver back into the sender's modules; an optional
  random loss (``train_drop``) teaches the receiver to cope without them;
* on the wire (inference, dataset evaluation and the live demo alike): each message is
  encoded to bytes (counted), passes the channel (:mod:`.channel`: pose noise, loss; live,
  latency in ticks too), and is decoded under the
  receiver's :class:`Acceptance` rules, then the frame's (:func:`receive_frame`:
  its own id, the alliance registry, one message per sender, the per-frame
  budget). A message the receiver cannot use is rejected with a reason, logged
  and counted; the rest carry on, and the ego always detects from its own input.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np

import torch
from torch import Tensor

from .channel import ChannelConfig, ChannelEffects, apply_channel
from .receiver import FrameBudget, ReceiverConfig, Security
from .signing import KeyRegistry, ReplayWindow, SenderKeys
from .wire import BoxRules, Limits, Message, MessageError, decode, encode

log = logging.getLogger(__name__)
TIME_TOL_S = 1e-6  # ages within a microsecond of max_age / max_future count as at the bound (float rounding)


@dataclass
class Messages:
    """Messages of one batch (n entries). payload: n tensors shaped by ``kind`` (see
    :mod:`.wire`), each in its sender's frame. pose: (n, 4, 4) float64 T_world_from_sender."""

    kind: str
    receiver: List[int]
    source_row: List[int]
    sender_id: List[int]
    agent_type: List[str]
    timestamp: List[float]
    pose: Tensor
    payload: List[Tensor]

    def __post_init__(self):
        n = len(self.receiver)
        for name in ("source_row", "sender_id", "agent_type", "timestamp", "payload"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Messages.{name} has {len(getattr(self, name))} entries, receiver has {n}")
        if tuple(self.pose.shape) != (n, 4, 4):
            raise ValueError(f"Messages.pose must be ({n}, 4, 4), got {tuple(self.pose.shape)}")

    def __len__(self) -> int:
        return len(self.receiver)

    @classmethod
    def empty(cls, kind: str) -> "Messages":
        return cls(kind, [], [], [], [], [], torch.zeros(0, 4, 4, dtype=torch.float64), [])

    def select(self, keep: Sequence[int]) -> "Messages":
        """The entries at ``keep`` (indices), in that order."""
        keep = list(keep)
        return Messages(self.kind, [self.receiver[i] for i in keep], [self.source_row[i] for i in keep],
                        [self.sender_id[i] for i in keep], [self.agent_type[i] for i in keep],
                        [self.timestamp[i] for i in keep], self.pose[keep] if keep else self.pose[:0],
                        [self.payload[i] for i in keep])

    def blanked(self, agent_types) -> "Messages":
        """A copy whose payloads from senders of ``agent_types`` are all zeros (same shape and dtype):
        a diagnostic of what those senders' messages carry (``tools/inference.py --blank_messages``).
        Feature maps (kind "bev") only: a zero codebook index is a code, zero boxes or points are data."""
        if self.kind != "bev":
            raise ValueError(f"blank messages: only feature-map messages (kind 'bev') can be blanked, these are "
                             f"'{self.kind}' (a zero codebook index is a code, zero boxes or points are data)")
        payload = [torch.zeros_like(p) if t in agent_types else p for p, t in zip(self.payload, self.agent_type)]
        return dataclasses.replace(self, payload=payload)

    def stacked(self) -> Tensor:
        """payloads as one (n, ...) tensor (they must share a shape)."""
        return torch.stack(self.payload)

    def T_ego_from_sender(self, T_ego_from_world: Tensor) -> Tensor:
        """(n, 4, 4) float32: each message's pose seen from its receiver, ``T_ego_from_world`` (B, 4, 4)
        being the receivers' own poses (the only other thing a receiver knows)."""
        if not len(self):
            return torch.zeros(0, 4, 4)
        T = T_ego_from_world.to(torch.float64)[torch.as_tensor(self.receiver)] @ self.pose.to(T_ego_from_world.device)
        return T.float()

    def to_wire(self, i: int) -> Message:
        return Message(sender_id=self.sender_id[i], agent_type=self.agent_type[i], timestamp=self.timestamp[i],
                       pose=self.pose[i].detach().cpu().numpy(), payload=self.payload[i], kind=self.kind)


@dataclass(frozen=True)
class Acceptance:
    """What a receiver can use; anything else is rejected (logged, counted), never crashes it.

    kind: the payload kind it reads. shape: the exact payload shape, or None (boxes and points
    vary in length; ``max_rows`` and ``max_elements`` still bound them). agent_types: the
    alliance's types it knows (None = any). max_abs: largest |value| a payload may carry.
    max_age / max_future: largest age / lead (seconds) of the message's generation time (version
    3) or its timestamp times ``tick_s`` (seconds per timestamp unit) over the receiver's now (None = any).
    max_translation: largest |t| (m, each axis) of the sender's pose. max_rows: most boxes /
    points in one message. max_bytes: largest packet. boxes: box contents (late fusion).
    key: the alliance's HMAC key (only messages signed with it are accepted; never printed).
    registry: the alliance's Ed25519 public keys (only messages signed by their sender's key are).
    The payload size, row count and packet size are checked from the header, before decoding."""

    kind: str
    shape: Optional[Tuple[int, ...]] = None
    agent_types: Optional[Set[str]] = None
    max_elements: int = 1 << 28
    max_abs: Optional[float] = 1e6
    max_age: Optional[float] = None
    max_future: Optional[float] = None
    max_translation: Optional[float] = None
    max_rows: Optional[int] = None
    max_bytes: Optional[int] = None
    boxes: Optional[BoxRules] = None
    key: Optional[bytes] = field(default=None, repr=False, compare=False)
    registry: Optional[KeyRegistry] = field(default=None, compare=False)
    tick_s: float = 0.05

    def limits(self) -> Limits:
        n = math.prod(self.shape) if self.shape is not None else self.max_elements
        return Limits(max_elements=min(n, self.max_elements), max_abs=self.max_abs, max_rows=self.max_rows,
                      max_translation=self.max_translation, boxes=self.boxes, key=self.key, registry=self.registry)

    def bounded_by(self, receiver: ReceiverConfig, security: Optional[Security] = None) -> "Acceptance":
        """This acceptance under a ``receiver:`` config's bounds and clock, and the keys it loaded."""
        security = security or Security()
        rows = {"boxes": receiver.max_boxes, "points": receiver.max_points}.get(self.kind)
        boxes = dataclasses.replace(self.boxes, max_size=receiver.max_box_size_m) if self.boxes else None
        return dataclasses.replace(self, max_abs=receiver.max_abs, max_age=receiver.max_age,
                                   max_future=receiver.max_future, max_translation=receiver.max_translation_m,
                                   max_rows=rows, max_bytes=receiver.max_message_bytes, boxes=boxes,
                                   key=security.hmac_key, registry=security.registry, tick_s=receiver.tick_s)

    def check(self, msg: Message, now: Optional[float] = None) -> Optional[str]:
        """None when ``msg`` (decoded) is usable, else the reason."""
        if msg.kind != self.kind:
            return f"payload kind {msg.kind!r}, this receiver reads {self.kind!r}"
        if self.shape is not None and tuple(msg.payload.shape) != tuple(self.shape):
            return f"payload shape {tuple(msg.payload.shape)}, this receiver needs {tuple(self.shape)}"
        if self.agent_types is not None and msg.agent_type not in self.agent_types:
            return f"unknown agent type {msg.agent_type!r} (known: {sorted(self.agent_types)})"
        if now is None:
            return None
        if msg.generation_time is None:
            sent, age = msg.timestamp * self.tick_s, (now - msg.timestamp) * self.tick_s
        else:
            sent, age = msg.generation_time, now * self.tick_s - msg.generation_time
        if self.max_age is not None and age > self.max_age + TIME_TOL_S:
            return f"stale: made at {sent:g} s, now {now * self.tick_s:g} s, older than {self.max_age:g} s"
        if self.max_future is not None and -age > self.max_future + TIME_TOL_S:
            return (f"from the future: made at {sent:g} s, now {now * self.tick_s:g} s, more than "
                    f"{self.max_future:g} s ahead")
        return None


@dataclass(frozen=True)
class ReceiverContext:
    """What one receiver knows in one frame besides the packets. now: its current time (timestamp
    units); own_id: its own agent id (a message claiming it is refused); registry: the alliance's
    members it expects, ``{sender_id: agent_type}`` (a sender not in it, or declaring another
    type, is refused); replay: its :class:`~.signing.ReplayWindow`, kept across frames (a
    sequence it accepted, or one older than the window, is refused); None = not checked."""

    now: Optional[float] = None
    own_id: Optional[int] = None
    registry: Optional[Mapping[int, str]] = None
    replay: Optional[ReplayWindow] = None


@dataclass
class Receipt:
    """What :func:`receive_frame` did with one frame's packets: accepted (index, message) in
    arrival order, rejected (index, reason)."""

    accepted: List[Tuple[int, Message]] = field(default_factory=list)
    rejected: List[Tuple[int, str]] = field(default_factory=list)


@dataclass
class Delivery:
    """What :func:`transmit` did. arrived: the usable messages (payloads as received);
    bytes_sent: (n,) encoded bytes of each sent message (0 in memory; the signature included);
    lost: indices of sent messages the channel lost; rejected: (index, reason) of those the
    receiver refused (index -1: a packet a live channel delivered, which may have been sent in an
    earlier frame)."""

    sent: Messages
    arrived: Messages
    bytes_sent: List[int]
    lost: List[int] = field(default_factory=list)
    rejected: List[Tuple[int, str]] = field(default_factory=list)

    def bytes_by_source_row(self) -> Dict[int, int]:
        return {r: b for r, b in zip(self.sent.source_row, self.bytes_sent)}


_RULE_END = re.compile(r"\s[\d'\"(\[+-]|,")


def rule_of(reason: str) -> str:
    """The rule a rejection reason names, for counting: its text before the first ':', cut before
    the first number, quoted value or parenthesis ("stale", "payload shape", "unknown agent type")."""
    return _RULE_END.split(reason.split(":", 1)[0], 1)[0].strip()


def _packet_bytes_reason(packet: bytes, accept: Acceptance) -> Optional[str]:
    if accept.max_bytes is not None and len(packet) > accept.max_bytes:
        return f"message too large: {len(packet)} bytes, this receiver accepts at most {accept.max_bytes}"
    return None


def receive_packet(packet: bytes, accept: Acceptance, now: Optional[float] = None) -> Union[Message, str]:
    """The receiver's side of one packet: the decoded :class:`Message` when it is usable, else the
    reason it was rejected (decode checks under ``accept.limits()``, then ``accept.check``)."""
    reason = _packet_bytes_reason(packet, accept)
    if reason is not None:
        return reason
    try:
        msg = decode(packet, accept.limits())
    except MessageError as exc:
        return exc.reason
    reason = accept.check(msg, now)
    return msg if reason is None else reason


def _rows(msg: Message) -> int:
    return int(msg.payload.shape[1]) if msg.kind in ("boxes", "points") else 0


def receive_frame(packets: Sequence[bytes], accept: Acceptance, context: Optional[ReceiverContext] = None,
                  budget: Optional[FrameBudget] = None) -> Receipt:
    """One receiver's packets of one frame, in arrival order: each is checked alone
    (:func:`receive_packet`), then against the frame: not from the receiver's own id, a member of
    ``context.registry`` declaring its registered type, a sequence new to ``context.replay`` (version
    3), the first accepted message of its sender (later ones are duplicates), and within ``budget`` (messages, bytes, boxes, points; the
    excess is rejected). Each rejection carries a reason; :func:`rule_of` names its rule."""
    context = context or ReceiverContext()
    out = Receipt()
    senders: Set[int] = set()
    used_bytes = used_boxes = used_points = 0
    for i, packet in enumerate(packets):
        got = receive_packet(packet, accept, context.now)
        if isinstance(got, str):
            out.rejected.append((i, got))
            continue
        reason = None
        sid = int(got.sender_id)
        if context.own_id is not None and sid == int(context.own_id):
            reason = f"own id: message claims the receiver's own id {sid}"
        elif context.registry is not None and sid not in context.registry:
            reason = f"unregistered sender: id {sid} is not a member of the alliance"
        elif context.registry is not None and context.registry[sid] != got.agent_type:
            reason = (f"type mismatch: sender {sid} declares type {got.agent_type!r}, the alliance registers it "
                      f"as {context.registry[sid]!r}")
        elif context.replay is not None and got.sequence is not None and (
                replayed := context.replay.refusal(sid, got.sequence)) is not None:
            reason = replayed
        elif sid in senders:
            reason = f"duplicate sender: a message from sender {sid} was already accepted this frame"
        elif budget is not None:
            rows = _rows(got)
            boxes = rows if got.kind == "boxes" else 0
            points = rows if got.kind == "points" else 0
            if len(out.accepted) + 1 > budget.max_messages:
                reason = f"frame budget: more than {budget.max_messages} messages this frame"
            elif used_bytes + len(packet) > budget.max_bytes:
                reason = f"frame budget: more than {budget.max_bytes} bytes this frame"
            elif used_boxes + boxes > budget.max_boxes:
                reason = f"frame budget: more than {budget.max_boxes} boxes this frame"
            elif used_points + points > budget.max_points:
                reason = f"frame budget: more than {budget.max_points} points this frame"
            else:
                used_bytes, used_boxes, used_points = used_bytes + len(packet), used_boxes + boxes, used_points + points
        if reason is not None:
            out.rejected.append((i, reason))
            continue
        senders.add(sid)
        if context.replay is not None and got.sequence is not None:
            context.replay.accept(sid, got.sequence)
        out.accepted.append((i, got))
    return out


def from_wire(received: Sequence[Message], receiver: Sequence[int], source_row: Sequence[int]) -> Messages:
    """Decoded messages -> :class:`Messages` (payloads, poses and ids as they arrived)."""
    if not received:
        return Messages.empty("bev")
    return Messages(received[0].kind, list(receiver), list(source_row), [m.sender_id for m in received],
                    [m.agent_type for m in received], [m.timestamp for m in received],
                    torch.from_numpy(np.stack([m.pose for m in received])), [m.payload for m in received])


def transmit(messages: Messages, *, wire: bool, dtype: str = "float32",
             channel: Union[ChannelConfig, ChannelEffects, None] = None,
             keys: Optional[Callable[[int], Sequence[int]]] = None, accept: Optional[Acceptance] = None,
             train_drop: float = 0.0, contexts: Optional[Sequence[ReceiverContext]] = None,
             budget: Optional[FrameBudget] = None, signers: Optional[SenderKeys] = None) -> Delivery:
    """Move ``messages`` to their receivers (module docstring).

    wire: False -> in memory (``train_drop``: probability of losing each message, torch RNG);
    True -> encode / channel / decode; signed with ``accept.key`` (the alliance key) when set, or by
    each sender's own key in ``signers`` (generation time: timestamp x ``accept.tick_s``; a sender
    without a key there sends unsigned).
    channel: a :class:`ChannelConfig` (each packet's draw keyed by ``keys(receiver)``, default the
    receiver index; what is not lost arrives now) or a live :class:`ChannelEffects` (one receiver,
    index 0: its draws keyed by its tick, delivered ``latency_ticks`` later; what arrives this frame
    may have been sent earlier, so its entries in ``arrived`` have ``source_row`` -1, rejections are
    indexed -1 and its losses are counted by the channel, not in ``lost``). contexts: per receiver,
    its :class:`ReceiverContext` (now, own id, registry; default: none of them checked). budget:
    each receiver's per-frame budget (:func:`receive_frame`). signers: the senders' Ed25519 keys."""
    n = len(messages)
    if not wire:
        if train_drop > 0 and n:
            keep = (torch.rand(n) >= train_drop).nonzero().flatten().tolist()
            lost = sorted(set(range(n)) - set(keep))
            return Delivery(messages, messages.select(keep), [0] * n, lost=lost)
        return Delivery(messages, messages, [0] * n)
    accept = accept or Acceptance(kind=messages.kind)
    packets = [encode(m, dtype=dtype, key=accept.key, signer=signers.get(m.sender_id) if signers else None,
                      generation_time=m.timestamp * accept.tick_s) for m in map(messages.to_wire, range(n))]
    nbytes = [len(p) for p in packets]
    if isinstance(channel, ChannelEffects):
        if any(r != 0 for r in messages.receiver):
            raise ValueError(f"a live channel carries messages to one receiver (index 0), these go to "
                             f"{sorted(set(messages.receiver))}")
        delivered = {0: [(-1, p) for p in channel.step(packets)]}
        lost: List[int] = []
    else:
        delivered, lost = _through(packets, messages.receiver, channel or ChannelConfig(), keys,
                                   signers if signers is not None else accept.key)
    rejected: List[Tuple[int, str]] = []
    kept: List[Tuple[int, int, Message]] = []  # (message index or -1, receiver, message)
    for r, items in delivered.items():
        context = contexts[r] if contexts is not None else ReceiverContext()
        receipt = receive_frame([p for _, p in items], accept, context, budget)
        for k, reason in receipt.rejected:
            i = items[k][0]
            who = (f"agent {messages.sender_id[i]} ({messages.agent_type[i]})" if i >= 0
                   else "a packet the live channel delivered")
            log.warning("message from %s rejected: %s", who, reason)
            rejected.append((i, reason))
        kept += [(items[k][0], r, msg) for k, msg in receipt.accepted]
    kept.sort(key=lambda t: t[0])
    rejected.sort(key=lambda t: t[0])
    if not kept:
        return Delivery(messages, Messages.empty(messages.kind), nbytes, lost=lost, rejected=rejected)
    arrived = from_wire([m for _, _, m in kept], [r for _, r, _ in kept],
                        [messages.source_row[i] if i >= 0 else -1 for i, _, _ in kept])
    if n:  # payloads on the senders' device (decoding makes CPU tensors)
        device = messages.payload[0].device
        arrived.payload = [p.to(device) for p in arrived.payload]
    return Delivery(messages, arrived, nbytes, lost=lost, rejected=rejected)


def _through(packets: Sequence[bytes], receivers: Sequence[int], channel: ChannelConfig,
             keys: Optional[Callable[[int], Sequence[int]]], signing_key: Union[bytes, SenderKeys, None]
             ) -> Tuple[Dict[int, List[Tuple[int, bytes]]], List[int]]:
    """Each packet through the stateless ``channel`` -> ({receiver: [(message index, packet)] in send
    order}, indices of the lost)."""
    delivered: Dict[int, List[Tuple[int, bytes]]] = {}
    lost = []
    for i, (packet, r) in enumerate(zip(packets, receivers)):
        out = apply_channel(packet, channel, tuple(keys(r)) if keys else (r,), signing_key)
        if out is None:
            lost.append(i)
        else:
            delivered.setdefault(r, []).append((i, out))
    return delivered, lost
