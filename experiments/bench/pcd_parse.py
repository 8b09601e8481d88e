"""Point-cloud decoding speed on the real V2XSet fixture, ours vs Open3D vs numpy.

    python tools/bench.py pcd [--file F.pcd] [--repeat N]

Uses ``../shared/fixtures/.../000069.pcd`` (a real 2.1 MB OPV2V ascii file) or,
when absent, a synthetic 40k-point ascii file written by :func:`write_pcd`.
Every reader returns the same (N, 4) x, y, z, intensity array (checked), and
all contenders run round-robin in one loop so they share the machine's load;
figures are medians of wall time, ratios are ``their time / our time``.

* ascii: ``read_pcd`` (pyarrow path when installed), ``read_pcd`` with the
  numpy parser forced, the previous reader (``np.fromstring``), Open3D's legacy
  reader the way OpenCOOD calls it, ``np.loadtxt``;
* binary_compressed (the fixture re-saved by Open3D, i.e. liblzf's encoder):
  ``read_pcd`` with python-lzf's liblzf, with the pure-Python decoder, Open3D.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict

import numpy as np

from opencood_ext.data.formats import ascii_floats
from opencood_ext.data.formats import lzf as lzf_module
from opencood_ext.data.formats.lzf import lzf_compress, lzf_decompress_py
from opencood_ext.data.formats.pcd import parse_header, read_pcd, write_pcd

FIXTURE = (Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "v2xset_real" / "validate"
           / "2021_08_21_17_30_41" / "4279" / "000069.pcd")


def round_robin(fns: Dict[str, Callable[[], object]], repeat: int) -> Dict[str, float]:
    """Median wall seconds of each callable, run interleaved ``repeat`` times (after a warm-up)."""
    times = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(repeat):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def open3d_pcd_to_np(path) -> np.ndarray:
    """OpenCOOD's ``pcd_to_np``: Open3D's legacy reader, red colour channel as intensity."""
    import open3d as o3d

    pcd = o3d.io.read_point_cloud(str(path))
    xyz = np.asarray(pcd.points)
    return np.hstack((xyz, np.asarray(pcd.colors)[:, :1])).astype(np.float32)


def _fromstring_reader(path, skip_bytes: int) -> np.ndarray:
    """The previous ascii path: np.fromstring over the body, then the same rgb decode."""
    raw = Path(path).read_bytes()
    table = np.fromstring(raw[skip_bytes:].decode("ascii"), dtype=np.float64, sep=" ").reshape(-1, 4)
    return _rgb_table_to_points(table)


def _loadtxt_reader(path, skip_lines: int) -> np.ndarray:
    return _rgb_table_to_points(np.loadtxt(path, skiprows=skip_lines, dtype=np.float64))


def _rgb_table_to_points(table: np.ndarray) -> np.ndarray:
    out = table.astype(np.float32)
    bits = table[:, 3].astype(np.float32).view(np.uint32)
    out[:, 3] = ((bits >> 16) & 0xFF).astype(np.float32) / np.float32(255)
    return out[np.isfinite(out[:, :3]).all(axis=1)]


class _NoArrow:
    """``read_pcd`` with the pyarrow path switched off (the numpy parser)."""

    def __enter__(self):
        self.saved = ascii_floats.parse_arrow
        ascii_floats.parse_arrow = lambda *a: None

    def __exit__(self, *exc):
        ascii_floats.parse_arrow = self.saved


class _NoLiblzf:
    def __enter__(self):
        self.saved = lzf_module._C_DECOMPRESS
        lzf_module._C_DECOMPRESS = None

    def __exit__(self, *exc):
        lzf_module._C_DECOMPRESS = self.saved


def _read_numpy_path(path):
    with _NoArrow():
        return read_pcd(path)


def _read_python_lzf(path):
    with _NoLiblzf():
        return read_pcd(path)


def measure(path: Path, repeat: int, tmp: Path) -> dict:
    import open3d as o3d

    raw = path.read_bytes()
    hdr = parse_header(raw, path)
    skip_lines = raw[:hdr.body_offset].count(b"\n")
    mb = len(raw) / 1e6
    ours = read_pcd(path)
    same = {
        "numpy_parser": np.array_equal(_read_numpy_path(path).view(np.uint32), ours.view(np.uint32)),
        "fromstring": np.array_equal(_fromstring_reader(path, hdr.body_offset).view(np.uint32), ours.view(np.uint32)),
        "loadtxt": np.array_equal(_loadtxt_reader(path, skip_lines), ours),
        "open3d": bool(np.allclose(open3d_pcd_to_np(path), ours, atol=1e-6)),
    }
    t = round_robin({
        "ours": lambda: read_pcd(path),
        "ours_numpy": lambda: _read_numpy_path(path),
        "fromstring": lambda: _fromstring_reader(path, hdr.body_offset),
        "open3d": lambda: open3d_pcd_to_np(path),
        "loadtxt": lambda: _loadtxt_reader(path, skip_lines),
    }, repeat)
    comp = tmp / "o3d_compressed.pcd"
    pc = o3d.io.read_point_cloud(str(path))
    o3d.io.write_point_cloud(str(comp), pc, compressed=True)  # liblzf's encoder, as PCL/Open3D files are
    ours_c = read_pcd(comp)
    tc = round_robin({"ours": lambda: read_pcd(comp), "ours_python_lzf": lambda: _read_python_lzf(comp),
                      "open3d": lambda: open3d_pcd_to_np(comp)}, repeat)
    soa = np.ascontiguousarray(ours.T).tobytes()
    packed = lzf_compress(soa)
    tl = round_robin({"liblzf": lambda: lzf_module.lzf_decompress(packed, len(soa)),
                      "python": lambda: lzf_decompress_py(packed, len(soa))}, max(1, repeat // 2))
    return {
        "file": str(path), "points": int(len(ours)), "ascii_MB": round(mb, 3),
        "pyarrow_path": bool(ascii_floats._arrow_modules()), "liblzf": lzf_module.HAVE_COMPILED_LZF,
        **{f"same_result_as_{k}": v for k, v in same.items()},
        "ascii_ours_ms": 1e3 * t["ours"], "ascii_ours_numpy_ms": 1e3 * t["ours_numpy"],
        "ascii_fromstring_ms": 1e3 * t["fromstring"], "ascii_open3d_ms": 1e3 * t["open3d"],
        "ascii_loadtxt_ms": 1e3 * t["loadtxt"],
        "ascii_ours_MB_per_s": mb / t["ours"],
        "ascii_speedup_vs_open3d": t["open3d"] / t["ours"],
        "ascii_numpy_path_speedup_vs_open3d": t["open3d"] / t["ours_numpy"],
        "ascii_speedup_vs_loadtxt": t["loadtxt"] / t["ours"],
        "ascii_speedup_vs_previous_fromstring": t["fromstring"] / t["ours"],
        "compressed_same_result_as_ascii": bool(np.array_equal(ours_c, ours)),
        "compressed_ours_ms": 1e3 * tc["ours"], "compressed_python_lzf_ms": 1e3 * tc["ours_python_lzf"],
        "compressed_open3d_ms": 1e3 * tc["open3d"],
        "compressed_speedup_vs_open3d": tc["open3d"] / tc["ours"],
        "lzf_decompress_liblzf_MB_per_s": len(soa) / 1e6 / tl["liblzf"],
        "lzf_decompress_python_MB_per_s": len(soa) / 1e6 / tl["python"],
    }


def fixture_or_synthetic(tmp: Path, given=None) -> Path:
    path = given or (FIXTURE if FIXTURE.exists() else None)
    if path is None:
        rng = np.random.default_rng(0)
        pts = np.column_stack([rng.normal(0, 30, (40000, 3)), rng.integers(0, 256, 40000) / 255.0])
        path = write_pcd(tmp / "synthetic.pcd", pts, data="ascii")
    return Path(path)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="bench.py pcd")
    ap.add_argument("--file", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        return measure(fixture_or_synthetic(Path(tmp), args.file), args.repeat, Path(tmp))
