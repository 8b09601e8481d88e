"""The live demo's GIF is streamed: memory does not grow with the number of ticks, and the
file is a valid animation holding every tick's image exactly."""
import weakref

import numpy as np
from PIL import Image

from opencood_ext.sim import live_view
from opencood_ext.sim.gif_stream import GifStream


def _tick_image(k: int, size=(120, 90)) -> Image.Image:
    rng = np.random.default_rng(k)
    arr = np.zeros((size[1], size[0], 3), dtype=np.uint8)
    arr[..., 0] = (k * 7) % 256
    arr[rng.integers(0, size[1], 300), rng.integers(0, size[0], 300)] = [255, 255, 0]  # "points"
    arr[10 + k % 50:20 + k % 50, 10:40] = [0, 200, 0]  # a moving "box"
    return Image.fromarray(arr)


def test_gif_stream_writes_a_valid_animation_frame_by_frame(tmp_path):
    path = tmp_path / "a.gif"
    frames = [_tick_image(k) for k in range(12)]
    with GifStream(path, duration_ms=150) as gif:
        for f in frames:
            gif.add(f)
            assert path.stat().st_size > 0  # on disk as it goes
    with Image.open(path) as img:
        assert img.format == "GIF" and img.n_frames == 12 and img.size == (120, 90)
        assert img.info["loop"] == 0
        for k, f in enumerate(frames):
            img.seek(k)
            assert img.info["duration"] == 150
            want = np.asarray(f.convert("P", palette=Image.ADAPTIVE).convert("RGB"))
            assert np.array_equal(np.asarray(img.convert("RGB")), want), k
    assert path.read_bytes()[-1:] == b"\x3b"  # trailer


def test_live_view_holds_a_bounded_number_of_frames(tmp_path, monkeypatch):
    """Every PIL image LiveView creates is tracked (freed by reference counting as soon as its
    last reference goes): however many ticks, at most a few are alive at once (the old
    finish() held all of them: +285 MB over 800 ticks)."""
    alive = []  # weak references to every image made
    peak = [0]
    real_open, real_convert = Image.open, Image.Image.convert

    def track(img):
        alive.append(weakref.ref(img))
        peak[0] = max(peak[0], sum(r() is not None for r in alive))
        return img

    monkeypatch.setattr(Image, "open", lambda *a, **k: track(real_open(*a, **k)))
    monkeypatch.setattr(Image.Image, "convert", lambda self, *a, **k: track(real_convert(self, *a, **k)))

    def fake_plot(path, agents, **kw):  # the BEV plot itself is not what is measured
        real_convert(_tick_image(int(path.stem.split("_")[1])), "RGB").save(path)

    monkeypatch.setattr(live_view, "plot_agents_bev", fake_plot)

    class _Frame:
        def agent(self, i):
            return i

    class _Result:
        def __init__(self, tick):
            self.tick, self.agent_ids, self.gt_boxes, self.boxes = tick, [], None, None

    peaks = {}
    for ticks in (5, 40):
        peak[0] = 0
        view = live_view.LiveView(tmp_path / f"t{ticks}", (-32, -32, -3, 32, 32, 1))
        for t in range(ticks):
            view.draw(_Frame(), _Result(t), title="t")
        gif = view.finish()
        peaks[ticks] = peak[0]
        with real_open(gif) as img:
            assert img.n_frames == ticks
    assert peaks[40] == peaks[5] <= 3, peaks
