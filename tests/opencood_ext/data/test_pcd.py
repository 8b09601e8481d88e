"""PCD reading/writing (ascii, binary, binary_compressed) and the LZF codec."""
import logging
import struct
from pathlib import Path

import numpy as np
import pytest

from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.formats import lzf as lzf_module
from opencood_ext.data.formats.lzf import (HAVE_COMPILED_LZF, LZFError, lzf_compress, lzf_decompress,
                                           lzf_decompress_c, lzf_decompress_py)
from opencood_ext.data.formats.pcd import pack_intensity_rgb, read_pcd, write_pcd

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures"
FIXTURE_PCD = FIXTURES / "v2xset_real/validate/2021_08_21_17_30_41/4279/000069.pcd"


def _fixture():
    if not FIXTURE_PCD.exists():
        pytest.skip("../shared/fixtures is not present (a user's clone)")
    return FIXTURE_PCD


def _random_points(n=300, seed=0):
    rng = np.random.default_rng(seed)
    pts = np.empty((n, 4), np.float32)
    pts[:, :3] = rng.normal(0, 30, (n, 3))
    pts[:, 3] = rng.integers(0, 256, n) / 255.0
    return pts


def _header(fields, sizes, types, counts, n, data, width=None, points=None):
    return ("VERSION 0.7\n"
            f"FIELDS {' '.join(fields)}\nSIZE {' '.join(map(str, sizes))}\n"
            f"TYPE {' '.join(types)}\nCOUNT {' '.join(map(str, counts))}\n"
            f"WIDTH {n if width is None else width}\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\n"
            f"POINTS {n if points is None else points}\nDATA {data}\n").encode()


# --------------------------------------------------------------------------- the real OPV2V file

def test_fixture_ascii_rgb_intensity():
    pts = read_pcd(_fixture())
    assert pts.dtype == np.float32 and pts.shape == (39719, 4)
    np.testing.assert_allclose(pts[0, :3], [-68.34235382, -1.954882282e-05, 2.386561155], rtol=1e-7)
    assert pts[0, 3] == np.float32(194) / np.float32(255)
    # independent decode: loadtxt + bit pattern of the packed rgb float
    ref = np.loadtxt(FIXTURE_PCD, skiprows=11, dtype=np.float64)
    red = (ref[:, 3].astype(np.float32).view(np.uint32) >> 16) & 0xFF
    np.testing.assert_array_equal(pts[:, :3], ref[:, :3].astype(np.float32))
    np.testing.assert_array_equal(np.rint(pts[:, 3] * 255).astype(int), red)
    assert 0.0 <= pts[:, 3].min() and pts[:, 3].max() <= 1.0


def test_ascii_writer_reproduces_opv2v_bytes(tmp_path):
    src = _fixture()
    out = write_pcd(tmp_path / "copy.pcd", read_pcd(src), data="ascii")
    assert out.read_bytes() == src.read_bytes()


# --------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("data", ["ascii", "binary", "binary_compressed"])
@pytest.mark.parametrize("fourth", ["rgb", "intensity"])
def test_round_trip(tmp_path, data, fourth):
    pts = _random_points()
    path = write_pcd(tmp_path / "p.pcd", pts, data=data, fourth=fourth)
    back = read_pcd(path)
    assert back.dtype == np.float32 and back.shape == pts.shape
    np.testing.assert_array_equal(back[:, :3], pts[:, :3])
    np.testing.assert_allclose(back[:, 3], pts[:, 3], atol=1e-6)
    again = write_pcd(tmp_path / "q.pcd", pts, data=data, fourth=fourth)
    assert again.read_bytes() == path.read_bytes()  # deterministic


def test_rgb_packing_matches_opv2v():
    bits = pack_intensity_rgb(np.array([194 / 255.0])).view(np.uint32)[0]
    assert bits == 0x00C20000
    assert np.isclose(pack_intensity_rgb(np.array([194 / 255.0]))[0], 1.781608625e-38, rtol=1e-9)


def test_compressed_is_smaller_and_empty_cloud(tmp_path):
    pts = _random_points(2000)
    pts[:, 2] = 1.5  # a flat, compressible column
    comp = write_pcd(tmp_path / "c.pcd", pts, data="binary_compressed")
    raw = write_pcd(tmp_path / "b.pcd", pts, data="binary")
    assert comp.stat().st_size < raw.stat().st_size
    for data in ("ascii", "binary", "binary_compressed"):
        empty = read_pcd(write_pcd(tmp_path / f"e_{data}.pcd", np.zeros((0, 4)), data=data))
        assert empty.shape == (0, 4)


# --------------------------------------------------------------------------- header variants

