"""The message wire format: one agent's payload, who sent it, when and from where.

A message carries one payload in the SENDER's frame plus its sender, time and
pose. What the payload is depends on the fusion method that sent it
(``kind``)::

    kind     code shape      values
    bev         0 (m, H, W)  a BEV map: a GenComm message, a full feature, a protocol feature
    boxes       1 (1, P, 9)  late fusion: x, y, z, l, w, h, yaw, score, class per detected box (P >= 0)
    points      2 (1, P, 4)  early fusion: x, y, z, intensity per LiDAR point (P >= 0)
    codes       3 (S, H, W)  CodeFilling: codebook indices per cell and segment (uint8 / uint16)

On the wire (little-endian)::

    offset size field
         0    4 magic            b"GCMM"
         4    2 version          uint16: 1, 2 or 3 (the trailer below)
         6    1 dtype code       uint8: 1 float32, 2 float16, 3 int8, 4 uint8, 5 uint16
         7    1 kind code        uint8 (table above); 0 in every packet written before kinds existed
         8    8 sender_id        int64
        16   16 agent_type       ASCII, NUL-padded (at most 16 bytes, no NUL inside)
        32    8 timestamp        float64, the data's time in its source's ticks (receiver.tick_s each)
        40  128 pose             16 float64, T_world_from_sender row-major
       168   12 shape            3 uint32
       180    8 scale            float64, int8 step (value = code * scale); 1.0 otherwise
       188    8 payload length   uint64, bytes
       196    4 payload CRC32    zlib.crc32 of the payload
       200    4 header CRC32     zlib.crc32 of bytes [0, 200)
       204    . payload          prod(shape) values, C order
         .    . trailer          version 1: none; 2: 32-byte HMAC-SHA256 of every byte before it;
                                 3: sequence, generation time, Ed25519 signature (80 bytes)

Version 1 is unsigned; version 2 signed with the alliance's shared HMAC key; version 3 by the
sender's own Ed25519 key, with a sequence number and generation time (:mod:`.signing`). A receiver
with a key (``Limits.key``) or a key registry (``Limits.registry``) refuses other versions and wrong
signatures before it reads the payload; one with neither decodes every version unchecked. The
trailer counts in the message's bytes (:func:`message_nbytes`, ``signed``).

int8 is symmetric quantisation: ``scale = max|x| / 127`` (1.0 for an all-zero
payload), ``code = round(x / scale)`` in [-127, 127], so the error is at most
scale / 2. uint8 / uint16 carry integer codes exactly (kind ``codes`` only).

A receiver bounds what it accepts with :class:`Limits` (largest payload, boxes or
points per message, largest magnitude, largest pose translation, box contents): a
packet larger than the receiver could use is refused from its header, before
anything is allocated, and decoded values must be finite and within the bounds,
so one collaborator cannot poison the receiver's map or make it raise downstream.

Sizes for m = 2, H x W = 100 x 352 (header included): float32 281,804 B,
float16 141,004 B, int8 70,604 B; a C = 128 float32 feature in the same
format is 18,022,604 B. Payload ratios are exactly 64 (float32) and 256
(int8); the 204-byte header makes the whole-message ratios 63.95 and 255.26.
"""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np
import torch

from .signing import (SIGNATURE_SIZE, SIGNED_BYTES, STAMP, TRAILER_SIZE, TRAILERS, VERSION, VERSION_SENDER,
                      VERSION_SIGNED, KeyRegistry, Signer, refusal, signature)

MAGIC = b"GCMM"
HEADER = struct.Struct("<4sHBBq16sd16d3IdQI")
HEADER_SIZE = HEADER.size + 4  # plus the header CRC
DTYPES = {"float32": (1, np.dtype("<f4")), "float16": (2, np.dtype("<f2")), "int8": (3, np.dtype("i1")),
          "uint8": (4, np.dtype("u1")), "uint16": (5, np.dtype("<u2"))}
_BY_CODE = {code: (name, dt) for name, (code, dt) in DTYPES.items()}
FLOAT_DTYPES = ("float32", "float16", "int8")
CODE_DTYPES = ("uint8", "uint16")
# kind -> (code, last dimension of a (1, P, d) payload, or None for an (a, b, c) map)
KINDS = {"bev": (0, None), "boxes": (1, 9), "points": (2, 4), "codes": (3, None)}
_KIND_BY_CODE = {code: name for name, (code, _) in KINDS.items()}
POSE_TOL = 1e-5
MAX_ELEMENTS = 1 << 28


