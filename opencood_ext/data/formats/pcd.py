"""PCD point clouds (PCL format v0.7): read any of ``DATA ascii | binary |
binary_compressed``, write OPV2V's encoding.

:func:`read_pcd` returns ``(N, 4) float32`` x, y, z, intensity with intensity in
0..1, taken from either

* ``rgb`` / ``rgba``: PCL's packed colour, a 4-byte field whose bits are
  ``0x00RRGGBB``; OPV2V stores the intensity in the red byte, so
  ``intensity = ((bits >> 16) & 0xFF) / 255``; or
* ``intensity``: divided by ``intensity_scale`` (the raw value meaning 1.0;
  DAIR-V2X uses 256). With ``intensity_scale=None`` the scale is detected from
  the data: 1 if every value is <= 1, else 255, 65535 or the maximum.

Fields may come in any order; other fields are ignored; SIZE / TYPE / COUNT
are honoured (F2/F4/F8, U1..U8, I1..I8). Rows with a NaN or infinite x, y, z or
intensity are a data fault (:func:`opencood_ext.data.faults.drop_nonfinite`):
dropped with a DataFaultWarning and a logged WARNING naming the file and the
count, or with ``strict=True`` refused with a DataFaultError.
:func:`decode_pcd` is the same read without that step (the readers cache its
output and drop the rows after the cache, so every read reports them). A file with neither
colour nor intensity yields intensity 0 (logged).
Every problem raises :class:`DataFormatError` naming the file and the fault.
"""
from __future__ import annotations

import logging
import struct
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from ..errors import DataFormatError
from ..faults import drop_nonfinite
from .ascii_floats import parse_ascii_floats
from .lzf import LZFError, lzf_compress, lzf_decompress

log = logging.getLogger(__name__)

_KEYWORDS = ("VERSION", "FIELDS", "COLUMNS", "SIZE", "TYPE", "COUNT", "WIDTH", "HEIGHT",
             "VIEWPOINT", "POINTS", "DATA")
_DATA_KINDS = ("ascii", "binary", "binary_compressed")
_MAX_HEADER_BYTES = 1 << 16
_COLOUR_FIELDS = ("rgb", "rgba")
_LZF_MAX_RATIO = 88  # one 3-byte LZF token expands to at most 264 bytes


class PCDHeader:
    """Parsed header. ``fields``, ``sizes``, ``types``, ``counts`` are parallel lists."""

    def __init__(self, fields, sizes, types, counts, width, height, points, data, body_offset):
        self.fields: List[str] = fields
        self.sizes: List[int] = sizes
        self.types: List[str] = types
        self.counts: List[int] = counts
        self.width, self.height, self.points = width, height, points
        self.data: str = data
        self.body_offset: int = body_offset

    def numpy_type(self, k: int, path) -> np.dtype:
        t, s = self.types[k], self.sizes[k]
        code = {"F": "f", "U": "u", "I": "i"}.get(t)
        if code is None or (code == "f" and s not in (2, 4, 8)) or (code != "f" and s not in (1, 2, 4, 8)):
            raise DataFormatError(path, f"unsupported TYPE {t} with SIZE {s} for field "
                                  f"'{self.fields[k]}'", key="TYPE")
        return np.dtype(f"<{code}{s}")

    def column(self, name: str) -> Optional[int]:
        """Index of field ``name`` (case-insensitive) or None."""
        low = [f.lower() for f in self.fields]
        return low.index(name) if name in low else None


def _ints(path, key, values) -> List[int]:
    try:
        return [int(v) for v in values]
    except ValueError:
        raise DataFormatError(path, f"expected integers, got {' '.join(values)!r}", key=key) from None


