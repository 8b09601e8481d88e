"""Receiver load: how many senders x messages per second one core verifies, decodes and fuses.

    python tools/bench.py receiver_load [--senders 1,4] [--rate 10] [--seconds 1] [--threads 1]
                                        [--kinds late,intermediate,gencomm] [--modes none,hmac,ed25519]

For each payload kind x signing mode x sender count, a sender process (started and joined here)
streams ``rate`` frames per second for ``seconds`` over one TCP connection on 127.0.0.1 (a port
the operating system picks; nothing listens beyond loopback), each frame one packet from each
sender, encoded (and signed) as the wire format says, with a new timestamp and sequence number
per frame. This process is the receiver: it reads the packets, runs each frame through the one
receiving path (:func:`~opencood_ext.comm.messages.receive_frame`: the per-message bounds,
signature, alliance registry, replay window and frame budget of the default ``receiver:``
section) and fuses what it accepted (:mod:`.receiver_fusion`). The run stops by itself: after
the last frame, or ``--max_seconds`` per case, whichever comes first.

Figures per case (``<kind>_<mode>_<n>s_*``): ``cpu_ms_per_frame`` (the receiver thread's CPU time
for one frame: verify + decode + fuse; with ``--threads 1`` that is one core), its split
``receive_cpu_ms_per_msg`` / ``fuse_cpu_ms_per_frame``, ``capacity_msg_per_s`` (messages one core
takes per second at that sender count: n / cpu time per frame), ``capacity_frame_hz``, and, at
the offered rate, the latency from a frame's first packet leaving the sender to its fused output:
``latency_p50_ms`` / ``p95`` / ``p99`` (wall clock, so it includes waiting behind earlier frames
when the offered rate exceeds the capacity), ``frames`` served and ``rejected`` messages (0
expected). Times vary with the machine and its load; nothing here is asserted.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import socket
import struct
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from opencood_ext.comm.messages import Acceptance, ReceiverContext, receive_frame
from opencood_ext.comm.receiver import ReceiverConfig, Security
from opencood_ext.comm.signing import KeyRegistry, SenderKeys, Signer
from opencood_ext.comm.wire import BoxRules, Message, encode

from .receiver_fusion import KINDS, Fuser, payload_of

RECORD = struct.Struct("<IIId")  # length of the packet, frame index, sender index, send time (monotonic s)
MODES = ("none", "hmac", "ed25519")
HMAC_KEY = b"receiver-load-benchmark-key-0123"  # a benchmark's own key (32 bytes), never a deployment's
EGO_ID, TYPE = 0, "m1"
TICK_S = ReceiverConfig().tick_s  # seconds per timestamp unit: frame f is made at f * TICK_S of the senders' clock


def _pose(sender: int) -> np.ndarray:
    """Sender ``sender``'s pose in the world: spread on a 20 m ring around the ego (at the origin)."""
    angle = 2 * math.pi * sender / 16
    pose = np.eye(4)
    pose[:3, :3] = [[math.cos(angle), -math.sin(angle), 0], [math.sin(angle), math.cos(angle), 0], [0, 0, 1]]
    pose[:2, 3] = 20 * math.cos(angle), 20 * math.sin(angle)
    return pose


def _send(port: int, kind: str, mode: str, senders: int, frames: int, rate: float, dtype: str,
          shape: Sequence[int], signers: Optional[Dict[int, Signer]], start: float) -> None:
    """The sender process: frame f's packets leave at ``start + f / rate`` (or as soon as the
    connection takes them). Payloads are drawn once per sender; each frame gets a new timestamp
    (and, signed per sender, a new sequence number)."""
    rng = np.random.default_rng(0)
    payloads = [payload_of(kind, shape, rng) for _ in range(senders)]
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn, contextlib.suppress(
            BrokenPipeError, ConnectionResetError):  # the receiver stopped at its time limit
        for f in range(frames):
            delay = start + f / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent = time.monotonic()
            for s in range(senders):
                sid = s + 1
                msg = Message(sender_id=sid, agent_type=TYPE, timestamp=float(f), pose=_pose(s),
                              payload=payloads[s], kind=kind)
                packet = encode(msg, dtype, key=HMAC_KEY if mode == "hmac" else None,
                                signer=signers[sid] if mode == "ed25519" else None, generation_time=f * TICK_S)
                conn.sendall(RECORD.pack(len(packet), f, s, sent) + packet)


def _read_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("the sender closed the connection early")
        buf += chunk
    return bytes(buf)


def _security(mode: str, senders: int):
    """(the receiver's Security, the senders' Signers by id or None)."""
    if mode == "hmac":
        return Security(hmac_key=HMAC_KEY), None
    if mode == "ed25519":
        signers = {sid: Signer.generate(sid) for sid in range(1, senders + 1)}
        registry = KeyRegistry({sid: s.public_key for sid, s in signers.items()})
        return Security(signers=SenderKeys(signers.values()), registry=registry), signers
    return Security(), None


