"""An animated GIF written to disk one frame at a time (constant memory in the frame count).

Pillow's ``save_all`` keeps every frame in memory until the file is written (the
live demo grew by 285 MB over 800 ticks). :class:`GifStream` writes the GIF89a
container itself and lets Pillow encode each frame alone: the frame is quantised
to its own adaptive palette, saved as a one-frame GIF in memory, and that file's
palette and LZW image data become one frame of the stream (a local colour table,
a graphic-control block with the delay). Only the frame being added is held.

Layout written (GIF89a spec): header, logical screen (the first frame's size, no
global colour table), NETSCAPE2.0 loop block, then per frame: graphic control
extension (delay, disposal "leave in place"), image descriptor with local colour
table, LZW data; a trailer on ``close()``. Frames of another size are resized to
the first frame's.
"""
from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Tuple

from PIL import Image


def _sub_blocks_end(data: bytes, pos: int) -> int:
    """Position after the data sub-blocks starting at ``pos`` (ends with a 0-size block)."""
    while True:
        size = data[pos]
        pos += 1 + size
        if size == 0:
            return pos


def _encode_frame(image: Image.Image) -> Tuple[bytes, int, bytes]:
    """(colour table, its size bits, LZW data incl. min code size and sub-blocks) of ``image``
    (mode P) as Pillow encodes it in a one-frame GIF."""
    buf = io.BytesIO()
    image.save(buf, format="GIF", interlace=False)  # the stream's descriptors say non-interlaced
    data = buf.getvalue()
    if data[:6] not in (b"GIF87a", b"GIF89a"):
        raise ValueError("Pillow did not write a GIF")
    packed = data[10]
    pos = 13
    table, bits = b"", 0
    if packed & 0x80:
        bits = packed & 0x07
        table = data[pos:pos + 3 * (2 << bits)]
        pos += len(table)
    while data[pos] == 0x21:  # extensions before the image: skip them
        pos = _sub_blocks_end(data, pos + 2)
    if data[pos] != 0x2C:
        raise ValueError(f"unexpected GIF block 0x{data[pos]:02x}")
    desc = data[pos + 1:pos + 10]
    pos += 10
    if desc[8] & 0x80:  # a local table overrides the global one
        bits = desc[8] & 0x07
        table = data[pos:pos + 3 * (2 << bits)]
        pos += len(table)
    if not table:
        raise ValueError("GIF frame without a colour table")
    start = pos
    return table, bits, data[start:_sub_blocks_end(data, pos + 1)]


class GifStream:
    """``add(image)`` appends a frame to ``path``; ``close()`` finishes the file.

    duration_ms: display time per frame (GIF stores hundredths of a second);
    loop: 0 = forever. Usable as a context manager.
    """

    def __init__(self, path, duration_ms: int = 200, loop: int = 0):
        self.path = Path(path)
        self.delay = max(1, round(duration_ms / 10))
        self.loop = loop
        self.size: Tuple[int, int] = (0, 0)
        self.frames = 0
        self._fh = None

    def add(self, image: Image.Image) -> None:
        if self._fh is None:
            self.size = image.size
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "wb")
            w, h = self.size
            self._fh.write(b"GIF89a" + struct.pack("<HHBBB", w, h, 0, 0, 0))
            self._fh.write(b"\x21\xff\x0bNETSCAPE2.0\x03\x01" + struct.pack("<H", self.loop) + b"\x00")
        if image.size != self.size:
            image = image.resize(self.size)
        if image.mode != "P":
            image = image.convert("P", palette=Image.ADAPTIVE)  # as the old save_all path did
        table, bits, lzw = _encode_frame(image)
        w, h = self.size
        self._fh.write(b"\x21\xf9\x04" + struct.pack("<BHBB", 1 << 2, self.delay, 0, 0))
        self._fh.write(b"\x2c" + struct.pack("<HHHHB", 0, 0, w, h, 0x80 | bits) + table + lzw)
        self._fh.flush()
        self.frames += 1

    def close(self) -> None:
        if self._fh is not None and not self._fh.closed:
            self._fh.write(b"\x3b")
            self._fh.close()

    def __enter__(self) -> "GifStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