def parse_header(raw: bytes, path) -> PCDHeader:
    """Parse the header at the start of ``raw`` (the whole file's bytes)."""
    entries: Dict[str, List[str]] = {}
    pos = 0
    head = raw[:_MAX_HEADER_BYTES]
    while True:
        nl = head.find(b"\n", pos)
        if nl < 0:
            raise DataFormatError(path, "malformed header: no 'DATA ascii|binary|binary_compressed' "
                                  "line found")
        line = head[pos:nl].decode("ascii", errors="replace").strip()
        pos = nl + 1
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        key = parts[0].upper()
        if key not in _KEYWORDS:
            raise DataFormatError(path, f"malformed header: unexpected line {line[:60]!r} "
                                  f"before the DATA line")
        entries["FIELDS" if key == "COLUMNS" else key] = parts[1:]
        if key == "DATA":
            break
    for key in ("FIELDS", "SIZE", "TYPE"):
        if not entries.get(key):
            raise DataFormatError(path, f"malformed header: missing {key}", key=key)
    fields = entries["FIELDS"]
    sizes = _ints(path, "SIZE", entries["SIZE"])
    types = [t.upper() for t in entries["TYPE"]]
    counts = _ints(path, "COUNT", entries["COUNT"]) if "COUNT" in entries else [1] * len(fields)
    for key, vals in (("SIZE", sizes), ("TYPE", types), ("COUNT", counts)):
        if len(vals) != len(fields):
            raise DataFormatError(path, f"header lists {len(fields)} FIELDS but {len(vals)} {key} "
                                  "values", key=key)
    if any(c < 1 for c in counts) or any(s < 1 for s in sizes):
        raise DataFormatError(path, "SIZE and COUNT values must be positive", key="COUNT")
    data = entries["DATA"][0].lower() if entries["DATA"] else ""
    if data not in _DATA_KINDS:
        raise DataFormatError(path, f"unknown DATA kind {data!r}; expected one of {_DATA_KINDS}",
                              key="DATA")
    width = _ints(path, "WIDTH", entries.get("WIDTH", ["-1"])[:1])[0]
    height = _ints(path, "HEIGHT", entries.get("HEIGHT", ["1"])[:1])[0]
    if "POINTS" in entries:
        points = _ints(path, "POINTS", entries["POINTS"][:1])[0]
    elif width >= 0:
        points = width * height
    else:
        raise DataFormatError(path, "malformed header: neither POINTS nor WIDTH given", key="POINTS")
    if points < 0:
        raise DataFormatError(path, f"negative point count {points}", key="POINTS")
    if width >= 0 and width * height != points:
        raise DataFormatError(path, f"header/count mismatch: WIDTH*HEIGHT = {width}*{height} = "
                              f"{width * height} but POINTS = {points}", key="POINTS")
    hdr = PCDHeader(fields, sizes, types, counts, width, height, points, data, pos)
    for k in range(len(fields)):
        hdr.numpy_type(k, path)  # validate every type up front
    return hdr


def _record_dtype(hdr: PCDHeader, path) -> np.dtype:
    """Packed (array-of-structs) record; field names made unique (PCL uses '_' padding)."""
    names, formats, offsets, off = [], [], [], 0
    for k, f in enumerate(hdr.fields):
        base = hdr.numpy_type(k, path)
        names.append(f"{k}_{f}")
        formats.append(base if hdr.counts[k] == 1 else (base, (hdr.counts[k],)))
        offsets.append(off)
        off += hdr.sizes[k] * hdr.counts[k]
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": off})


def _columns_ascii(raw: bytes, hdr: PCDHeader, path) -> Dict[int, np.ndarray]:
    ncols = sum(hdr.counts)
    expected = hdr.points * ncols
    try:
        values = parse_ascii_floats(raw, hdr.body_offset, ncols)  # bulk parse, see ascii_floats
    except ValueError:
        values = None
    if values is None or values.size != expected:
        raise _ascii_problem(raw[hdr.body_offset:].decode("ascii", errors="replace"), expected, hdr, path)
    table = values.reshape(hdr.points, ncols)
    cols, start = {}, 0
    for k in range(len(hdr.fields)):
        col = table[:, start]
        start += hdr.counts[k]
        dt = hdr.numpy_type(k, path)
        cols[k] = col.astype(dt) if dt.kind == "f" else col
    return cols


