"""Bird's-eye-view plots of points, ground truth and detections (matplotlib, Agg).

Everything is drawn in one sensor frame (usually the ego LiDAR). OPV2V-family
frames are LEFT-handed (x forward, y right); ``flip_y=True`` mirrors y on screen
so the picture looks like a map seen from above, as a right-handed plot would.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .geometry import boxes_to_corners, relative_transform, transform_points  # noqa: E402

_AGENT_COLOURS = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]


def draw_boxes(ax, boxes, colour: str, flip_y: bool, label: Optional[str] = None, lw: float = 1.2,
               heading: bool = True):
    """Draw (N, 7) boxes' bottom faces; a short stroke marks the front."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    sy = -1.0 if flip_y else 1.0
    for i, c in enumerate(boxes_to_corners(boxes)[:, :4, :2]):
        poly = np.vstack([c, c[:1]])
        ax.plot(poly[:, 0], sy * poly[:, 1], color=colour, lw=lw, label=label if i == 0 else None)
        if heading:
            front = c[:2].mean(axis=0)
            centre = c.mean(axis=0)
            ax.plot([centre[0], front[0]], [sy * centre[1], sy * front[1]], color=colour, lw=lw)


def plot_bev(path, points: Sequence[np.ndarray] = (), gt_boxes=None, pred_boxes=None,
             lidar_range=None, title: str = "", flip_y: bool = True, agent_labels: Sequence[str] = (),
             agent_positions=None, max_points: int = 60000, size: float = 8.0):
    """Write a BEV PNG.

    points: per-agent (N_i, 3+) arrays already in the plot frame (one colour each).
    gt_boxes / pred_boxes: (G, 7) / (P, 7) in the plot frame (green / red).
    agent_positions: (A, 2) xy of the agents, drawn as triangles.
    """
    fig, ax = plt.subplots(figsize=(size, size), dpi=100)
    sy = -1.0 if flip_y else 1.0
    rng = np.random.default_rng(0)
    for i, pts in enumerate(points):
        pts = np.asarray(pts)
        if len(pts) > max_points:
            pts = pts[rng.choice(len(pts), max_points, replace=False)]
        label = agent_labels[i] if i < len(agent_labels) else f"agent {i}"
        ax.scatter(pts[:, 0], sy * pts[:, 1], s=0.15, c=_AGENT_COLOURS[i % len(_AGENT_COLOURS)],
                   label=label, rasterized=True)
    if gt_boxes is not None and len(gt_boxes):
        draw_boxes(ax, gt_boxes, "#2ca02c", flip_y, label="ground truth", lw=1.5)
    if pred_boxes is not None and len(pred_boxes):
        draw_boxes(ax, pred_boxes, "#d62728", flip_y, label="detections", lw=1.0)
    if agent_positions is not None:
        pos = np.asarray(agent_positions, dtype=float).reshape(-1, 2)
        ax.scatter(pos[:, 0], sy * pos[:, 1], marker="^", s=80, c="k", label="agents", zorder=5)
    if lidar_range is not None:
        r = lidar_range
        ax.set_xlim(r[0], r[3])
        ax.set_ylim(sorted([sy * r[1], sy * r[4]]))
    ax.set_aspect("equal")
    ax.set_xlabel("x forward [m]")
    ax.set_ylabel("-y [m] (left-handed frame shown mirrored)" if flip_y else "y [m]")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        leg = ax.legend(loc="upper right", fontsize=8, markerscale=8)
        for h in leg.legend_handles:
            if hasattr(h, "set_sizes"):
                h.set_sizes([20])
    ax.grid(alpha=0.3)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def plot_agents_bev(path, agents, gt_boxes=None, pred_boxes=None, **kw):
    """:func:`plot_bev` of AgentObs ``agents`` (ego first) in the ego's LiDAR frame:
    each agent's points and position, labelled ``id (type)``; ``kw`` as plot_bev."""
    T_ego = [relative_transform(agents[0].T_world_from_lidar, a.T_world_from_lidar) for a in agents]
    return plot_bev(path, [transform_points(T, a.lidar) for T, a in zip(T_ego, agents)], gt_boxes=gt_boxes,
                    pred_boxes=pred_boxes, agent_labels=[f"{a.agent_id} ({a.agent_type})" for a in agents],
                    agent_positions=[T[:2, 3] for T in T_ego], **kw)