class MessageError(ValueError):
    """A message that cannot be encoded or was rejected on decode; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Message:
    """One agent's message.

    sender_id: agent id; agent_type: e.g. "m1" (ASCII, <= 16 bytes);
    timestamp: seconds; pose: T_world_from_sender (4, 4) float64;
    payload: tensor or array in the sender's frame, shaped by ``kind`` (module
    docstring); decode returns a float32 torch tensor (int64 for ``codes``).
    kind: "bev", "boxes", "points" or "codes". sequence / generation_time (seconds of the
    sender's clock): what a version 3 packet's trailer carried (None for versions 1 and 2).
    """
    sender_id: int
    agent_type: str
    timestamp: float
    pose: np.ndarray
    payload: Union[torch.Tensor, np.ndarray]
    kind: str = "bev"
    sequence: Optional[int] = None
    generation_time: Optional[float] = None


@dataclass(frozen=True)
class BoxRules:
    """What a box in a ``boxes`` payload (x, y, z, l, w, h, yaw, score, class) must be.

    num_classes: labels must round to an integer in [0, num_classes); max_size: l, w, h in metres
    must be > 0 and <= max_size. Scores must lie in [0, 1]. An int8 payload is checked within half
    its quantisation step (scores and labels are then clamped / rounded by the receiver)."""

    num_classes: int
    max_size: float = 50.0


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts.

    max_elements: largest payload (values); max_rows: most boxes / points in a (1, P, d) payload
    (None = only max_elements); max_abs: largest |value| a float payload may carry (after int8
    scaling; None = no bound beyond finiteness); max_translation: largest |t| (metres, each axis)
    of the header's pose T_world_from_sender; boxes: box contents (:class:`BoxRules`, kind
    ``boxes`` only; None = unchecked); key: the alliance's HMAC key: when set, only packets signed
    with it are accepted (never printed); registry: the alliance's Ed25519 public keys: when set,
    only version 3 packets signed by their sender's registered, unrevoked key are accepted."""

    max_elements: int = MAX_ELEMENTS
    max_abs: Optional[float] = None
    max_rows: Optional[int] = None
    max_translation: Optional[float] = None
    boxes: Optional[BoxRules] = None
    key: Optional[bytes] = field(default=None, repr=False, compare=False)
    registry: Optional[KeyRegistry] = field(default=None, compare=False)


def check_pose(pose, what: str = "pose", max_translation: Optional[float] = None) -> np.ndarray:
    """Return ``pose`` as (4, 4) float64 if it is a finite rigid transform (with every translation
    component within +-``max_translation`` when given), else raise MessageError."""
    T = np.asarray(pose, dtype=np.float64)
    if T.shape != (4, 4):
        raise MessageError(f"{what} must be (4, 4), got {T.shape}")
    if not np.isfinite(T).all():
        raise MessageError(f"{what} has non-finite entries")
    if max_translation is not None and float(np.abs(T[:3, 3]).max()) > max_translation:
        raise MessageError(f"{what} translation: {float(np.abs(T[:3, 3]).max()):.3g} m exceeds the receiver's "
                           f"bound {max_translation:g} m")
    if not np.allclose(T[3], [0.0, 0.0, 0.0, 1.0], atol=POSE_TOL, rtol=0):
        raise MessageError(f"{what} last row must be [0, 0, 0, 1], got {T[3].tolist()}")
    R = T[:3, :3]
    if not np.allclose(R.T @ R, np.eye(3), atol=POSE_TOL, rtol=0) or abs(np.linalg.det(R) - 1.0) > POSE_TOL:
        raise MessageError(f"{what} rotation is not orthonormal with det +1")
    return T


def check_shape(kind: str, shape: Sequence[int]) -> None:
    """Raise MessageError unless ``shape`` (3 sizes) is a valid payload shape of ``kind``."""
    if kind not in KINDS:
        raise MessageError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    shape = tuple(int(v) for v in shape)
    if len(shape) != 3:
        raise MessageError(f"a {kind} payload must have 3 dimensions, got {shape}")
    last = KINDS[kind][1]
    if last is None:
        if min(shape) < 1:
            raise MessageError(f"a {kind} payload must be (a, b, c) with every size >= 1, got {shape}")
    elif shape[0] != 1 or shape[2] != last:
        raise MessageError(f"a {kind} payload must be (1, P, {last}), got {shape}")
    if math.prod(shape) > MAX_ELEMENTS:
        raise MessageError(f"payload of {math.prod(shape)} values exceeds {MAX_ELEMENTS}")


def _payload_array(payload, kind: str) -> np.ndarray:
    if torch.is_tensor(payload):
        payload = payload.detach().cpu()
        payload = payload.numpy() if kind == "codes" else payload.to(torch.float32).numpy()
    arr = np.asarray(payload) if kind == "codes" else np.asarray(payload, dtype=np.float32)
    if kind in ("boxes", "points") and arr.ndim == 2:
        arr = arr[None]
    check_shape(kind, arr.shape)
    if kind == "codes":
        if arr.dtype.kind not in "iu":
            raise MessageError(f"a codes payload must hold integers, got {arr.dtype}")
    elif not np.isfinite(arr).all():
        raise MessageError("payload has non-finite values")
    return arr


def encode(msg: Message, dtype: str = "float32", key: Optional[bytes] = None, signer: Optional[Signer] = None,
           generation_time: Optional[float] = None) -> bytes:
    """Serialise ``msg``; dtype float32 / float16 / int8 (uint8 / uint16 for codes); ``key``: the
    alliance's HMAC key, to sign it (version 2); ``signer``: the sender's own key, to sign it with
    its next sequence number and ``generation_time`` (seconds of its clock; default the message's
    timestamp) (version 3); neither: unsigned, version 1. Raises MessageError on bad fields."""
    if key is not None and signer is not None:
        raise MessageError("sign with the alliance key or with the sender's own key, not both")
    if signer is not None and int(signer.sender_id) != int(msg.sender_id):
        raise MessageError(f"signer: sender {signer.sender_id}'s key cannot sign a message from sender {msg.sender_id}")
    if dtype not in DTYPES:
        raise MessageError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    kind = msg.kind
    arr = _payload_array(msg.payload, kind)
    if (kind == "codes") != (dtype in CODE_DTYPES):
        raise MessageError(f"a {kind} payload cannot be sent as {dtype} "
                           f"({'codes need' if kind == 'codes' else 'only codes use'} {list(CODE_DTYPES)})")
    code, wire = DTYPES[dtype]
    pose = check_pose(msg.pose)
    try:
        type_bytes = msg.agent_type.encode("ascii")
    except UnicodeEncodeError as err:
        raise MessageError(f"agent_type must be ASCII, got {msg.agent_type!r}") from err
    if len(type_bytes) > 16 or b"\0" in type_bytes:
        raise MessageError(f"agent_type must be at most 16 ASCII bytes without NUL, got {msg.agent_type!r}")
    if not math.isfinite(float(msg.timestamp)):
        raise MessageError(f"timestamp must be finite, got {msg.timestamp}")
    scale = 1.0
    if dtype in CODE_DTYPES:
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) > np.iinfo(wire).max):
            raise MessageError(f"codes must lie in [0, {np.iinfo(wire).max}] for {dtype}")
        data = arr.astype(wire)
    elif dtype == "int8":
        peak = float(np.abs(arr).max()) if arr.size else 0.0
        scale = peak / 127.0 if peak > 0 else 1.0
        data = np.clip(np.rint(arr / scale), -127, 127).astype(wire)
    else:
        if arr.size and float(np.abs(arr).max()) > float(np.finfo(wire).max):
            raise MessageError(f"payload exceeds the {dtype} range (|x| <= {np.finfo(wire).max})")
        data = arr.astype(wire)
    body = data.tobytes(order="C")
    version = VERSION_SENDER if signer is not None else VERSION if key is None else VERSION_SIGNED
    head = HEADER.pack(MAGIC, version, code, KINDS[kind][0], int(msg.sender_id), type_bytes, float(msg.timestamp),
                       *pose.reshape(-1), *arr.shape, scale, len(body), zlib.crc32(body))
    packet = head + struct.pack("<I", zlib.crc32(head)) + body
    if signer is not None:
        when = float(msg.timestamp if generation_time is None else generation_time)
        if not math.isfinite(when):
            raise MessageError(f"generation time must be finite, got {when}")
        return packet + signer.seal(packet, when)
    return packet if key is None else packet + signature(packet, key)


