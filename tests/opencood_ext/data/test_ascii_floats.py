"""The bulk ASCII number parser: bit-identical to np.fromstring on every path."""
import random
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.data.formats import ascii_floats
from opencood_ext.data.formats.ascii_floats import parse_arrow, parse_ascii_floats, parse_numpy
from opencood_ext.data.formats.pcd import parse_header, read_pcd

FIXTURE_PCD = (Path(__file__).resolve().parents[4] / "shared" / "fixtures"
               / "v2xset_real/validate/2021_08_21_17_30_41/4279/000069.pcd")
HEAD = b"# a header line\nDATA ascii\n"  # the parser only needs the body's offset


def _fromstring(body: bytes) -> np.ndarray:
    return np.fromstring(body.decode("ascii"), dtype=np.float64, sep=" ")


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, NaNs (whose payload numpy does not define) compared as NaN."""
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    keep = ~np.isnan(a)
    return np.array_equal(a[keep].view(np.int64), b[keep].view(np.int64))


def _check(tokens, seps=None):
    seps = seps or [" "] * len(tokens)
    body = "".join(t + s for t, s in zip(tokens, seps)).encode()
    got = parse_numpy(HEAD + body, len(HEAD))
    ref = _fromstring(body)
    bad = [tokens[i] for i in np.flatnonzero(got.view(np.int64) != ref.view(np.int64))[:5]] \
        if got.shape == ref.shape else "shape"
    assert _same(got, ref), bad


def _fixture():
    if not FIXTURE_PCD.exists():
        pytest.skip("../shared/fixtures is not present (a user's clone)")
    raw = FIXTURE_PCD.read_bytes()
    return raw, parse_header(raw, FIXTURE_PCD).body_offset


def test_fixture_every_path_matches_fromstring():
    raw, off = _fixture()
    ref = _fromstring(raw[off:])
    assert ref.size == 39719 * 4
    assert _same(parse_numpy(raw, off), ref)
    assert _same(parse_ascii_floats(raw, off, 4), ref)
    if ascii_floats._arrow_modules():
        assert _same(parse_arrow(raw, off, 4), ref)


def test_read_pcd_bit_identical_to_the_fromstring_reader(monkeypatch):
    """The (N, 4) result equals the previous reader's (fromstring -> float32, packed red / 255),
    through pyarrow and through the numpy parser."""
    raw, off = _fixture()
    table = _fromstring(raw[off:]).reshape(-1, 4)
    want = np.empty((len(table), 4), np.float32)
    want[:, :3] = table[:, :3]
    bits = table[:, 3].astype(np.float32).view(np.uint32)
    want[:, 3] = ((bits >> 16) & 0xFF).astype(np.float32) / np.float32(255)
    assert np.array_equal(read_pcd(FIXTURE_PCD).view(np.uint32), want.view(np.uint32))
    monkeypatch.setattr(ascii_floats, "parse_arrow", lambda *a: None)
    assert np.array_equal(read_pcd(FIXTURE_PCD).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", ["%.10g", "%.9g", "%.17g", "%e", "%.3f", "%.0f", "%.15e", "%+.6f",
                                 "%.20f", "%.16g"])
def test_formats_of_float32_values(fmt):
    rng = np.random.default_rng(0)
    vals = rng.standard_normal(3000) * 10.0 ** rng.integers(-9, 9, 3000)
    _check([fmt % v for v in vals.astype(np.float32).astype(np.float64)])


def test_packed_rgb_floats_keep_their_bits():
    """PCL's packed colours are tiny floats (often subnormal); every red byte and random patterns."""
    red = (np.arange(256, dtype=np.uint32) << 16).view(np.float32)
    rng = np.random.default_rng(1)
    rnd = rng.integers(0, 2 ** 32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    rnd = rnd[np.isfinite(rnd)]
    for vals in (red, rnd):
        tokens = ["%.10g" % v for v in vals.astype(np.float64)]
        body = " ".join(tokens).encode() + b"\n"
        got = parse_numpy(HEAD + body, len(HEAD)).astype(np.float32)
        assert np.array_equal(got.view(np.uint32), _fromstring(body).astype(np.float32).view(np.uint32))
        assert np.array_equal(got.view(np.uint32), vals.view(np.uint32))  # %.10g round-trips float32


def test_doubles_integers_and_odd_forms():
    rng = np.random.default_rng(2)
    _check([repr(float(v)) for v in rng.standard_normal(3000) * 10.0 ** rng.integers(-300, 300, 3000)])
    _check([str(i) for i in rng.integers(-10 ** 18, 10 ** 18, 1000)])
    _check([".5", "5.", "-.5", "+5", "1E+05", "1e-0005", "00012.500", "-0", "0", "0.0", "1e22", "1e23",
            "9007199254740993", "123456789012345678", "1.2345678901234567890e10", "nan", "NaN", "inf",
            "-inf", "Infinity", "1e400", "1e-400", "4.9e-324", "2.2250738585072014e-308", "1e0",
            "0.000000000000000000000001", "1234567890123456.", ".1234567890123456", "-1E-0",
            "1e12345", "1e-000000007", "nan(x1)"] * 2)


def test_any_whitespace_separates():
    vals = np.random.default_rng(3).standard_normal(500)
    r = random.Random(3)
    _check(["%.6g" % v for v in vals], [r.choice([" ", "  ", "\t", "\n", "\r\n", " \n "]) for _ in vals])


def test_random_strings_agree_with_fromstring_or_both_reject():
    r = random.Random(4)
    alphabet = "0123456789" * 3 + ".eE+-00"
    for _ in range(3000):
        body = (" ".join("".join(r.choice(alphabet) for _ in range(r.randint(1, 22)))
                         for _ in range(r.randint(1, 4))) + "\n").encode()
        try:
            ref = _fromstring(body)
        except ValueError:
            with pytest.raises(ValueError):
                parse_numpy(HEAD + body, len(HEAD))
            continue
        assert _same(parse_numpy(HEAD + body, len(HEAD)), ref), body


@pytest.mark.parametrize("token", ["1.2.3", "--1", "1e", "e5", ".", "-", "1_0", "0x10", "abc", "1e5e5",
                                   "1.5f", "1,5", "1e+-5", "1..2", "1-2", "5e.5", "\x01"])
def test_garbage_is_rejected(token):
    body = f"1 {token} 2\n".encode()
    with pytest.raises(ValueError):
        _fromstring(body)
    with pytest.raises(ValueError):
        parse_ascii_floats(HEAD + body, len(HEAD), 3)


def test_body_at_buffer_edges():
    assert parse_numpy(HEAD, len(HEAD)).size == 0
    assert _same(parse_numpy(HEAD + b"1.5 -2", len(HEAD)), np.array([1.5, -2.0]))  # no final newline
    assert _same(parse_numpy(b"7 8.25e1", 0), np.array([7.0, 82.5]))  # no room before the body


@pytest.mark.skipif(not ascii_floats._arrow_modules(), reason="pyarrow is not installed")
def test_arrow_path_only_takes_plain_tables():
    assert parse_arrow(HEAD + b"1 2 3\n4 5 6\n", len(HEAD), 3).tolist() == [1, 2, 3, 4, 5, 6]
    for body in (b"1  2 3\n", b"1 2 3 \n", b" 1 2 3\n", b"1\t2 3\n", b"1 2\n", b"1 2 3\n4 5\n",
                 b"1 2 x\n"):
        assert parse_arrow(HEAD + body, len(HEAD), 3) is None, body
    # the layouts it refuses still parse (numpy path), counting every number
    assert parse_ascii_floats(HEAD + b"1  2 3\n4 5 6 \n", len(HEAD), 3).tolist() == [1, 2, 3, 4, 5, 6]
