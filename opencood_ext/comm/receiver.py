"""The receiver's bounds and the alliance key: the ``receiver:`` section of an experiment config.

Every number a collaborator's packet declares is bounded before the ego uses it, and what the ego
accepts in one frame is budgeted, so no message can crash or stall the receiver (rejected messages
are logged and counted; the ego keeps detecting from its own sensor)::

    receiver:
      max_age: null            # largest now - timestamp (timestamp units; null = any age)
      max_future: 0.0          # largest timestamp - now (null = any)
      max_translation_m: 1.0e5 # largest |x|, |y|, |z| of a sender's pose T_world_from_sender
      max_abs: 1.0e6           # largest |value| of a float payload
      max_box_size_m: 50.0     # l, w, h of a received box in (0, max_box_size_m]
      max_boxes: 1000          # boxes in one message (late fusion)
      max_points: 2097152      # points in one message (early fusion)
      max_message_bytes: null  # bytes of one packet (null = bounded by the payload limits above)
      max_messages_per_frame: 64
      max_boxes_per_frame: 4000
      max_points_per_frame: 8388608
      max_bytes_per_frame: 1073741824
      key_env: null            # name of an environment variable holding the alliance's HMAC key
      key_file: null           # or a file holding it

Timestamps: a dataset's messages carry its frame counter (OPV2V's ``000068`` -> 68.0), the live
demo's the tick's frame counter; both senders and receivers read the same clock, so no message is
from the future (``max_future`` 0). Latency experiments deliver deliberately old messages, which is
why ``max_age`` has no default bound.

The key is named by reference only (an environment variable or a file), so it never reaches a config
dump or a results file. With a key, every message is signed (HMAC-SHA256, :mod:`.wire`) and only
messages signed with it are accepted.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

MIN_KEY_BYTES = 16


@dataclass(frozen=True)
class FrameBudget:
    """What one receiver accepts in one frame, over all its messages (the excess is rejected)."""

    max_messages: int = 64
    max_bytes: int = 1 << 30
    max_boxes: int = 4000
    max_points: int = 1 << 23


@dataclass
class ReceiverConfig:
    """The ``receiver:`` section (module docstring). Times in timestamp units, lengths in metres."""

    max_age: Optional[float] = None
    max_future: Optional[float] = 0.0
    max_translation_m: float = 1e5
    max_abs: Optional[float] = 1e6
    max_box_size_m: float = 50.0
    max_boxes: int = 1000
    max_points: int = 1 << 21
    max_message_bytes: Optional[int] = None
    max_messages_per_frame: int = 64
    max_boxes_per_frame: int = 4000
    max_points_per_frame: int = 1 << 23
    max_bytes_per_frame: int = 1 << 30
    key_env: Optional[str] = None
    key_file: Optional[str] = None

    def __post_init__(self):
        for name in ("max_age", "max_future", "max_abs"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise ValueError(f"receiver.{name} must be a finite number >= 0 or null, got {v!r}")
        for name in ("max_translation_m", "max_box_size_m"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"receiver.{name} must be a finite number > 0, got {v!r}")
        for name in ("max_boxes", "max_points", "max_messages_per_frame", "max_boxes_per_frame",
                     "max_points_per_frame", "max_bytes_per_frame", "max_message_bytes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"receiver.{name} must be an integer >= 1, got {v!r}")
        if self.key_env is not None and self.key_file is not None:
            raise ValueError("receiver: set key_env or key_file, not both")
        for name in ("key_env", "key_file"):
            if getattr(self, name) == "":
                raise ValueError(f"receiver.{name} must be null or a non-empty name")

    @property
    def authenticated(self) -> bool:
        """Whether messages are signed and verified (a key is configured)."""
        return self.key_env is not None or self.key_file is not None

    def budget(self) -> FrameBudget:
        return FrameBudget(self.max_messages_per_frame, self.max_bytes_per_frame, self.max_boxes_per_frame,
                           self.max_points_per_frame)

    def load_key(self) -> Optional[bytes]:
        """The alliance's HMAC key (bytes, surrounding whitespace stripped), or None without one.
        Raises ValueError (one line naming the variable or file, never the key) when it is missing
        or shorter than MIN_KEY_BYTES."""
        if self.key_env is not None:
            where = f"receiver.key_env: environment variable {self.key_env}"
            value = os.environ.get(self.key_env)
            if value is None:
                raise ValueError(f"{where} is not set (it must hold the alliance's HMAC key)")
            key = value.strip().encode("utf-8")
        elif self.key_file is not None:
            where = f"receiver.key_file: {self.key_file}"
            try:
                key = Path(self.key_file).read_bytes().strip()
            except OSError as exc:
                raise ValueError(f"{where}: cannot read the alliance's HMAC key ({exc.strerror})") from None
        else:
            return None
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"{where} holds a {len(key)}-byte key; the alliance's HMAC-SHA256 key needs at "
                             f"least {MIN_KEY_BYTES} bytes")
        return key


__all__ = ["ReceiverConfig", "FrameBudget", "MIN_KEY_BYTES"]
