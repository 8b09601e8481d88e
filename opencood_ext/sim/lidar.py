"""Spinning LiDAR by ray casting, following CARLA's ``sensor.lidar.ray_cast``.

* Rays: ``channels`` elevations evenly from ``upper_fov`` (ring 0) down to
  ``lower_fov``; ``points_per_second * dt / channels`` azimuths a channel per
  tick over the swept angle (one full turn at 20 Hz and dt = 0.05 s: 64 x
  1016 = 65,024 rays). Azimuth turns +x toward +y (clockwise seen from above
  in the left-handed frame).
* A return needs a hit within ``range``. Intensity is CARLA's attenuation
  ``exp(-atmosphere_attenuation_rate * d)`` modulated by incidence
  (``1 - 0.15 (1 - |cos|)``) and the surface's reflectivity (0.9-1 for most
  materials, lower for glass and tyres), so most points stay close to CARLA's
  values (real OPV2V files: intensity = exp(-0.004 d)).
* Drop-off as CARLA: a random ``dropoff_general_rate`` share of points, and
  below ``dropoff_intensity_limit`` a point survives with probability
  ``1 - dropoff_zero_intensity * (1 - I / limit)``.
* Range noise: ``d + N(0, noise_stddev)`` along the ray (the direction, hence
  the ring elevation, is exact).
* Points are returned in the LiDAR frame (x forward, y right, z up).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .scene import Hits, RayScene, along_rays, rotate
from .world import LidarSpec

INCIDENCE_WEIGHT = 0.15


@dataclass
class LidarScan:
    """One sweep. points: (N, 4) float32 x, y, z, intensity (LiDAR frame);
    ring: (N,) int16, 0 = top beam; object_id: (N,) int64 labelled object hit
    (-1: none); surface_class: (N,) int16 (``scene.CLASS_NAMES``)."""

    points: np.ndarray
    ring: np.ndarray
    object_id: np.ndarray
    surface_class: np.ndarray

    def keep_rings(self, keep_every: int) -> "LidarScan":
        """The same sweep with only every ``keep_every``-th ring (OPV2V-H 32/16-beam)."""
        m = self.ring % keep_every == 0
        return LidarScan(self.points[m], self.ring[m], self.object_id[m], self.surface_class[m])


class LidarModel:
    """Ray pattern of one :class:`LidarSpec`; :meth:`scan` casts one sweep."""

    def __init__(self, spec: LidarSpec, tick_seconds: float = 0.05):
        self.spec = spec
        ch = spec.channels
        elev = np.linspace(spec.upper_fov, spec.lower_fov, ch) if ch > 1 else np.array([spec.upper_fov])
        rings = np.arange(0, ch, spec.keep_every)
        n_az = spec.rays_per_channel(tick_seconds)
        az = np.radians(np.arange(n_az) * (spec.swept_degrees(tick_seconds) / n_az))
        el = np.radians(elev[rings])
        ce = np.cos(el)[:, None]
        self.directions = np.stack(np.broadcast_arrays(ce * np.cos(az), ce * np.sin(az),
                                                       np.sin(el)[:, None]), -1).reshape(-1, 3).astype(np.float32)
        self.ring = np.repeat(rings, n_az).astype(np.int16)

    @property
    def rays(self) -> int:
        return len(self.directions)

    def scan(self, scene: RayScene, T_world_from_lidar: np.ndarray, rng: np.random.Generator,
             exclude_ids: Sequence[int] = ()) -> LidarScan:
        """Cast one sweep from ``T_world_from_lidar`` (4, 4); returns hit points
        minus those on ``exclude_ids`` (the sensor's own vehicle or pole)."""
        sp = self.spec
        T = np.asarray(T_world_from_lidar, np.float64)
        origin = T[:3, 3].astype(np.float32)
        dirs_w = rotate(self.directions, T[:3, :3])
        hits = scene.cast(origin, dirs_w)
        ok = hits.t <= sp.range                       # inf (no hit) fails too
        obj = scene.object_ids(hits)
        if len(exclude_ids):
            ok &= ~np.isin(obj, np.asarray(exclude_ids, np.int64))
        idx = np.flatnonzero(ok)
        t = hits.t[idx]
        sub = Hits(t, hits.surface[idx], hits.normal[idx])
        d = dirs_w[idx]
        _, refl = scene.material(sub, along_rays(origin, d, t), color=False)
        cos_inc = np.abs(np.einsum("ij,ij->i", sub.normal, d))
        intensity = np.exp(np.float32(-sp.atmosphere_attenuation_rate) * t)
        intensity *= (1.0 - INCIDENCE_WEIGHT) + INCIDENCE_WEIGHT * cos_inc
        intensity *= refl
        np.clip(intensity, 0.0, 1.0, out=intensity)
        u_general, u_intensity = rng.random(len(idx), np.float32), rng.random(len(idx), np.float32)
        keep = u_general >= sp.dropoff_general_rate
        if sp.dropoff_intensity_limit > 0:
            p_keep = 1.0 - sp.dropoff_zero_intensity * (1.0 - intensity / sp.dropoff_intensity_limit)
            keep &= (intensity >= sp.dropoff_intensity_limit) | (u_intensity < p_keep)
        k = np.flatnonzero(keep)
        r = t[k]
        if sp.noise_stddev > 0:
            r = np.maximum(r + np.float32(sp.noise_stddev) * rng.standard_normal(len(idx), np.float32)[k], 0.0)
        pts = np.empty((len(k), 4), np.float32)
        rows = idx[k]
        for c in range(3):   # direction * range, column by column (no per-row broadcast loop)
            np.multiply(self.directions[:, c].take(rows), r, out=pts[:, c])
        pts[:, 3] = intensity[k]
        return LidarScan(pts, self.ring[idx[k]], obj[idx[k]], scene.classes(Hits(t[k], sub.surface[k], sub.normal[k])))
