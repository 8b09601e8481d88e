"""A lossy, late, noisy channel for encoded messages (:mod:`opencood_ext.comm.wire`)."""
from __future__ import annotations

import math
from collections import deque
from typing import Deque, List, Optional, Sequence, Tuple

import numpy as np

from .wire import MessageError, _unpack_header, _with_pose


class ChannelEffects:
    """A lossy, late, noisy channel for encoded messages, one ``step`` per tick.

    Each packet is dropped with ``drop_prob``; a kept packet gets pose noise
    (world-frame x, y ~ N(0, pose_noise_std_m); yaw about the sender's own z
    axis ~ N(0, pose_noise_std_deg), OpenCOOD's model) and is delivered
    ``latency_ticks`` steps later. Packets that cannot be parsed pass through
    untouched (the receiver rejects them). Random draws come from ``seed``.
    """

    def __init__(self, pose_noise_std_m: float = 0.0, pose_noise_std_deg: float = 0.0,
                 drop_prob: float = 0.0, latency_ticks: int = 0, seed: Optional[int] = None):
        if pose_noise_std_m < 0 or pose_noise_std_deg < 0:
            raise ValueError("ChannelEffects pose noise std must be >= 0")
        if not 0.0 <= drop_prob <= 1.0:
            raise ValueError(f"ChannelEffects drop_prob must be in [0, 1], got {drop_prob}")
        if latency_ticks < 0:
            raise ValueError(f"ChannelEffects latency_ticks must be >= 0, got {latency_ticks}")
        self.pose_noise_std_m = float(pose_noise_std_m)
        self.pose_noise_std_deg = float(pose_noise_std_deg)
        self.drop_prob = float(drop_prob)
        self.latency_ticks = int(latency_ticks)
        self.rng = np.random.default_rng(seed)
        self._queue: Deque[Tuple[int, bytes]] = deque()
        self._tick = 0
        self.sent = self.dropped = self.delivered = 0

    def perturb_pose(self, data: bytes) -> bytes:
        """Apply pose noise to one encoded message (unparseable data is returned as is)."""
        if self.pose_noise_std_m == 0 and self.pose_noise_std_deg == 0:
            return data
        try:
            f = _unpack_header(data)
        except MessageError:
            return data
        T = np.array(f[7:23], dtype=np.float64).reshape(4, 4)
        dx, dy = self.rng.normal(0.0, self.pose_noise_std_m, size=2)
        yaw = math.radians(self.rng.normal(0.0, self.pose_noise_std_deg))
        c, s = math.cos(yaw), math.sin(yaw)
        Rz = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
        noisy = T.copy()
        noisy[:3, :3] = Rz @ T[:3, :3]
        noisy[0, 3] += dx
        noisy[1, 3] += dy
        return _with_pose(data, noisy)

    def step(self, packets: Sequence[bytes]) -> List[bytes]:
        """Send this tick's packets; return those delivered this tick (in send order)."""
        for data in packets:
            self.sent += 1
            if self.drop_prob > 0 and self.rng.random() < self.drop_prob:
                self.dropped += 1
                continue
            self._queue.append((self._tick + self.latency_ticks, self.perturb_pose(bytes(data))))
        out = []
        while self._queue and self._queue[0][0] <= self._tick:
            out.append(self._queue.popleft()[1])
        self.delivered += len(out)
        self._tick += 1
        return out

    def pending(self) -> int:
        """Packets in flight (sent, not yet delivered)."""
        return len(self._queue)