def run_case(name: str, mode: str, senders: int, a: argparse.Namespace) -> Dict[str, float]:
    """Bench kind ``name`` x signing ``mode`` x ``senders`` under options ``a`` (module docstring);
    -> its figures."""
    kind, shape, dtype = KINDS[name](a)
    rate, max_seconds = a.rate, a.max_seconds
    frames = max(1, int(round(rate * a.seconds)))
    security, signers = _security(mode, senders)
    config = ReceiverConfig()
    accept = Acceptance(kind=kind, shape=None if kind == "boxes" else tuple(shape), agent_types={TYPE},
                        boxes=BoxRules(num_classes=1) if kind == "boxes" else None).bounded_by(config, security)
    registry = {sid: TYPE for sid in range(1, senders + 1)}
    budget = config.budget()
    fuser = Fuser(name, shape, a.channels, a.boxes)
    fuser.warm_up(senders, _pose)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(60)
    ctx = multiprocessing.get_context("fork")  # the Signers stay in memory: a private key is never pickled
    start = time.monotonic() + 0.2
    sender = ctx.Process(target=_send, args=(listener.getsockname()[1], kind, mode, senders, frames, rate, dtype,
                                             shape, signers, start), daemon=True)
    sender.start()
    latencies: List[float] = []
    cpu_receive = cpu_fuse = 0.0
    rejected = served = 0
    deadline = time.monotonic() + max_seconds
    try:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(max(1.0, max_seconds))
            pending: Dict[int, List[bytes]] = {}
            sent_at: Dict[int, float] = {}
            while served < frames and time.monotonic() < deadline:
                size, f, _, when = RECORD.unpack(_read_exact(conn, RECORD.size))
                pending.setdefault(f, []).append(_read_exact(conn, size))
                sent_at.setdefault(f, when)
                if len(pending[f]) < senders:
                    continue
                t0 = time.thread_time()
                context = ReceiverContext(now=float(f), own_id=EGO_ID, registry=registry,
                                          replay=security.window(EGO_ID))
                receipt = receive_frame(pending.pop(f), accept, context, budget)
                t1 = time.thread_time()
                fuser.fuse([m for _, m in receipt.accepted])
                t2 = time.thread_time()
                latencies.append(time.monotonic() - sent_at.pop(f))
                cpu_receive, cpu_fuse = cpu_receive + (t1 - t0), cpu_fuse + (t2 - t1)
                rejected += len(receipt.rejected)
                served += 1
    finally:
        listener.close()
        sender.join(timeout=5)
        if sender.is_alive():  # stopped by the time limit: end the sender this run started
            sender.terminate()
            sender.join(timeout=5)
    cpu_frame = (cpu_receive + cpu_fuse) / max(served, 1)
    lat = np.asarray(latencies) * 1e3 if latencies else np.full(1, np.nan)
    one = Message(sender_id=1, agent_type=TYPE, timestamp=0.0, pose=_pose(0), kind=kind,
                  payload=payload_of(kind, shape, np.random.default_rng(3)))
    size = len(encode(one, dtype, key=HMAC_KEY if mode == "hmac" else None,
                      signer=Signer.generate(1) if mode == "ed25519" else None))
    return {"bytes_per_msg": size, "frames": served, "offered_msg_per_s": senders * rate, "rejected": rejected,
            "cpu_ms_per_frame": cpu_frame * 1e3,
            "receive_cpu_ms_per_msg": cpu_receive * 1e3 / max(served * senders, 1),
            "fuse_cpu_ms_per_frame": cpu_fuse * 1e3 / max(served, 1),
            "capacity_frame_hz": 1.0 / cpu_frame if cpu_frame > 0 else math.inf,
            "capacity_msg_per_s": senders / cpu_frame if cpu_frame > 0 else math.inf,
            "latency_p50_ms": float(np.percentile(lat, 50)), "latency_p95_ms": float(np.percentile(lat, 95)),
            "latency_p99_ms": float(np.percentile(lat, 99))}


def _csv(text: str, cast=str) -> List:
    return [cast(v.strip()) for v in text.split(",") if v.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench receiver_load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"payloads, among {list(KINDS)}")
    p.add_argument("--modes", default=",".join(MODES), help=f"signing modes, among {list(MODES)}")
    p.add_argument("--senders", default="1,4", help="sender counts (comma-separated)")
    p.add_argument("--rate", type=float, default=10.0, help="frames per second each sender offers (V2X: 10 Hz)")
    p.add_argument("--seconds", type=float, default=0.5, help="offered frames per case: rate x seconds")
    p.add_argument("--max_seconds", type=float, default=20.0, help="a case stops after this long, served or not")
    p.add_argument("--size", type=int, default=80, help="BEV map side (cells): the sim setting's 80 x 80")
    p.add_argument("--channels", type=int, default=128, help="full-feature channels (the sim setting's 128)")
    p.add_argument("--boxes", type=int, default=50, help="boxes per late-fusion message")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the receiver (1: one core)")
    return p


def main(argv=None) -> Dict[str, object]:
    a = build_parser().parse_args(argv)
    kinds, modes = _csv(a.kinds), _csv(a.modes)
    senders = _csv(a.senders, int)
    for name, values, allowed in (("--kinds", kinds, KINDS), ("--modes", modes, MODES)):
        if not values or any(v not in allowed for v in values):
            raise ValueError(f"{name} must name some of {list(allowed)}, got {values}")
    if not senders or min(senders) < 1 or max(senders) > 64 or a.rate <= 0 or a.seconds <= 0 or a.max_seconds <= 0:
        raise ValueError("--senders must lie in 1..64 (the receiver's max_messages_per_frame), --rate, --seconds "
                         "and --max_seconds must be > 0")
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    res: Dict[str, object] = {"threads": torch.get_num_threads(), "transport": "tcp 127.0.0.1, one connection",
                              "rate_hz": a.rate, "seconds": a.seconds}
    for kind in kinds:
        wire_kind, shape, dtype = KINDS[kind](a)
        res[f"{kind}_payload"] = f"{wire_kind} {'x'.join(map(str, shape))} {dtype}"
        for mode in modes:
            for n in senders:
                case = run_case(kind, mode, n, a)
                res.update({f"{kind}_{mode}_{n}s_{k}": v for k, v in case.items()})
    return res


if __name__ == "__main__":
    for k, v in main().items():
        print(f"{k}: {v}")
