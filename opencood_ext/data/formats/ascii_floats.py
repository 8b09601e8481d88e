"""Bulk parsing of whitespace-separated decimal numbers (the body of an ASCII PCD).

:func:`parse_ascii_floats` returns every number of ``raw[start:]`` as float64,
in file order, with exactly the values (bit for bit) that
``np.fromstring(text, sep=" ")`` gives, i.e. each token correctly rounded to
the nearest double. Two paths, the first that applies wins:

1. **pyarrow's CSV reader** (C++, correctly rounded ``fast_float`` conversion),
   when pyarrow is installed and the body is a plain table: single spaces
   between ``columns`` tokens per line. Anything it rejects falls through.
2. **A vectorised numpy parser** over the whole buffer, no per-token Python:
   token bounds come from one pass over the bytes; each token's mantissa
   (up to 16 characters including one '.') and exponent are read as unaligned
   little-endian 64-bit words and turned into integers with SWAR arithmetic
   (eight digits per multiply-shift chain, validity checked per byte). Then
   ``value = M * 10**E`` is exact in one IEEE operation when ``M <= 2**53`` and
   ``|E| <= 22`` (Clinger's fast path). Well-formed tokens outside that range
   (PCL's packed ``rgb`` floats such as ``1.781608625e-38``) are converted by
   Python's correctly rounded ``float`` once per distinct ``(M, E)``; tokens
   the vectorised grammar does not cover (``nan``, ``inf``, >16 digits) once
   per distinct token.

A token that is not a number raises ``ValueError`` (the caller names the file
and line). Accepted grammar: ``[+-]digits[.digits][(e|E)[+-]digits]`` plus
``nan``/``inf``/``infinity`` in any case, as numpy accepts them.
"""
from __future__ import annotations

import importlib
from typing import Dict, Optional

import numpy as np

U = np.uint64
_ZERO = U(0x3030303030303030)  # eight '0' characters
_LO7 = U(0x7F7F7F7F7F7F7F7F)
_B01 = U(0x0101010101010101)
_F0 = U(0xF0F0F0F0F0F0F0F0)
_SIX = U(0x0606060606060606)
_NIBBLE = U(0x0F0F0F0F0F0F0F0F)
_BLOCK = 16384  # tokens per vectorised step: temporaries stay in cache
_MAX_EXP_DIGITS = 4


def _outside_top(k: int) -> int:
    """Mask of the bytes of a little-endian word that are NOT among its top ``k``."""
    k = max(0, min(k, 8))
    return (1 << (8 * (8 - k))) - 1


_NOT_TOP8 = np.array([_outside_top(k) for k in range(9)], dtype=np.uint64)
_NOT_TOP_LO = np.array([_outside_top(n) for n in range(18)], dtype=np.uint64)  # n mantissa chars
_NOT_TOP_HI = np.array([_outside_top(n - 8) for n in range(18)], dtype=np.uint64)


def _dot_tables():
    """Indexed by the float64 exponent field of ``256**j`` (dot in byte j of the
    low word) or ``2**64 * 256**j`` (high word); index 0 means no dot."""
    frac = np.zeros(2048, np.int64)
    mod = np.full(2048, 10 ** 17, np.uint64)  # 10**17 > any 16-digit G: F = G, no split
    add_lo = np.zeros(2048, np.uint64)
    add_hi = np.zeros(2048, np.uint64)
    for j in range(8):
        for base, digits_after, add in ((1023, 7 - j, add_lo), (1023 + 64, 15 - j, add_hi)):
            e = base + 8 * j
            frac[e], mod[e], add[e] = digits_after, 10 ** digits_after, 2 << (8 * j)  # '.' + 2 = '0'
    return frac, mod, add_lo, add_hi


_FRAC, _MOD, _ADD_LO, _ADD_HI = _dot_tables()
_MUL = np.array([10.0 ** max(e, 0) for e in range(-22, 23)])
_DIV = np.array([10.0 ** max(-e, 0) for e in range(-22, 23)])


def _bytes_equal(x, c: int):
    """0x80 in each byte of ``x`` that equals ``c``, 0 elsewhere (exact per byte)."""
    y = x ^ U(c * 0x0101010101010101)
    return ~(((y & _LO7) + _LO7) | y | _LO7)


def _non_digits(x):
    """Nonzero unless all eight bytes are ASCII digits."""
    return ((x & _F0) ^ _ZERO) | (((x + _SIX) & _F0) ^ _ZERO)