def _unpack_header(data: bytes) -> tuple:
    if len(data) < HEADER_SIZE:
        raise MessageError(f"truncated: {len(data)} bytes, header needs {HEADER_SIZE}")
    head = bytes(data[:HEADER.size])
    fields = HEADER.unpack(head)
    if fields[0] != MAGIC:
        raise MessageError(f"bad magic: {fields[0]!r}, expected {MAGIC!r}")
    if fields[1] not in TRAILERS:
        raise MessageError(f"unsupported version: {fields[1]}, expected one of {sorted(TRAILERS)}")
    (head_crc,) = struct.unpack_from("<I", data, HEADER.size)
    if zlib.crc32(head) != head_crc:
        raise MessageError("header CRC mismatch (corrupted header)")
    return fields


def check_boxes(values: np.ndarray, rules: BoxRules, tol: float = 0.0) -> np.ndarray:
    """A decoded (1, P, 9) boxes payload checked against ``rules`` (raises MessageError naming the
    first failed check and how many boxes fail it); returns it with scores clamped into [0, 1]
    and labels rounded. ``tol``: the payload's quantisation error (half the int8 step; 0 otherwise)."""
    b = values.reshape(-1, 9)
    if not len(b):
        return values
    size, score, label = b[:, 3:6], b[:, 7], b[:, 8]
    checks = (
        ("box size", (size <= 0).any(1), "l, w, h must be > 0"),
        ("box size", (size > rules.max_size + tol).any(1), f"l, w, h must be <= {rules.max_size:g} m"),
        ("box score", (score < -tol) | (score > 1 + tol), "scores must lie in [0, 1]"),
        ("box label", np.abs(label - np.rint(label)) > max(tol, 1e-3), "labels must be integers"),
        ("box label", (np.rint(label) < 0) | (np.rint(label) >= rules.num_classes),
         f"labels must be class indices in [0, {rules.num_classes})"),
    )
    for name, bad, rule in checks:
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise MessageError(f"{name}: {int(bad.sum())} of {len(b)} boxes break the rule that {rule} "
                               f"(first: box {first}, {b[first].tolist()})")
    out = b.copy()
    out[:, 7] = np.clip(score, 0.0, 1.0)
    out[:, 8] = np.rint(label)
    return out.reshape(values.shape)