def test_fields_any_order_extra_fields_and_types(tmp_path):
    n = 5
    rng = np.random.default_rng(1)
    rec = np.zeros(n, dtype=[("intensity", "<u2"), ("pad", "u1"), ("normal", "<f4", (3,)),
                             ("z", "<f8"), ("x", "<f4"), ("ring", "<i4"), ("y", "<f4")])
    rec["intensity"] = rng.integers(0, 60000, n)
    rec["normal"] = rng.normal(size=(n, 3))
    rec["x"], rec["y"], rec["z"] = rng.normal(size=(3, n))
    hdr = _header(["intensity", "_", "normal", "z", "x", "ring", "y"], [2, 1, 4, 8, 4, 4, 4],
                  ["U", "U", "F", "F", "F", "I", "F"], [1, 1, 3, 1, 1, 1, 1], n, "binary")
    path = tmp_path / "mixed.pcd"
    path.write_bytes(hdr + rec.tobytes())
    pts = read_pcd(path)
    np.testing.assert_array_equal(pts[:, 0], rec["x"])
    np.testing.assert_array_equal(pts[:, 1], rec["y"])
    np.testing.assert_array_equal(pts[:, 2], rec["z"].astype(np.float32))
    np.testing.assert_allclose(pts[:, 3], rec["intensity"] / 65535.0, rtol=1e-6)  # detected scale
    np.testing.assert_allclose(read_pcd(path, intensity_scale=60000)[:, 3], rec["intensity"] / 60000.0,
                               rtol=1e-6)


def test_dair_style_intensity_field(tmp_path):
    pts = np.array([[1, 2, 3, 0], [4, 5, 6, 128], [7, 8, 9, 255]], np.float32)
    path = tmp_path / "dair.pcd"
    path.write_bytes(_header(["x", "y", "z", "intensity"], [4] * 4, ["F"] * 4, [1] * 4, 3, "binary")
                     + pts.tobytes())
    np.testing.assert_allclose(read_pcd(path, intensity_scale=256)[:, 3], [0, 0.5, 255 / 256])
    np.testing.assert_allclose(read_pcd(path)[:, 3], [0, 128 / 255, 1.0])  # auto: 255


def test_compressed_uint_rgb_field_and_no_intensity(tmp_path):
    n = 4
    xyz = np.arange(n * 3, dtype="<f4").reshape(n, 3)
    rgb = np.array([0x00FF0000, 0x00800000, 0, 0x0001FFFF], "<u4")
    soa = xyz[:, 0].tobytes() + xyz[:, 1].tobytes() + xyz[:, 2].tobytes() + rgb.tobytes()
    comp = lzf_compress(soa)
    path = tmp_path / "c.pcd"
    path.write_bytes(_header(["x", "y", "z", "rgb"], [4] * 4, ["F", "F", "F", "U"], [1] * 4, n,
                             "binary_compressed") + struct.pack("<II", len(comp), len(soa)) + comp)
    pts = read_pcd(path)
    np.testing.assert_array_equal(pts[:, :3], xyz)
    np.testing.assert_allclose(pts[:, 3], [1.0, 128 / 255, 0.0, 1 / 255])
    only_xyz = tmp_path / "xyz.pcd"
    only_xyz.write_bytes(_header(["x", "y", "z"], [4] * 3, ["F"] * 3, [1] * 3, n, "binary") + xyz.tobytes())
    assert (read_pcd(only_xyz)[:, 3] == 0).all()


def test_nan_rows_dropped_and_logged(tmp_path, caplog):
    pts = _random_points(10)
    pts[[2, 7], 1] = np.nan
    path = write_pcd(tmp_path / "nan.pcd", pts, data="ascii")
    with caplog.at_level(logging.INFO, logger="opencood_ext.data.formats.pcd"):
        back = read_pcd(path)
    assert back.shape == (8, 4)
    assert "dropped 2 of 10" in caplog.text and "nan.pcd" in caplog.text


# --------------------------------------------------------------------------- bad input

