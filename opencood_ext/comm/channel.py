"""An imperfect channel for encoded messages (:mod:`opencood_ext.comm.wire`):
pose noise, message loss and latency.

Every random draw is a pure function of ``(seed, key, sender_id)``, where the
key names the moment (a dataset frame index, a live tick). So every fusion
method evaluated on the same frames with the same seed meets exactly the same
noise and the same lost messages, whatever else it sends, and a rerun
reproduces them.

* Pose noise (CoAlign / HEAL protocol): world-frame x, y of the transmitted
  pose ~ N(0, pose_noise_m), its yaw (about the world z axis) ~
  N(0, pose_noise_deg). Only the header changes: the payload was computed in
  the sender's true frame, the receiver places it with the noisy pose.
* Loss: each message is lost with probability ``drop``.
* Latency: on datasets a collaborator's message comes from an earlier frame
  (:class:`~opencood_ext.data.dataset.CooperativeDataset`, ``latency_frames``);
  live, :class:`ChannelEffects` delivers each packet ``latency_ticks`` later.

:func:`apply_channel` acts on one packet; :class:`ChannelEffects` is the live
demo's stateful channel (queue + tick counter) built on it. Both are channels of
:func:`~opencood_ext.comm.messages.transmit`, the one transport of evaluation and the demo.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Deque, List, Optional, Sequence, Tuple, Union

import numpy as np

from .signing import SenderKeys
from .wire import MessageError, _unpack_header, _with_pose


@dataclass(frozen=True)
class ChannelConfig:
    """pose_noise_m: std of x and y noise (m); pose_noise_deg: std of yaw noise (deg);
    drop: probability that a message is lost; seed: of every draw (module docstring)."""

    pose_noise_m: float = 0.0
    pose_noise_deg: float = 0.0
    drop: float = 0.0
    seed: int = 0

    def __post_init__(self):
        for name in ("pose_noise_m", "pose_noise_deg", "drop"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"channel {name} must be a finite number >= 0, got {v!r}")
        if self.drop > 1.0:
            raise ValueError(f"channel drop must be a probability in [0, 1], got {self.drop}")

    @property
    def perfect(self) -> bool:
        return self.pose_noise_m == 0 and self.pose_noise_deg == 0 and self.drop == 0

    def describe(self) -> str:
        if self.perfect:
            return "perfect channel"
        return (f"pose noise {self.pose_noise_m:g} m / {self.pose_noise_deg:g} deg, drop {self.drop:g}, "
                f"seed {self.seed}")


def parse_pose_noise(text: Optional[str]) -> Tuple[float, float]:
    """"STD_M,STD_DEG" (e.g. "0.2,0.2") -> (0.2, 0.2); None or "" -> (0, 0)."""
    if not text:
        return 0.0, 0.0
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 2 or not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"pose noise must be STD_M,STD_DEG with two numbers >= 0, got {text!r}")
    return values[0], values[1]


@dataclass(frozen=True)
class Draw:
    """One message's fate: lost, or delivered with pose noise (dx, dy metres, dyaw radians)."""

    lost: bool
    dx: float = 0.0
    dy: float = 0.0
    dyaw: float = 0.0


def draw(config: ChannelConfig, key: Sequence[int], sender_id: int) -> Draw:
    """The channel's draw for ``sender_id``'s message at moment ``key`` (ints); see the module docstring."""
    if config.perfect:
        return Draw(False)
    entropy = [int(config.seed) & 0xFFFFFFFF, *(int(k) & 0xFFFFFFFF for k in key), int(sender_id) & 0xFFFFFFFF]
    rng = np.random.default_rng(np.random.SeedSequence(entropy))
    u, dx, dy, dyaw = rng.random(), *rng.normal(0.0, 1.0, size=3)
    return Draw(lost=bool(u < config.drop), dx=float(dx * config.pose_noise_m),
                dy=float(dy * config.pose_noise_m), dyaw=math.radians(float(dyaw * config.pose_noise_deg)))


def noisy_pose(pose: np.ndarray, d: Draw) -> np.ndarray:
    """``pose`` (4, 4) T_world_from_sender with d's world x, y offset and yaw about world z."""
    if d.dx == 0 and d.dy == 0 and d.dyaw == 0:
        return pose
    c, s = math.cos(d.dyaw), math.sin(d.dyaw)
    out = np.array(pose, dtype=np.float64, copy=True)
    out[:3, :3] = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]) @ out[:3, :3]
    out[0, 3] += d.dx
    out[1, 3] += d.dy
    return out


def apply_channel(data: bytes, config: ChannelConfig, key: Sequence[int],
                  signing_key: Union[bytes, SenderKeys, None] = None) -> Optional[bytes]:
    """One encoded packet through the channel: None when lost, else the packet with its header pose
    perturbed. A packet whose header cannot be parsed passes through untouched (the receiver
    rejects it). Pose noise stands for the sender's own localisation error, so it is part of what
    the sender signs: a signed packet is signed again with ``signing_key`` (the alliance key, or the
    senders' own keys, :class:`~.signing.SenderKeys`, same sequence number); without it the
    perturbed packet keeps its old signature, which no longer matches."""
    if config.perfect:
        return data
    try:
        f = _unpack_header(data)
    except MessageError:
        return data
    d = draw(config, key, f[4])
    if d.lost:
        return None
    pose = np.array(f[7:23], dtype=np.float64).reshape(4, 4)
    noisy = noisy_pose(pose, d)
    return data if noisy is pose else _with_pose(data, noisy, signing_key)


class ChannelEffects:
    """The live demo's channel: :func:`apply_channel` at each tick (the tick is the draw key),
    then delivery ``latency_ticks`` ticks later, in send order. ``signing_key``: the alliance key or
    the senders' keys signed packets are signed again with after pose noise (set by the live loop;
    None = unsigned)."""

    def __init__(self, pose_noise_std_m: float = 0.0, pose_noise_std_deg: float = 0.0,
                 drop_prob: float = 0.0, latency_ticks: int = 0, seed: Optional[int] = None):
        if latency_ticks < 0:
            raise ValueError(f"ChannelEffects latency_ticks must be >= 0, got {latency_ticks}")
        self.config = ChannelConfig(pose_noise_m=pose_noise_std_m, pose_noise_deg=pose_noise_std_deg,
                                    drop=drop_prob, seed=0 if seed is None else int(seed))
        self.latency_ticks = int(latency_ticks)
        self._queue: Deque[Tuple[int, bytes]] = deque()
        self._tick = 0
        self.sent = self.dropped = self.delivered = 0
        self.signing_key: Union[bytes, SenderKeys, None] = None

    def step(self, packets: Sequence[bytes]) -> List[bytes]:
        """Send this tick's packets; return those delivered this tick (in send order)."""
        for data in packets:
            self.sent += 1
            out = apply_channel(bytes(data), self.config, (self._tick,), self.signing_key)
            if out is None:
                self.dropped += 1
                continue
            self._queue.append((self._tick + self.latency_ticks, out))
        out = []
        while self._queue and self._queue[0][0] <= self._tick:
            out.append(self._queue.popleft()[1])
        self.delivered += len(out)
        self._tick += 1
        return out

    def pending(self) -> int:
        """Packets in flight (sent, not yet delivered)."""
        return len(self._queue)
