"""Pinhole RGB + depth cameras by ray casting (one ray per pixel centre).

Camera frame: UE4 style like CARLA, x forward (optical axis), y right, z up;
pixel ``(col, row)``'s ray goes through ``u = col + 0.5, v = row + 0.5``:
direction ``(1, (u - cx) / fx, -(v - cy) / fy)``. This is the inverse of
:func:`opencood_ext.sim.world.project_points`, so a world point seen by the
camera projects into the pixel whose ray hit it.

Shading: per-surface colour (ground material raster, facade windows) times
ambient + Lambert sun term (both faces lit; hard shadows by occlusion rays
when enabled), a light distance haze, and a sky gradient where nothing is hit.
Depth is planar (along x, CARLA's depth camera), 1000 m for sky.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .scene import RayScene, along_rays, rotate
from .world import CameraSpec

SKY_HORIZON = np.array([0.80, 0.86, 0.93], np.float32)
SKY_ZENITH = np.array([0.36, 0.56, 0.86], np.float32)
FAR = 1000.0


@dataclass
class CameraRender:
    """image: (H, W, 3) uint8 RGB; depth: (H, W) float32 metres along the
    optical axis (1000 for sky); object_id: (H, W) int64 labelled object per
    pixel (-1: none)."""

    image: np.ndarray
    depth: np.ndarray
    object_id: np.ndarray


class CameraModel:
    """Pixel rays of one :class:`CameraSpec`; :meth:`render` draws a frame."""

    def __init__(self, spec: CameraSpec):
        self.spec = spec
        K = spec.K
        col, row = np.meshgrid(np.arange(spec.width) + 0.5, np.arange(spec.height) + 0.5)
        d = np.stack([np.ones_like(col), (col - K[0, 2]) / K[0, 0], -(row - K[1, 2]) / K[1, 1]], -1).reshape(-1, 3)
        norm = np.linalg.norm(d, axis=1, keepdims=True)
        self.directions = (d / norm).astype(np.float32)   # unit, camera frame
        self.forward = (1.0 / norm[:, 0]).astype(np.float32)  # x component: planar depth factor

    def render(self, scene: RayScene, T_world_from_camera: np.ndarray, sun_direction: np.ndarray,
               shadows: bool = True, exclude_ids: Sequence[int] = ()) -> CameraRender:
        """``sun_direction``: (3,) unit vector pointing TOWARD the sun (world);
        objects in ``exclude_ids`` (the camera's own vehicle) are see-through."""
        sp = self.spec
        T = np.asarray(T_world_from_camera, np.float64)
        dirs = rotate(self.directions, T[:3, :3])
        origin = T[:3, 3].astype(np.float32)
        hits = scene.cast(origin, dirs)
        excl = np.asarray(exclude_ids, np.int64)
        for _ in range(4 if len(excl) else 0):   # continue rays through the excluded objects
            again = np.nonzero(np.isin(scene.object_ids(hits), excl))[0]
            if not len(again):
                break
            start = origin + dirs[again] * (hits.t[again, None] + 0.01)
            more = scene.cast(start, dirs[again])
            hits.t[again] = np.where(more.hit, more.t + hits.t[again] + 0.01, np.inf)
            hits.surface[again] = more.surface
            hits.normal[again] = more.normal
        hit = hits.hit
        t = np.where(hit, hits.t, 0.0).astype(np.float32)
        pts = along_rays(origin, dirs, t)
        color, _ = scene.material(hits, pts)
        n = hits.normal                                   # unit, unoriented
        toward_cam = -np.sign(np.einsum("ij,ij->i", n, dirs))   # turns n toward the camera
        sun = np.asarray(sun_direction, np.float32)
        lambert = np.maximum(toward_cam * (n[:, 0] * sun[0] + n[:, 1] * sun[1] + n[:, 2] * sun[2]), 0.0)
        if shadows:
            idx = np.nonzero(hit & (lambert > 0))[0]
            push = 0.03 * toward_cam.take(idx)   # off the surface, toward the camera
            start = np.empty((len(idx), 3), np.float32)
            for k in range(3):
                np.add(pts[:, k].take(idx), n[:, k].take(idx) * push, out=start[:, k])
            lambert[idx] *= ~scene.occluded(start, np.broadcast_to(sun, (len(idx), 3)))
        haze = 1.0 - np.exp(-t / 450.0)
        shade = (0.42 + 0.62 * lambert) * (1.0 - haze)
        # colour * shade + haze * horizon and the sky gradient, column by column (float32, the same
        # operations as broadcasting over rows of 3, which runs numpy's inner loop once per row)
        rgb = np.empty((len(t), 3), np.float32)
        tmp = np.empty(len(t), np.float32)
        sky = ~hit
        elev = np.clip(dirs[sky, 2], 0.0, 1.0)[:, None] ** 0.6
        elev = elev[:, 0]
        below = 1 - elev
        sky_rgb = np.empty((len(elev), 3), np.float32)
        for k in range(3):
            col = rgb[:, k]
            np.multiply(color[:, k], shade, out=col)
            col += np.multiply(haze, SKY_HORIZON[k], out=tmp)
            np.multiply(below, SKY_HORIZON[k], out=sky_rgb[:, k])
            sky_rgb[:, k] += SKY_ZENITH[k] * elev
        rgb[sky] = sky_rgb
        image = (np.clip(rgb, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8).reshape(sp.height, sp.width, 3)
        depth = np.where(hit, t * self.forward, FAR).astype(np.float32).reshape(sp.height, sp.width)
        return CameraRender(image, depth, scene.object_ids(hits).reshape(sp.height, sp.width))