def _write_raw(tmp_path, name, content: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(content)
    return p


def _expect(path, *words):
    with pytest.raises(DataFormatError) as ei:
        read_pcd(path)
    msg = str(ei.value)
    assert str(path) in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def test_truncated_binary(tmp_path):
    full = write_pcd(tmp_path / "full.pcd", _random_points(50), data="binary").read_bytes()
    _expect(_write_raw(tmp_path, "trunc.pcd", full[:-7]), "truncated", "POINTS 50")


def test_truncated_compressed(tmp_path):
    full = write_pcd(tmp_path / "full.pcd", _random_points(50), data="binary_compressed").read_bytes()
    _expect(_write_raw(tmp_path, "trunc_c.pcd", full[:-20]), "truncated")


def test_corrupt_compressed_stream(tmp_path):
    n = 8
    soa = np.zeros(n * 4, "<f4").tobytes()
    bad = bytes([0x20 | 0x1F, 0xFF])  # back reference before the start of the data
    p = _write_raw(tmp_path, "corrupt.pcd", _header(["x", "y", "z", "rgb"], [4] * 4, ["F"] * 4, [1] * 4, n,
                                                    "binary_compressed")
                   + struct.pack("<II", len(bad), len(soa)) + bad)
    _expect(p, "corrupt binary_compressed")


def test_ascii_count_mismatch(tmp_path):
    body = b"1 2 3 0\n4 5 6 0\n7 8 9 0\n"
    p = _write_raw(tmp_path, "count.pcd", _header(["x", "y", "z", "rgb"], [4] * 4, ["F"] * 4, [1] * 4, 4, "ascii")
                   + body)
    _expect(p, "header/count mismatch", "12 values", "16")


def test_ascii_not_a_number(tmp_path):
    body = b"1 2 3 0\n4 5 oops 0\n"
    p = _write_raw(tmp_path, "nan_tok.pcd", _header(["x", "y", "z", "rgb"], [4] * 4, ["F"] * 4, [1] * 4, 2,
                                                    "ascii") + body)
    _expect(p, "line 2", "oops")


def test_width_points_mismatch(tmp_path):
    p = _write_raw(tmp_path, "wh.pcd", _header(["x", "y", "z"], [4] * 3, ["F"] * 3, [1] * 3, 3, "ascii",
                                               width=4) + b"1 2 3\n" * 3)
    _expect(p, "WIDTH*HEIGHT", "POINTS")


@pytest.mark.parametrize("content, words", [
    (b"VERSION 0.7\nSIZE 4 4 4\nTYPE F F F\nPOINTS 1\nDATA ascii\n1 2 3\n", ["missing FIELDS"]),
    (b"FIELDS x y z\nSIZE 4 4\nTYPE F F F\nPOINTS 1\nDATA ascii\n1 2 3\n", ["3 FIELDS but 2 SIZE"]),
    (b"FIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nPOINTS 1\nDATA zipped\n1 2 3\n", ["unknown DATA kind", "zipped"]),
    (b"FIELDS x y z\nSIZE 4 4 3\nTYPE F F F\nPOINTS 1\nDATA ascii\n1 2 3\n", ["unsupported TYPE F with SIZE 3"]),
    (b"FIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nPOINTS 1\n1 2 3\n", ["malformed header"]),
    (b"FIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nPOINTS one\nDATA ascii\n1 2 3\n", ["POINTS", "integers"]),
    (b"FIELDS a b c\nSIZE 4 4 4\nTYPE F F F\nPOINTS 1\nDATA ascii\n1 2 3\n", ["no 'x'"]),
])
def test_malformed_headers(tmp_path, content, words):
    _expect(_write_raw(tmp_path, "bad_header.pcd", content), *words)


def test_missing_file(tmp_path):
    _expect(tmp_path / "absent.pcd", "cannot read")


def test_write_rejects_bad_shapes(tmp_path):
    with pytest.raises(ValueError, match="points must be"):
        write_pcd(tmp_path / "x.pcd", np.zeros((3, 5)))
    with pytest.raises(ValueError, match="data must be"):
        write_pcd(tmp_path / "x.pcd", np.zeros((3, 4)), data="zip")


# --------------------------------------------------------------------------- LZF

# both decoders: liblzf (python-lzf, when installed) and the pure-Python fallback
DECODERS = [pytest.param(lzf_decompress_py, id="python"),
            pytest.param(lzf_decompress_c, id="liblzf", marks=pytest.mark.skipif(
                not HAVE_COMPILED_LZF, reason="python-lzf is not installed"))]


@pytest.mark.parametrize("decode", DECODERS)
def test_lzf_hand_made_stream(decode):
    # literal "abc", then a back reference distance 3 length 7 (overlapping: repeats "abc")
    stream = bytes([2]) + b"abc" + bytes([(5 << 5) | 0, 2])
    assert decode(stream, 10) == b"abcabcabca"
    # long match (length code 7 + extra byte)
    stream = bytes([0]) + b"z" + bytes([(7 << 5) | 0, 10, 0])
    assert decode(stream, 1 + 19) == b"z" * 20
    assert decode(b"", 0) == b""


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize("stream, size, words", [
    (bytes([5]) + b"ab", 6, "past the end"),
    (bytes([0]) + b"a" + bytes([0x20]), 4, "cut off"),
    (bytes([0]) + b"a" + bytes([0x20, 5]), 4, "before the start"),
    (bytes([1]) + b"ab", 5, "expected 5"),
    (bytes([2]) + b"abc" + bytes([(5 << 5) | 0, 2]), 8, "past the expected 8"),
    (b"", 3, "expected 3"),
])
def test_lzf_corrupt_streams(decode, stream, size, words):
    with pytest.raises(LZFError, match=words):
        decode(stream, size)


@pytest.mark.parametrize("seed, alphabet, n", [(0, 256, 5000), (1, 3, 20000), (2, 2, 70), (3, 256, 3)])
def test_lzf_round_trip(seed, alphabet, n):
    data = np.random.default_rng(seed).integers(0, alphabet, n).astype(np.uint8).tobytes()
    data += data[: n // 2] + b"\x00" * 1000  # long-distance repeats and runs
    comp = lzf_compress(data)
    assert lzf_decompress(comp, len(data)) == data
    assert lzf_decompress_py(comp, len(data)) == data
    assert comp == lzf_compress(data)
    if alphabet <= 3:
        assert len(comp) < len(data)


@pytest.mark.skipif(not HAVE_COMPILED_LZF, reason="python-lzf is not installed")
def test_lzf_decoders_agree_byte_for_byte(tmp_path):
    """liblzf and the Python decoder on our writer's streams and on liblzf's own (Open3D's)."""
    import lzf as liblzf

    rng = np.random.default_rng(7)
    pts = _random_points(20000, seed=7)
    pts[::7, 3] = 0.0
    for data in (np.ascontiguousarray(pts.T).tobytes(), rng.integers(0, 4, 50000).astype(np.uint8).tobytes()):
        for comp in (lzf_compress(data), liblzf.compress(data)):
            assert lzf_decompress_c(comp, len(data)) == lzf_decompress_py(comp, len(data)) == data
    assert lzf_decompress is not lzf_decompress_py and lzf_module._C_DECOMPRESS is not None


def test_read_pcd_uses_the_python_decoder_when_liblzf_is_missing(tmp_path, monkeypatch):
    pts = _random_points(500, seed=8)
    path = write_pcd(tmp_path / "c.pcd", pts, data="binary_compressed")
    fast = read_pcd(path)
    monkeypatch.setattr(lzf_module, "_C_DECOMPRESS", None)
    np.testing.assert_array_equal(read_pcd(path), fast)
    np.testing.assert_array_equal(fast, read_pcd(write_pcd(tmp_path / "b.pcd", pts, data="binary")))


def test_compressed_size_prefix_beyond_lzf_ratio(tmp_path):
    n = 1000
    p = _write_raw(tmp_path, "ratio.pcd", _header(["x", "y", "z", "rgb"], [4] * 4, ["F"] * 4, [1] * 4, n,
                                                  "binary_compressed")
                   + struct.pack("<II", 3, n * 16) + bytes([0, 0, 0]))
    _expect(p, "cannot hold", str(n * 16))


def test_open3d_reads_our_files(tmp_path):
    try:
        import open3d as o3d
    except ImportError as exc:  # open3d needs libusb at import
        pytest.skip(f"open3d does not import here: {exc}")
    pts = _random_points(400)
    for data in ("ascii", "binary", "binary_compressed"):
        path = write_pcd(tmp_path / f"{data}.pcd", pts, data=data)
        pc = o3d.io.read_point_cloud(str(path))
        np.testing.assert_allclose(np.asarray(pc.points), pts[:, :3], atol=1e-5)
        np.testing.assert_allclose(np.asarray(pc.colors)[:, 0], pts[:, 3], atol=1e-6)


def test_we_read_open3d_files(tmp_path):
    try:
        import open3d as o3d
    except ImportError as exc:
        pytest.skip(f"open3d does not import here: {exc}")
    pts = _random_points(400, seed=5)
    pc = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(pts[:, :3].astype(np.float64)))
    pc.colors = o3d.utility.Vector3dVector(np.stack([pts[:, 3], np.zeros(400), np.zeros(400)], 1))
    for name, kw in (("a", dict(write_ascii=True)), ("b", {}), ("c", dict(compressed=True))):
        path = tmp_path / f"o3d_{name}.pcd"
        assert o3d.io.write_point_cloud(str(path), pc, **kw)
        back = read_pcd(path)
        np.testing.assert_allclose(back[:, :3], pts[:, :3], atol=1e-5)
        np.testing.assert_allclose(back[:, 3], pts[:, 3], atol=0.5 / 255 + 1e-6)
    assert b"binary_compressed" in (tmp_path / "o3d_c.pcd").read_bytes()[:400]