def _eight_digits(v):
    """Eight ASCII digits (first character in the low byte) -> their integer value."""
    v = ((v & _NIBBLE) * U(2561)) >> U(8)
    v = ((v & U(0x00FF00FF00FF00FF)) * U(6553601)) >> U(16)
    return ((v & U(0x0000FFFF0000FFFF)) * U(42949672960001)) >> U(32)


def _lowest_marked_byte(z):
    """Index of the lowest byte of ``z`` with 0x80 set; 8 where ``z == 0``."""
    low = z & (~z + U(1))
    return ((((low >> U(7)) - U(1)) & _B01) * _B01) >> U(56)


def _block(b: np.ndarray, words: np.ndarray, s: np.ndarray, length: np.ndarray):
    """Tokens starting at ``s`` with ``length`` chars -> (value, M, E, negative, ok, fast)."""
    end = s + length
    tail = words[end - 8]  # last 8 characters; bytes before the token -> '0'
    tail ^= (tail ^ _ZERO) & _NOT_TOP8[np.minimum(length, 8)]
    k = _lowest_marked_byte(_bytes_equal(tail | U(0x2020202020202020), ord("e"))).view(np.int64)
    mend = end - 8 + k  # end of the mantissa (the 'e', or the token end when k == 8)
    c0 = b[s]
    neg = c0 == ord("-")
    n = mend - s - (neg | (c0 == ord("+")))  # mantissa characters
    nc = np.minimum(n, 17)
    lo, hi = words[mend - 8], words[mend - 16]
    lo ^= (lo ^ _ZERO) & _NOT_TOP_LO[nc]
    hi ^= (hi ^ _ZERO) & _NOT_TOP_HI[nc]
    t = (_bytes_equal(hi, ord(".")) >> U(7)).astype(np.float64)
    t *= 2.0 ** 64
    t += (_bytes_equal(lo, ord(".")) >> U(7)).astype(np.float64)
    dot = t.view(np.int64) >> 52  # which byte holds the (last) dot; 0: none
    lo += _ADD_LO[dot]  # that '.' becomes '0'; any other '.' fails the digit check
    hi += _ADD_HI[dot]
    bad = _non_digits(lo) | _non_digits(hi)
    G = _eight_digits(hi) * U(100000000) + _eight_digits(lo)  # mantissa with a 0 for the dot
    F = G % _MOD[dot]
    M = (G - F) // U(10) + F
    E = -_FRAC[dot]
    ok = (bad == 0) & (n >= 1 + (dot > 0)) & (n <= 16)
    ie = np.flatnonzero(k < 8)
    if ie.size:  # exponent characters follow byte k of `tail`
        ke = k[ie]
        ex = tail[ie] >> (U(8) * (ke + 1).view(np.uint64))
        es = ex & U(0xFF)
        eneg = es == ord("-")
        esign = eneg | (es == ord("+"))
        nd = 7 - ke - esign  # exponent digits
        ed = (ex >> (U(8) * esign.astype(np.uint64))) << (U(8) * (8 - nd).view(np.uint64))
        ed |= _NOT_TOP8[np.clip(nd, 0, 8)] & _ZERO
        ev = _eight_digits(ed).view(np.int64)
        E[ie] += np.where(eneg, -ev, ev)
        ok[ie] &= (_non_digits(ed) == 0) & (nd >= 1) & (nd <= _MAX_EXP_DIGITS)
    fast = ok & (M <= U(1 << 53)) & (E >= -22) & (E <= 22)
    Ec = np.where(fast, E + 22, 22)
    val = M.astype(np.float64) * _MUL[Ec] / _DIV[Ec]  # one rounding: exact (Clinger)
    val.view(np.uint64)[...] |= neg.astype(np.uint64) << U(63)
    return val, M, E, neg, ok, fast


def _python_float(tok: bytes) -> float:
    """numpy's token grammar through Python's correctly rounded ``float``."""
    low = tok.lower()
    if b"_" in tok:  # Python accepts 1_000, numpy does not
        raise ValueError(f"{tok[:40]!r} is not a number")
    if low.lstrip(b"+-").startswith(b"nan(") and low.endswith(b")"):
        low = low[:low.index(b"(")]
    try:
        return float(low)
    except ValueError:
        raise ValueError(f"{tok[:40]!r} is not a number") from None


