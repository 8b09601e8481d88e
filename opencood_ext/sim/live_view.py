"""Bird's-eye view of the live demo: one PNG per tick (each agent's points in
the ego frame, detections, ground truth) and an animated GIF streamed to disk
tick by tick (:class:`~opencood_ext.sim.gif_stream.GifStream`: memory does not
grow with the number of ticks); a matplotlib window too when asked for and a
display exists."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from PIL import Image

from opencood_ext.sim.gif_stream import GifStream
from opencood_ext.viz import plot_agents_bev


class LiveView:
    def __init__(self, out_dir, lidar_range, show: bool = False, gif_ms: int = 200):
        self.out = Path(out_dir)
        self.frames_dir = self.out / "frames"
        self.frames_dir.mkdir(parents=True, exist_ok=True)
        self.lidar_range = lidar_range
        self.gif = GifStream(self.out / "live.gif", duration_ms=gif_ms)
        self.window = None
        if show and os.environ.get("DISPLAY"):
            import matplotlib.pyplot as plt
            plt.switch_backend("TkAgg")
            plt.ion()
            self.window = plt.figure(figsize=(8, 8))

    def draw(self, frame, result, title: str) -> Path:
        agents = [frame.agent(i) for i in result.agent_ids]  # ego first
        path = self.frames_dir / f"tick_{result.tick:05d}.png"
        plot_agents_bev(path, agents, gt_boxes=result.gt_boxes, pred_boxes=result.boxes,
                        lidar_range=self.lidar_range, title=title, size=6.0)
        with Image.open(path) as img:
            self.gif.add(img)
        if self.window is not None:
            import matplotlib.image as mpimg
            import matplotlib.pyplot as plt
            self.window.clf()
            self.window.gca().imshow(mpimg.imread(path))
            self.window.gca().axis("off")
            plt.pause(0.001)
        return path

    def finish(self) -> Optional[Path]:
        """Close ``live.gif``; returns its path, or None when no tick was drawn."""
        self.gif.close()
        return self.gif.path if self.gif.frames else None
