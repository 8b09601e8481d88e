"""The message wire format: one agent's payload, who sent it, when and from where.

A message is one agent's (m, H, W) payload (the DME output, in the sender's
frame) plus who sent it, when, and from where. On the wire (little-endian)::

    offset size field
         0    4 magic            b"GCMM"
         4    2 version          uint16 (1)
         6    1 dtype code       uint8: 1 float32, 2 float16, 3 int8
         7    1 reserved         0
         8    8 sender_id        int64
        16   16 agent_type       ASCII, NUL-padded (at most 16 bytes)
        32    8 timestamp        float64, seconds
        40  128 pose             16 float64, T_world_from_sender row-major
       168   12 shape            3 uint32 (m, H, W)
       180    8 scale            float64, int8 step (value = code * scale); 1.0 otherwise
       188    8 payload length   uint64, bytes
       196    4 payload CRC32    zlib.crc32 of the payload
       200    4 header CRC32     zlib.crc32 of bytes [0, 200)
       204    . payload          m*H*W values, C order

int8 is symmetric quantisation: ``scale = max|x| / 127`` (1.0 for an all-zero
payload), ``code = round(x / scale)`` in [-127, 127], so the error is at most
scale / 2.

Sizes for m = 2, H x W = 100 x 352 (header included): float32 281,804 B,
float16 141,004 B, int8 70,604 B; a C = 128 float32 feature in the same
format is 18,022,604 B. Payload ratios are exactly 64 (float32) and 256
(int8); the 204-byte header makes the whole-message ratios 63.95 and 255.26.
"""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from typing import List, Sequence, Tuple, Union

import numpy as np
import torch