def parse_numpy(raw, start: int) -> np.ndarray:
    """The vectorised parser (path 2 of the module docstring)."""
    if start < 16:  # the unaligned loads reach up to 16 bytes before a token
        raw, start = b" " * 16 + bytes(raw[start:]), 16
    b = np.frombuffer(raw, np.uint8)
    sep = np.flatnonzero(b[start - 1:] <= 32) + (start - 1)
    c = b[sep]
    if not ((c == 32) | ((c >= 9) & (c <= 13))).all():
        raise ValueError("control character in the body")
    if b[-1] > 32:  # the last token runs to the end of the buffer
        sep = np.append(sep, len(b))
    s = sep[:-1] + 1
    length = sep[1:] - s
    if not (length > 0).all():
        keep = length > 0
        s, length = s[keep], length[keep]
    n = len(s)
    if n == 0:
        return np.zeros(0)
    words = np.ndarray((len(b) - 7,), dtype="<u8", buffer=b, strides=(1,))  # unaligned loads
    val, M, E = np.empty(n), np.empty(n, np.uint64), np.empty(n, np.int64)
    neg, ok, fast = np.empty(n, bool), np.empty(n, bool), np.empty(n, bool)
    for i in range(0, n, _BLOCK):
        j = slice(i, i + _BLOCK)
        val[j], M[j], E[j], neg[j], ok[j], fast[j] = _block(b, words, s[j], length[j])
    if fast.all():
        return val
    exact = np.flatnonzero(ok & ~fast & (M < U(1 << 52)) & (np.abs(E) < 1024))
    if exact.size:  # one Python conversion per distinct (M, E)
        key = (M[exact].view(np.int64) << 11) | (E[exact] + 1024)
        uniq, inv = np.unique(key, return_inverse=True)
        uval = np.array([float(f"{k >> 11}e{(k & 2047) - 1024}") for k in uniq.tolist()])
        v = uval[inv]
        val[exact] = np.where(neg[exact], -v, v)
        fast[exact] = True
    cache: Dict[bytes, float] = {}
    for i in np.flatnonzero(~fast).tolist():  # nan, inf, long tokens, garbage
        tok = bytes(raw[s[i]:s[i] + length[i]])
        if tok not in cache:
            cache[tok] = _python_float(tok)
        val[i] = cache[tok]
    return val


_pyarrow = None


def _arrow_modules():
    global _pyarrow
    if _pyarrow is None:
        try:
            _pyarrow = (importlib.import_module("pyarrow"), importlib.import_module("pyarrow.csv"))
        except ImportError:
            _pyarrow = ()
    return _pyarrow


def parse_arrow(raw, start: int, columns: int) -> Optional[np.ndarray]:
    """Path 1: a (rows * columns,) float64 array, or None where it does not apply."""
    mods = _arrow_modules()
    if not mods or columns < 1:
        return None
    pa, pcsv = mods
    mv = memoryview(raw)[start:]
    nl = bytes(mv[:4096]).find(b"\n")
    first = bytes(mv[:nl if nl >= 0 else 4096]).rstrip(b"\r")
    if not first or first.count(b" ") != columns - 1 or b"  " in first or first[:1] == b" " \
            or first[-1:] == b" " or b"\t" in first:
        return None
    names = [f"c{i}" for i in range(columns)]
    try:
        table = pcsv.read_csv(
            pa.py_buffer(mv),
            read_options=pcsv.ReadOptions(column_names=names, use_threads=False, block_size=1 << 24),
            parse_options=pcsv.ParseOptions(delimiter=" ", quote_char=False, double_quote=False,
                                            escape_char=False, newlines_in_values=False),
            convert_options=pcsv.ConvertOptions(column_types={c: pa.float64() for c in names},
                                                null_values=[], strings_can_be_null=False,
                                                quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if any(col.null_count for col in table.columns):
        return None
    out = np.empty((table.num_rows, columns))
    for i, col in enumerate(table.columns):
        out[:, i] = col.to_numpy()
    return out.reshape(-1)


def parse_ascii_floats(raw, start: int, columns: int = 0) -> np.ndarray:
    """Every number in ``raw[start:]`` as float64 (see the module docstring).

    ``columns``: numbers per line when known (enables the pyarrow path).
    """
    out = parse_arrow(raw, start, columns)
    return parse_numpy(raw, start) if out is None else out
