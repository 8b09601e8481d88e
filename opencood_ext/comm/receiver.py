"""The receiver's bounds and the message keys: the ``receiver:`` section of an experiment config.

Every number a collaborator's packet declares is bounded before the ego uses it, and what the ego
accepts in one frame is budgeted, so no message can crash or stall the receiver (rejected messages
are logged and counted; the ego keeps detecting from its own sensor)::

    receiver:
      tick_s: 0.05             # seconds per timestamp unit of the data's clock (module docstring)
      max_age: null            # largest age of a message, seconds of the sender's clock (null = any)
      max_future: 0.0          # largest lead of a message over the receiver's clock, seconds (null = any)
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
      public_keys: null        # or per-sender Ed25519: the alliance's key registry (YAML / JSON file)
      private_keys: null       # with it: a folder of this process's senders' keys, <sender id>.pem
      replay_window: 64        # sequences remembered per sender (Ed25519 mode)

Timestamps count ticks of the data's clock, ``tick_s`` seconds each: a dataset's messages carry its
frame counter (OPV2V's ``000068`` -> 68.0: the OPV2V family, the built-in simulator and CARLA all
count 0.05 s ticks, a frame every 2 ticks; DAIR-V2X counts frame ids, so set its ``tick_s``), the live
demo the world's tick counter (the demo sets ``tick_s`` to the world's tick length). Ages are in
seconds: ``max_age`` compares the receiver's time with the message's generation time (version 3),
or its timestamp times ``tick_s``. Senders and receivers read the same clock here, so no message is
from the future (``max_future`` 0). Latency experiments deliver deliberately old messages, which is
why ``max_age`` has no default bound.

Keys are named by reference only (an environment variable, a file, a folder), so they never reach a
config dump or a results file. With ``key_env`` / ``key_file`` every message is signed with the
alliance's shared HMAC key (version 2, :mod:`.wire`); with ``public_keys`` and ``private_keys``
each sender signs with its own Ed25519 key, a sequence number and its generation time (version 3,
:mod:`.signing`), and each receiver refuses a replayed sequence. A sender with no key in the folder
sends unsigned, and its messages are refused (``unsigned``) and counted.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Union

from ..config import FieldError
from .signing import KeyRegistry, ReplayWindow, SenderKeys

MIN_KEY_BYTES = 16


@dataclass(frozen=True)
class FrameBudget:
    """What one receiver accepts in one frame, over all its messages (the excess is rejected)."""

    max_messages: int = 64
    max_bytes: int = 1 << 30
    max_boxes: int = 4000
    max_points: int = 1 << 23


@dataclass
class Security:
    """The keys a :class:`ReceiverConfig` names, loaded: the alliance's HMAC key (``hmac_key``), or
    the senders' Ed25519 keys (``signers``) with the alliance registry and each receiver's replay
    window (by its own id). Its repr names no key."""

    hmac_key: Optional[bytes] = field(default=None, repr=False)
    signers: Optional[SenderKeys] = None
    registry: Optional[KeyRegistry] = None
    replay_window: int = 64
    windows: Dict[int, ReplayWindow] = field(default_factory=dict, repr=False)

    @property
    def signed(self) -> bool:
        return self.hmac_key is not None or self.registry is not None

    @property
    def mode(self) -> str:
        """"none", "hmac" or "ed25519" (:func:`~.wire.message_nbytes`' ``signed``)."""
        return "ed25519" if self.registry is not None else "hmac" if self.hmac_key is not None else "none"

    @property
    def channel_key(self) -> Union[bytes, SenderKeys, None]:
        """What a channel signs a changed packet again with (:func:`~.channel.apply_channel`)."""
        return self.signers if self.registry is not None else self.hmac_key

    def window(self, own_id: int) -> Optional[ReplayWindow]:
        """Receiver ``own_id``'s replay window (kept across frames), None without Ed25519 keys."""
        if self.registry is None:
            return None
        return self.windows.setdefault(int(own_id), ReplayWindow(self.replay_window))


@dataclass
class ReceiverConfig:
    """The ``receiver:`` section (module docstring). Times in seconds (``tick_s``: seconds per
    timestamp unit), lengths in metres."""

    tick_s: float = 0.05
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
    public_keys: Optional[str] = None
    private_keys: Optional[str] = None
    replay_window: int = 64

    def __post_init__(self):
        for name in ("max_age", "max_future", "max_abs"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise FieldError(f"receiver.{name} must be a finite number >= 0 or null, got {v!r}", name)
        for name in ("max_translation_m", "max_box_size_m", "tick_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise FieldError(f"receiver.{name} must be a finite number > 0, got {v!r}", name)
        for name in ("max_boxes", "max_points", "max_messages_per_frame", "max_boxes_per_frame",
                     "max_points_per_frame", "max_bytes_per_frame", "max_message_bytes", "replay_window"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise FieldError(f"receiver.{name} must be an integer >= 1, got {v!r}", name)
        if self.key_env is not None and self.key_file is not None:
            raise FieldError("receiver: set key_env or key_file, not both", "key_file", "key_env")
        for name in ("key_env", "key_file", "public_keys", "private_keys"):
            if getattr(self, name) == "":
                raise FieldError(f"receiver.{name} must be null or a non-empty name", name)
        if (self.public_keys is None) != (self.private_keys is None):
            raise FieldError("receiver: per-sender signing needs both public_keys (the alliance registry) and "
                             "private_keys (the folder of the senders' keys)",
                             "public_keys" if self.public_keys is not None else "private_keys")
        if self.public_keys is not None and (self.key_env is not None or self.key_file is not None):
            raise FieldError("receiver: set key_env / key_file (alliance HMAC key) or public_keys / private_keys "
                             "(per-sender Ed25519 keys), not both", "key_env" if self.key_env is not None else "key_file",
                             "public_keys")

    @property
    def authenticated(self) -> bool:
        """Whether messages are signed and verified (a key or a key registry is configured)."""
        return self.key_env is not None or self.key_file is not None or self.public_keys is not None

    def load_security(self) -> Security:
        """The keys this section names (:class:`Security`); ValueError, one line naming the field and
        the file, folder or variable (never a key), when one cannot be loaded."""
        if self.public_keys is None:
            return Security(hmac_key=self.load_key())
        try:
            registry = KeyRegistry.load(self.public_keys)
        except ValueError as exc:
            raise ValueError(f"receiver.public_keys: {exc}") from None
        try:
            signers = SenderKeys.load(self.private_keys)
        except ValueError as exc:
            raise ValueError(f"receiver.private_keys: {exc}") from None
        return Security(signers=signers, registry=registry, replay_window=self.replay_window)

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


__all__ = ["ReceiverConfig", "FrameBudget", "Security", "MIN_KEY_BYTES"]
