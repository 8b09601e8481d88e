"""LZF (liblzf) compression, the codec of PCD ``DATA binary_compressed``.

The stream is a sequence of tokens, each starting with a control byte ``c``:

* ``c < 32``: a literal run; the next ``c + 1`` bytes are copied as they are.
* ``c >= 32``: a back reference. ``n = c >> 5`` (if ``n == 7`` one more byte is
  added to it); the next byte ``b`` completes the distance: the match starts
  ``((c & 31) << 8) + b + 1`` bytes back in the output and is ``n + 2`` bytes
  long (it may overlap the bytes it produces, which repeats a pattern).

:func:`lzf_decompress` uses liblzf's C decoder from the ``python-lzf`` package
when it is installed (hundreds of MB/s) and otherwise :func:`lzf_decompress_py`,
which walks the tokens in Python (sequential by nature) but copies whole runs
with slices; both give the same bytes and raise :class:`LZFError` on a corrupt
stream. :func:`lzf_compress` finds match candidates for every
position at once with numpy (most recent earlier position holding the same 3
bytes, within the 8 KiB window) and loops only over the matches it emits, so
its cost grows with the number of tokens, not of bytes. Output is
deterministic for a given input.
"""
from __future__ import annotations

import bisect
import importlib

import numpy as np

_MAX_LITERAL = 32
_MAX_OFFSET = 8192  # distance - 1 is stored in 13 bits
_MAX_MATCH = 264  # 7 + 255 + 2


class LZFError(ValueError):
    """A corrupt LZF stream (the caller adds the file name)."""


def _compiled_decoder():
    """python-lzf's ``decompress(data, max_size)`` when installed (another
    package also installs a module named ``lzf``: it must pass a round trip)."""
    try:
        mod = importlib.import_module("lzf")
        fn = getattr(mod, "decompress")
        if fn(b"\x02abc\x20\x02", 6) != b"abcabc":  # literal "abc", then 3 bytes from 3 back
            return None
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    return fn


_C_DECOMPRESS = _compiled_decoder()
HAVE_COMPILED_LZF = _C_DECOMPRESS is not None


def lzf_decompress(src: bytes, expected_size: int) -> bytes:
    """Decompress ``src`` (compiled liblzf when available, else Python); raises
    :class:`LZFError` unless it yields exactly ``expected_size`` bytes from a
    well-formed stream."""
    if _C_DECOMPRESS is None:
        return lzf_decompress_py(src, expected_size)
    return lzf_decompress_c(src, expected_size)


def lzf_decompress_c(src: bytes, expected_size: int) -> bytes:
    """liblzf's decoder (python-lzf); same contract as :func:`lzf_decompress_py`."""
    if _C_DECOMPRESS is None:
        raise RuntimeError("python-lzf is not installed")
    src = bytes(src)
    if not src or not expected_size:  # liblzf reports "0 bytes" for both without an error code
        return lzf_decompress_py(src, expected_size)
    try:
        out = _C_DECOMPRESS(src, expected_size)
    except ValueError:
        out = None
    if out is None or len(out) != expected_size:
        lzf_decompress_py(src, expected_size)  # a corrupt stream: raises with the exact fault
        raise LZFError(f"liblzf rejects this stream of {len(src)} bytes (expected {expected_size} "
                       "bytes out)")
    return out


def lzf_decompress_py(src: bytes, expected_size: int) -> bytes:
    """The pure-Python decoder (the fallback when python-lzf is missing)."""
    src = bytes(src)
    n = len(src)
    out = bytearray()
    i = 0
    while i < n:
        ctrl = src[i]
        i += 1
        if ctrl < 32:
            length = ctrl + 1
            if i + length > n:
                raise LZFError(f"literal run of {length} bytes at input offset {i - 1} "
                               f"runs past the end of the {n}-byte stream")
            out += src[i:i + length]
            i += length
        else:
            length = ctrl >> 5
            if length == 7:
                if i >= n:
                    raise LZFError(f"back reference at input offset {i - 1} is cut off")
                length += src[i]
                i += 1
            if i >= n:
                raise LZFError(f"back reference at input offset {i - 1} is cut off")
            dist = ((ctrl & 0x1F) << 8) + src[i] + 1
            i += 1
            length += 2
            start = len(out) - dist
            if start < 0:
                raise LZFError(f"back reference {dist} bytes back at output offset {len(out)} "
                               "points before the start of the data")
            if dist >= length:
                out += out[start:start + length]
            else:  # overlapping copy = the last `dist` bytes repeated
                pattern = bytes(out[start:])
                out += (pattern * (length // dist + 1))[:length]
        if len(out) > expected_size:
            raise LZFError(f"stream decompresses past the expected {expected_size} bytes")
    if len(out) != expected_size:
        raise LZFError(f"stream decompresses to {len(out)} bytes, expected {expected_size}")
    return bytes(out)


def _match_candidates(a: np.ndarray) -> np.ndarray:
    """For each position i (len(a) - 2 of them): the latest j < i with
    a[j:j+3] == a[i:i+3] and i - j <= 8192, else -1."""
    n = len(a) - 2
    key = a[:n].astype(np.int32) | (a[1:n + 1].astype(np.int32) << 8) | (a[2:n + 2].astype(np.int32) << 16)
    order = np.argsort(key, kind="stable")
    skey = key[order]
    prev = np.full(n, -1, dtype=np.int64)
    same = skey[1:] == skey[:-1]
    prev[order[1:][same]] = order[:-1][same]
    pos = np.arange(n)
    prev[(prev >= 0) & (pos - prev > _MAX_OFFSET)] = -1
    return prev


def _emit_literals(out: bytearray, data: bytes, start: int, stop: int) -> None:
    while start < stop:
        k = min(_MAX_LITERAL, stop - start)
        out.append(k - 1)
        out += data[start:start + k]
        start += k


def lzf_compress(data: bytes) -> bytes:
    """Compress ``data`` into an LZF stream :func:`lzf_decompress` (and liblzf) read."""
    data = bytes(data)
    n = len(data)
    out = bytearray()
    if n < 4:
        _emit_literals(out, data, 0, n)
        return bytes(out)
    prev_arr = _match_candidates(np.frombuffer(data, dtype=np.uint8))
    cand = np.flatnonzero(prev_arr >= 0).tolist()
    prev = prev_arr.tolist()
    i = 0  # first byte not yet emitted
    k = 0  # index into cand
    while k < len(cand):
        p = cand[k]
        if p < i:
            k = bisect.bisect_left(cand, i, k)
            continue
        r = prev[p]
        max_len = min(_MAX_MATCH, n - p)
        # first differing byte via XOR of the two windows read as little-endian ints
        x = int.from_bytes(data[r:r + max_len], "little") ^ int.from_bytes(data[p:p + max_len], "little")
        length = max_len if x == 0 else ((x & -x).bit_length() - 1) // 8
        _emit_literals(out, data, i, p)
        dist = p - r - 1
        code = length - 2
        if code < 7:
            out.append((code << 5) | (dist >> 8))
        else:
            out.append((7 << 5) | (dist >> 8))
            out.append(code - 7)
        out.append(dist & 0xFF)
        i = p + length
        k += 1
    _emit_literals(out, data, i, n)
    return bytes(out)