def decode(data: bytes, limits: Optional[Limits] = None) -> Message:
    """Parse and validate one message; raises MessageError naming the failed check.

    ``limits``: what the receiver accepts. In order: the header (magic, version, CRC); the payload
    size (values, boxes / points) from the header, before anything is allocated; the signature
    (with ``limits.key``), before the payload is read; the payload CRC; the pose (finite, rigid,
    translation within ``max_translation``); the values after decoding (finite, within
    ``max_abs``; box contents under ``limits.boxes``)."""
    limits = limits or Limits()
    f = _unpack_header(data)
    version = f[1]
    code, kind_code, sender_id, type_bytes, timestamp = f[2], f[3], f[4], f[5], f[6]
    pose = np.array(f[7:23], dtype=np.float64).reshape(4, 4)
    shape, scale, length, crc = tuple(f[23:26]), f[26], f[27], f[28]
    if code not in _BY_CODE:
        raise MessageError(f"unknown dtype code: {code}")
    if kind_code not in _KIND_BY_CODE:
        raise MessageError(f"unknown payload kind code: {kind_code}")
    name, wire = _BY_CODE[code]
    kind = _KIND_BY_CODE[kind_code]
    check_shape(kind, shape)
    if (kind == "codes") != (name in CODE_DTYPES):
        raise MessageError(f"a {kind} payload cannot be {name}")
    if limits.max_rows is not None and KINDS[kind][1] is not None and shape[1] > limits.max_rows:
        raise MessageError(f"too many {kind}: {shape[1]} in one message, this receiver accepts at most "
                           f"{limits.max_rows}")
    if math.prod(shape) > limits.max_elements:
        raise MessageError(f"payload too large: {math.prod(shape)} values, larger than this receiver accepts "
                           f"({limits.max_elements})")
    if length != math.prod(shape) * wire.itemsize:
        raise MessageError(f"payload length: {length} does not match shape {shape} of {name}")
    total = HEADER_SIZE + length + TRAILERS[version]
    if len(data) != total:
        kind_err = "truncated" if len(data) < total else "trailing bytes"
        note = f" (a version {version} packet ends with a {TRAILERS[version]}-byte trailer)" if TRAILERS[version] else ""
        raise MessageError(f"{kind_err}: {len(data)} bytes, expected {total}{note}")
    reason = refusal(data, version, sender_id, HEADER_SIZE + length, limits.key, limits.registry)
    if reason is not None:
        raise MessageError(reason)
    sequence, generation_time = STAMP.unpack_from(data, HEADER_SIZE + length) if version == VERSION_SENDER else (None, None)
    if generation_time is not None and not math.isfinite(generation_time):
        raise MessageError("generation time is not finite")
    body = memoryview(data)[HEADER_SIZE:HEADER_SIZE + length]
    if zlib.crc32(body) != crc:
        raise MessageError("payload CRC mismatch (corrupted payload)")
    if not math.isfinite(timestamp):
        raise MessageError("timestamp is not finite")
    if name == "int8" and not (math.isfinite(scale) and 0 < scale * 127.0 <= float(np.finfo(np.float32).max)):
        raise MessageError(f"int8 scale: must be > 0 with 127 * scale within float32, got {scale}")
    if b"\0" in type_bytes.rstrip(b"\0"):
        raise MessageError("agent_type has a NUL byte inside")
    try:
        agent_type = type_bytes.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError as err:
        raise MessageError("agent_type is not ASCII") from err
    check_pose(pose, max_translation=limits.max_translation)
    raw = np.frombuffer(body, dtype=wire).reshape(shape)
    if kind == "codes":
        return Message(sender_id, agent_type, timestamp, pose, torch.from_numpy(raw.astype(np.int64)), kind,
                       sequence, generation_time)
    values = raw.astype(np.float32)
    if name == "int8":
        values *= np.float32(scale)
    if values.size:
        if not np.isfinite(values).all():
            raise MessageError("payload has non-finite values")
        if limits.max_abs is not None and float(np.abs(values).max()) > limits.max_abs:
            raise MessageError(f"payload magnitude: {float(np.abs(values).max()):.3g} exceeds the receiver's "
                               f"bound {limits.max_abs:g}")
    if kind == "boxes" and limits.boxes is not None:
        values = check_boxes(values, limits.boxes, tol=scale / 2 if name == "int8" else 0.0)
    return Message(sender_id, agent_type, timestamp, pose, torch.from_numpy(values), kind, sequence, generation_time)


