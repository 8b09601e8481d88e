"""ASCII PCD parsing MB/s on the fixture vs numpy.loadtxt (plus binary / LZF figures).

    python tools/bench.py pcd [--file F.pcd] [--repeat N]

Uses ``../shared/fixtures/.../000069.pcd`` (a real 2.1 MB OPV2V ascii file) or,
when absent, a synthetic 40k-point ascii file written by :func:`write_pcd`.
Figures are the median over ``--repeat`` runs; loadtxt's time includes the same
rgb -> intensity decode so both produce the same (N, 4) array.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from opencood_ext.data.formats.lzf import lzf_compress, lzf_decompress
from opencood_ext.data.formats.pcd import parse_header, read_pcd, write_pcd

FIXTURE = (Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "v2xset_real" / "validate"
           / "2021_08_21_17_30_41" / "4279" / "000069.pcd")


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _loadtxt_pcd(path: Path, skip: int) -> np.ndarray:
    table = np.loadtxt(path, skiprows=skip, dtype=np.float64)
    out = table.astype(np.float32)
    bits = table[:, 3].astype(np.float32).view(np.uint32)
    out[:, 3] = ((bits >> 16) & 0xFF) / np.float32(255)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="bench.py pcd")
    ap.add_argument("--file", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path = args.file or (FIXTURE if FIXTURE.exists() else None)
        if path is None:
            rng = np.random.default_rng(0)
            pts = np.column_stack([rng.normal(0, 30, (40000, 3)), rng.integers(0, 256, 40000) / 255.0])
            path = write_pcd(tmp / "synthetic.pcd", pts, data="ascii")
        raw = path.read_bytes()
        hdr = parse_header(raw, path)
        skip = raw[:hdr.body_offset].count(b"\n")
        mb = len(raw) / 1e6
        ours = read_pcd(path)
        ref = _loadtxt_pcd(path, skip)
        same = bool(np.array_equal(ours, ref[np.isfinite(ref[:, :3]).all(axis=1)]))
        t_ours = _median_time(lambda: read_pcd(path), args.repeat)
        t_loadtxt = _median_time(lambda: _loadtxt_pcd(path, skip), args.repeat)
        binary = write_pcd(tmp / "b.pcd", ours, data="binary")
        comp = write_pcd(tmp / "c.pcd", ours, data="binary_compressed")
        t_bin = _median_time(lambda: read_pcd(binary), args.repeat)
        t_comp = _median_time(lambda: read_pcd(comp), args.repeat)
        soa = np.ascontiguousarray(ours.T).tobytes()
        packed = lzf_compress(soa)
        t_lzf_c = _median_time(lambda: lzf_compress(soa), max(1, args.repeat // 2))
        t_lzf_d = _median_time(lambda: lzf_decompress(packed, len(soa)), args.repeat)
    return {
        "file": str(path), "points": int(len(ours)), "ascii_MB": round(mb, 3),
        "same_result_as_loadtxt": same,
        "read_pcd_ascii_s": t_ours, "read_pcd_ascii_MB_per_s": mb / t_ours,
        "loadtxt_s": t_loadtxt, "loadtxt_MB_per_s": mb / t_loadtxt, "speedup_vs_loadtxt": t_loadtxt / t_ours,
        "read_pcd_binary_ms": 1e3 * t_bin, "read_pcd_binary_compressed_ms": 1e3 * t_comp,
        "lzf_ratio": len(packed) / len(soa),
        "lzf_compress_MB_per_s": len(soa) / 1e6 / t_lzf_c, "lzf_decompress_MB_per_s": len(soa) / 1e6 / t_lzf_d,
    }