def _ascii_problem(text: str, expected: int, hdr: PCDHeader, path) -> DataFormatError:
    """Slow path, taken only to explain a body that failed the bulk parse."""
    got = len(text.split())
    if got != expected:
        return DataFormatError(path, f"header/count mismatch: ascii body has {got} values, header "
                               f"promises POINTS {hdr.points} x {sum(hdr.counts)} columns = {expected}")
    for lineno, line in enumerate(text.splitlines(), start=1):
        for tok in line.split():
            try:
                float(tok)
            except ValueError:
                return DataFormatError(path, f"ascii body line {lineno}: {tok[:40]!r} is not a number")
    return DataFormatError(path, "ascii body could not be parsed")


def _columns_binary(raw: bytes, hdr: PCDHeader, path) -> Dict[int, np.ndarray]:
    dt = _record_dtype(hdr, path)
    need = hdr.points * dt.itemsize
    have = len(raw) - hdr.body_offset
    if have < need:
        raise DataFormatError(path, f"truncated binary body: {have} bytes, header promises POINTS "
                              f"{hdr.points} x {dt.itemsize} bytes = {need}")
    rec = np.frombuffer(raw, dtype=dt, count=hdr.points, offset=hdr.body_offset)
    return {k: rec[dt.names[k]] if hdr.counts[k] == 1 else rec[dt.names[k]][:, 0]
            for k in range(len(hdr.fields))}


def _columns_compressed(raw: bytes, hdr: PCDHeader, path) -> Dict[int, np.ndarray]:
    off = hdr.body_offset
    if len(raw) < off + 8:
        raise DataFormatError(path, "truncated binary_compressed body: missing the 8-byte size prefix")
    csize, usize = struct.unpack_from("<II", raw, off)
    rec_size = sum(s * c for s, c in zip(hdr.sizes, hdr.counts))
    if usize != hdr.points * rec_size:
        raise DataFormatError(path, f"header/count mismatch: uncompressed size {usize} bytes, header "
                              f"promises POINTS {hdr.points} x {rec_size} bytes = {hdr.points * rec_size}")
    if usize > _LZF_MAX_RATIO * csize:
        raise DataFormatError(path, f"corrupt binary_compressed body: {csize} compressed bytes cannot "
                              f"hold the {usize} bytes the size prefix claims")
    body = raw[off + 8:off + 8 + csize]
    if len(body) < csize:
        raise DataFormatError(path, f"truncated binary_compressed body: {len(body)} of {csize} "
                              "compressed bytes present")
    try:
        flat = lzf_decompress(body, usize) if usize else b""
    except LZFError as exc:
        raise DataFormatError(path, f"corrupt binary_compressed body: {exc}") from None
    cols, start = {}, 0
    for k in range(len(hdr.fields)):  # struct-of-arrays: one block per field
        dt = hdr.numpy_type(k, path)
        c = hdr.counts[k]
        block = np.frombuffer(flat, dtype=dt, count=hdr.points * c, offset=start)
        cols[k] = block.reshape(hdr.points, c)[:, 0] if c > 1 else block
        start += hdr.points * c * dt.itemsize
    return cols


def _detect_scale(raw_intensity: np.ndarray) -> float:
    finite = raw_intensity[np.isfinite(raw_intensity)]  # NaN/inf rows are dropped later
    top = float(finite.max()) if finite.size else 0.0
    for scale in (1.0, 255.0, 65535.0):
        if top <= scale:
            return scale
    return top


def _packed_red(col: np.ndarray, hdr: PCDHeader, k: int) -> np.ndarray:
    """Red byte of a packed-colour column as 0..1 intensity."""
    if hdr.types[k] == "F" and hdr.sizes[k] == 4:
        bits = np.ascontiguousarray(col, dtype=np.float32).view(np.uint32)
    else:
        bits = np.asarray(col).astype(np.uint64).astype(np.uint32)
    return (((bits >> 16) & 0xFF).astype(np.float32)) / np.float32(255.0)


def read_pcd(path, intensity_scale: Optional[float] = None, strict: bool = False) -> np.ndarray:
    """Read a PCD file -> (N, 4) float32 ``x, y, z, intensity`` (intensity 0..1).

    ``intensity_scale`` applies to an ``intensity`` field only (see the module
    docstring); packed ``rgb`` always uses the red byte / 255. Rows with NaN/inf
    values are dropped and warned about, or with ``strict`` refused (DataFaultError).
    """
    return drop_nonfinite(decode_pcd(path, intensity_scale), path, 4, strict=strict)


