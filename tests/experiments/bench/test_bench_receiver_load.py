"""The receiver load benchmark (issue 52 item 3) runs tiny and says what it measured: every kind x
signing mode x sender count, each frame served with no message rejected, the signature's bytes per
message, the latency percentiles in order. Timings are never asserted (they depend on the machine)."""
import socket

import pytest

from experiments.bench import cli, receiver_load

KEYS = ("bytes_per_msg", "frames", "offered_msg_per_s", "rejected", "cpu_ms_per_frame", "receive_cpu_ms_per_msg",
        "fuse_cpu_ms_per_frame", "capacity_frame_hz", "capacity_msg_per_s", "latency_p50_ms", "latency_p95_ms",
        "latency_p99_ms")
TINY = ["--senders", "1,2", "--rate", "20", "--seconds", "0.1", "--size", "8", "--channels", "4", "--boxes", "3",
        "--max_seconds", "30"]


@pytest.fixture(scope="module")
def result():
    return receiver_load.main(TINY)


def test_every_case_is_reported_with_its_figures(result):
    assert result["threads"] == 1 and result["transport"].startswith("tcp 127.0.0.1")
    assert result["late_payload"] == "boxes 1x3x9 float32" and result["gencomm_payload"] == "bev 2x8x8 float16"
    assert result["intermediate_payload"] == "bev 4x8x8 float32"
    for kind in ("late", "intermediate", "gencomm"):
        for mode in ("none", "hmac", "ed25519"):
            for n in (1, 2):
                case = {k: result[f"{kind}_{mode}_{n}s_{k}"] for k in KEYS}
                assert case["frames"] == 2 and case["rejected"] == 0, (kind, mode, n, case)
                assert case["offered_msg_per_s"] == 20 * n
                assert case["latency_p50_ms"] <= case["latency_p95_ms"] <= case["latency_p99_ms"]
                assert case["cpu_ms_per_frame"] > 0 and case["capacity_msg_per_s"] > 0
        sizes = [result[f"{kind}_{mode}_1s_bytes_per_msg"] for mode in ("none", "hmac", "ed25519")]
        assert sizes[1] - sizes[0] == 32 and sizes[2] - sizes[0] == 80  # HMAC tag; sequence, time, Ed25519


def test_it_is_registered_and_refuses_bad_options(capsys):
    assert cli.BENCHMARKS["receiver_load"][0] == "experiments.bench.receiver_load"
    for bad in (["--kinds", "telepathy"], ["--senders", "0"], ["--modes", "rsa"], ["--rate", "0"]):
        assert cli.main(["receiver_load", *bad]) == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_it_listens_on_loopback_only(monkeypatch):
    """The one server socket it opens is bound to 127.0.0.1."""
    bound = []
    real = socket.create_server
    monkeypatch.setattr(socket, "create_server", lambda address, **kw: bound.append(address) or real(address, **kw))
    receiver_load.main([*TINY[:-2], "--kinds", "late", "--modes", "none", "--senders", "1"])
    assert [host for host, _ in bound] == ["127.0.0.1"]