MAGIC = b"GCMM"
VERSION = 1
HEADER = struct.Struct("<4sHBBq16sd16d3IdQI")
HEADER_SIZE = HEADER.size + 4  # plus the header CRC
DTYPES = {"float32": (1, np.dtype("<f4")), "float16": (2, np.dtype("<f2")), "int8": (3, np.dtype("i1"))}
_BY_CODE = {code: (name, dt) for name, (code, dt) in DTYPES.items()}
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
    payload: (m, H, W) tensor or array in the sender's BEV frame
    (decode returns a float32 torch tensor).
    """
    sender_id: int
    agent_type: str
    timestamp: float
    pose: np.ndarray
    payload: Union[torch.Tensor, np.ndarray]


def check_pose(pose, what: str = "pose") -> np.ndarray:
    """Return ``pose`` as (4, 4) float64 if it is a finite rigid transform, else raise MessageError."""
    T = np.asarray(pose, dtype=np.float64)
    if T.shape != (4, 4):
        raise MessageError(f"{what} must be (4, 4), got {T.shape}")
    if not np.isfinite(T).all():
        raise MessageError(f"{what} has non-finite entries")
    if not np.allclose(T[3], [0.0, 0.0, 0.0, 1.0], atol=POSE_TOL, rtol=0):
        raise MessageError(f"{what} last row must be [0, 0, 0, 1], got {T[3].tolist()}")
    R = T[:3, :3]
    if not np.allclose(R.T @ R, np.eye(3), atol=POSE_TOL, rtol=0) or abs(np.linalg.det(R) - 1.0) > POSE_TOL:
        raise MessageError(f"{what} rotation is not orthonormal with det +1")
    return T


def _payload_array(payload) -> np.ndarray:
    if torch.is_tensor(payload):
        payload = payload.detach().to("cpu", torch.float32).numpy()
    arr = np.asarray(payload, dtype=np.float32)
    if arr.ndim != 3 or min(arr.shape) < 1:
        raise MessageError(f"payload must be (m, H, W) with every size >= 1, got {arr.shape}")
    if not np.isfinite(arr).all():
        raise MessageError("payload has non-finite values")
    return arr


def encode(msg: Message, dtype: str = "float32") -> bytes:
    """Serialise ``msg``; dtype "float32", "float16" or "int8". Raises MessageError on bad fields."""
    if dtype not in DTYPES:
        raise MessageError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    code, wire = DTYPES[dtype]
    arr = _payload_array(msg.payload)
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
    if dtype == "int8":
        peak = float(np.abs(arr).max())
        scale = peak / 127.0 if peak > 0 else 1.0
        data = np.clip(np.rint(arr / scale), -127, 127).astype(wire)
    else:
        if float(np.abs(arr).max()) > float(np.finfo(wire).max):
            raise MessageError(f"payload exceeds the {dtype} range (|x| <= {np.finfo(wire).max})")
        data = arr.astype(wire)
    body = data.tobytes(order="C")
    head = HEADER.pack(MAGIC, VERSION, code, 0, int(msg.sender_id), type_bytes, float(msg.timestamp),
                       *pose.reshape(-1), *arr.shape, scale, len(body), zlib.crc32(body))
    return head + struct.pack("<I", zlib.crc32(head)) + body


def _unpack_header(data: bytes) -> tuple:
    if len(data) < HEADER_SIZE:
        raise MessageError(f"truncated: {len(data)} bytes, header needs {HEADER_SIZE}")
    head = data[:HEADER.size]
    fields = HEADER.unpack(head)
    if fields[0] != MAGIC:
        raise MessageError(f"bad magic {fields[0]!r}, expected {MAGIC!r}")
    if fields[1] != VERSION:
        raise MessageError(f"unsupported version {fields[1]}, expected {VERSION}")
    (head_crc,) = struct.unpack_from("<I", data, HEADER.size)
    if zlib.crc32(head) != head_crc:
        raise MessageError("header CRC mismatch (corrupted header)")
    return fields


def decode(data: bytes) -> Message:
    """Parse and validate one message; raises MessageError naming the failed check."""
    data = bytes(data)
    f = _unpack_header(data)
    code, sender_id, type_bytes, timestamp = f[2], f[4], f[5], f[6]
    pose = np.array(f[7:23], dtype=np.float64).reshape(4, 4)
    shape, scale, length, crc = tuple(f[23:26]), f[26], f[27], f[28]
    if code not in _BY_CODE:
        raise MessageError(f"unknown dtype code {code}")
    name, wire = _BY_CODE[code]
    if min(shape) < 1 or math.prod(shape) > MAX_ELEMENTS:
        raise MessageError(f"bad payload shape {shape}")
    if length != math.prod(shape) * wire.itemsize:
        raise MessageError(f"payload length {length} does not match shape {shape} of {name}")
    if len(data) != HEADER_SIZE + length:
        kind = "truncated" if len(data) < HEADER_SIZE + length else "trailing bytes"
        raise MessageError(f"{kind}: {len(data)} bytes, expected {HEADER_SIZE + length}")
    body = data[HEADER_SIZE:]
    if zlib.crc32(body) != crc:
        raise MessageError("payload CRC mismatch (corrupted payload)")
    if not math.isfinite(timestamp):
        raise MessageError("timestamp is not finite")
    if name == "int8" and not (math.isfinite(scale) and scale > 0):
        raise MessageError(f"int8 scale must be finite and > 0, got {scale}")
    try:
        agent_type = type_bytes.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError as err:
        raise MessageError("agent_type is not ASCII") from err
    check_pose(pose)
    values = np.frombuffer(body, dtype=wire).reshape(shape).astype(np.float32)
    if name == "int8":
        values = values * np.float32(scale)
    elif not np.isfinite(values).all():
        raise MessageError("payload has non-finite values")
    return Message(sender_id=sender_id, agent_type=agent_type, timestamp=timestamp, pose=pose,
                   payload=torch.from_numpy(values))


def receive_all(packets: Sequence[bytes]) -> Tuple[List[Message], List[Tuple[int, str]]]:
    """Decode each packet; bad ones go to ``rejected`` as (index, reason) and the rest carry on."""
    messages, rejected = [], []
    for i, data in enumerate(packets):
        try:
            messages.append(decode(data))
        except MessageError as err:
            rejected.append((i, err.reason))
    return messages, rejected


def _with_pose(data: bytes, pose: np.ndarray) -> bytes:
    """Rewrite the pose of an encoded message (header CRC recomputed); payload untouched."""
    f = list(_unpack_header(data))
    f[7:23] = [float(v) for v in pose.reshape(-1)]
    head = HEADER.pack(*f)
    return head + struct.pack("<I", zlib.crc32(head)) + data[HEADER_SIZE:]


def message_nbytes(message_shape: Sequence[int], dtype: str = "float32") -> int:
    """Bytes on the wire (header included) for an (m, H, W) payload of ``dtype``."""
    if dtype not in DTYPES:
        raise MessageError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return HEADER_SIZE + math.prod(int(s) for s in message_shape) * DTYPES[dtype][1].itemsize


__all__ = ["Message", "MessageError", "encode", "decode", "receive_all", "check_pose", "message_nbytes",
           "HEADER_SIZE"]