def _with_pose(data: bytes, pose: np.ndarray, key=None) -> bytes:
    """Rewrite the pose of an encoded message (header CRC recomputed); payload untouched. A signed
    packet is signed again: version 2 with ``key`` (the alliance key), version 3 by its sender's
    :class:`~.signing.Signer` in ``key`` (a :class:`~.signing.SenderKeys`; same sequence and time);
    without it, its old signature no longer matches."""
    f = list(_unpack_header(data))
    f[7:23] = [float(v) for v in pose.reshape(-1)]
    head = HEADER.pack(*f)
    end = HEADER_SIZE + f[27]
    packet = head + struct.pack("<I", zlib.crc32(head)) + data[HEADER_SIZE:end]
    trailer = data[end:]
    if f[1] == VERSION_SIGNED and isinstance(key, (bytes, bytearray)):
        return packet + signature(packet, key)
    signer = key.get(f[4]) if f[1] == VERSION_SENDER and hasattr(key, "get") else None
    return packet + (signer.reseal(packet, trailer) if signer is not None else trailer)


def header_pose(data: bytes) -> np.ndarray:
    """The pose field of an encoded message (4, 4) float64 (header checks only)."""
    return np.array(_unpack_header(data)[7:23], dtype=np.float64).reshape(4, 4)


def message_nbytes(message_shape: Sequence[int], dtype: str = "float32", signed: Union[bool, str] = False) -> int:
    """Bytes on the wire for a payload of ``message_shape`` in ``dtype``, the header and the
    trailer of ``signed`` included: False (0 bytes), True or "hmac" (32), "ed25519" (80)."""
    if dtype not in DTYPES:
        raise MessageError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if signed not in SIGNED_BYTES:
        raise MessageError(f"signed must be one of {list(SIGNED_BYTES)}, got {signed!r}")
    return HEADER_SIZE + math.prod(int(s) for s in message_shape) * DTYPES[dtype][1].itemsize + SIGNED_BYTES[signed]


__all__ = ["Message", "MessageError", "Limits", "BoxRules", "encode", "decode", "check_pose",
           "check_shape", "check_boxes", "signature", "header_pose", "message_nbytes", "HEADER_SIZE",
           "SIGNATURE_SIZE", "TRAILER_SIZE", "VERSION", "VERSION_SIGNED", "VERSION_SENDER", "KINDS", "FLOAT_DTYPES", "CODE_DTYPES"]
