"""Bird's-eye view of the live demo: one PNG per tick (each agent's points in
the ego frame, detections, ground truth) and an animated GIF at the end; a
matplotlib window too when asked for and a display exists."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional


from opencood_ext.viz import plot_agents_bev


class LiveView:
    def __init__(self, out_dir, lidar_range, show: bool = False, gif_ms: int = 200):
        self.out = Path(out_dir)
        self.frames_dir = self.out / "frames"
        self.frames_dir.mkdir(parents=True, exist_ok=True)
        self.lidar_range = lidar_range
        self.gif_ms = gif_ms
        self.paths: List[Path] = []
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
        self.paths.append(path)
        if self.window is not None:
            import matplotlib.image as mpimg
            import matplotlib.pyplot as plt
            self.window.clf()
            self.window.gca().imshow(mpimg.imread(path))
            self.window.gca().axis("off")
            plt.pause(0.001)
        return path

    def finish(self) -> Optional[Path]:
        """Write ``live.gif`` from the tick PNGs (Pillow); returns its path or None."""
        if not self.paths:
            return None
        from PIL import Image
        images = [Image.open(p).convert("P", palette=Image.ADAPTIVE) for p in self.paths]
        gif = self.out / "live.gif"
        images[0].save(gif, save_all=True, append_images=images[1:], duration=self.gif_ms, loop=0)
        return gif