def decode_pcd(path, intensity_scale: Optional[float] = None) -> np.ndarray:
    """:func:`read_pcd` keeping every row, NaN/inf values included."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataFormatError(path, f"cannot read point cloud: {exc.strerror or exc}") from None
    hdr = parse_header(raw, path)
    for axis in ("x", "y", "z"):
        if hdr.column(axis) is None:
            raise DataFormatError(path, f"FIELDS {' '.join(hdr.fields)} has no '{axis}'", key="FIELDS")
    reader = {"ascii": _columns_ascii, "binary": _columns_binary,
              "binary_compressed": _columns_compressed}[hdr.data]
    cols = reader(raw, hdr, path)
    out = np.empty((hdr.points, 4), dtype=np.float32)
    for j, axis in enumerate(("x", "y", "z")):
        out[:, j] = cols[hdr.column(axis)]
    k_int = hdr.column("intensity")
    k_rgb = next((hdr.column(c) for c in _COLOUR_FIELDS if hdr.column(c) is not None), None)
    if k_int is not None:
        inten = np.asarray(cols[k_int], dtype=np.float64)
        scale = _detect_scale(inten) if intensity_scale is None else float(intensity_scale)
        if scale <= 0:
            raise DataFormatError(path, f"intensity_scale must be positive, got {scale}")
        out[:, 3] = inten / scale
    elif k_rgb is not None:
        out[:, 3] = _packed_red(cols[k_rgb], hdr, k_rgb)
    else:
        out[:, 3] = 0.0
        log.info("%s: no intensity or rgb field (FIELDS %s); intensity set to 0", path,
                 " ".join(hdr.fields))
    return out


# ----------------------------------------------------------------------------- writing

def pack_intensity_rgb(intensity: np.ndarray) -> np.ndarray:
    """0..1 intensity -> float32 whose bits are ``round(255 * i) << 16`` (OPV2V's rgb)."""
    red = np.clip(np.rint(np.asarray(intensity, dtype=np.float64) * 255.0), 0, 255).astype(np.uint32)
    return (red << 16).view(np.float32)


def write_pcd(path, points, data: str = "binary", fourth: str = "rgb") -> Path:
    """Write (N, 3) or (N, 4) points (x, y, z[, intensity 0..1]) as a PCD v0.7 file.

    ``fourth="rgb"`` packs the intensity into the red byte like OPV2V (what
    OpenCOOD-family tools expect); ``fourth="intensity"`` stores it as a float.
    ``data`` is ``"ascii"`` (``%.10g``, like OPV2V's files), ``"binary"`` or
    ``"binary_compressed"`` (LZF). Same input -> identical bytes.
    """
    path = Path(path)
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] not in (3, 4):
        raise ValueError(f"write_pcd({path}): points must be (N, 3) or (N, 4), got {pts.shape}")
    if data not in _DATA_KINDS:
        raise ValueError(f"write_pcd({path}): data must be one of {_DATA_KINDS}, got {data!r}")
    if fourth not in ("rgb", "intensity"):
        raise ValueError(f"write_pcd({path}): fourth must be 'rgb' or 'intensity', got {fourth!r}")
    n = len(pts)
    cols = np.zeros((n, 4), dtype=np.float32)
    cols[:, :3] = pts[:, :3]
    inten = pts[:, 3] if pts.shape[1] == 4 else np.zeros(n)
    cols[:, 3] = pack_intensity_rgb(inten) if fourth == "rgb" else inten.astype(np.float32)
    header = ("# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\n"
              f"FIELDS x y z {fourth}\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\n"
              f"WIDTH {n}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS {n}\nDATA {data}\n").encode("ascii")
    if data == "ascii":
        flat = cols.astype(np.float64).ravel().tolist()
        body = (("%.10g %.10g %.10g %.10g\n" * n) % tuple(flat)).encode("ascii") if n else b""
    elif data == "binary":
        body = cols.astype("<f4").tobytes()
    else:
        soa = np.ascontiguousarray(cols.astype("<f4").T).tobytes()  # one block per field
        comp = lzf_compress(soa)
        body = struct.pack("<II", len(comp), len(soa)) + comp
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + body)
    return path

