"""Vehicle classes (realistic size ranges) and their low-poly meshes.

A vehicle's frame has its origin on the ground below the centre of its label
box, x forward, y right, z up. The mesh stays INSIDE the label box with a
small inset (``INSET`` m on every side but the bottom) so LiDAR range noise
(sigma 0.02 m) rarely pushes a return out of the box -- CARLA's boxes are
likewise a little larger than the meshes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from .meshes import Mesh, box, cylinder, hull, merge

INSET = 0.07
PART_BODY, PART_GLASS, PART_TYRE = 0, 1, 2


@dataclass(frozen=True)
class VehicleClass:
    """Full length / width / height ranges in metres and a sampling weight."""

    name: str
    length: Tuple[float, float]
    width: Tuple[float, float]
    height: Tuple[float, float]
    weight: float


CLASSES = (
    VehicleClass("Car", (4.2, 4.9), (1.8, 2.05), (1.4, 1.65), 0.70),
    VehicleClass("Van", (4.8, 5.6), (1.95, 2.1), (1.9, 2.3), 0.15),
    VehicleClass("Truck", (6.5, 9.0), (2.3, 2.5), (2.9, 3.5), 0.10),
    VehicleClass("Bus", (10.5, 12.5), (2.5, 2.6), (3.0, 3.3), 0.05),
)
BY_NAME = {c.name: c for c in CLASSES}

PAINT = np.array([[0.92, 0.92, 0.92], [0.08, 0.08, 0.09], [0.62, 0.64, 0.66], [0.72, 0.08, 0.08],
                  [0.10, 0.22, 0.55], [0.30, 0.32, 0.35], [0.85, 0.68, 0.10], [0.12, 0.38, 0.20],
                  [0.55, 0.30, 0.12], [0.80, 0.40, 0.05]])
GLASS = (0.07, 0.09, 0.12)
TYRE = (0.04, 0.04, 0.04)


def sample_class(rng: np.random.Generator, name: str = "") -> VehicleClass:
    if name:
        return BY_NAME[name]
    w = np.array([c.weight for c in CLASSES])
    return CLASSES[int(rng.choice(len(CLASSES), p=w / w.sum()))]


def sample_size(rng: np.random.Generator, cls: VehicleClass) -> np.ndarray:
    """(3,) full length, width, height."""
    return np.array([rng.uniform(*cls.length), rng.uniform(*cls.width), rng.uniform(*cls.height)])


def _wheel(x: float, y: float, r: float, width: float) -> Mesh:
    v, t = cylinder(0.0, 0.0, r, -width / 2, width / 2, segments=8)
    return np.column_stack([v[:, 0] + x, v[:, 2] + y, v[:, 1] + r]), t  # axis along y


def _wheels(hl: float, hw: float, axles_x, r: float) -> Mesh:
    y = hw - 0.14
    return merge([_wheel(x, s * y, r, 0.24) for x in axles_x for s in (-1, 1)])


def _prism_x(x0, x1, y, zb, zt) -> np.ndarray:
    """8 points of a box-like block for a hull."""
    return np.array([[x, s * y, z] for x in (x0, x1) for s in (-1, 1) for z in (zb, zt)], float)


def vehicle_mesh(cls: str, size) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mesh of one vehicle in its own frame: vertices (V, 3), triangles (T, 3)
    and a part code per triangle (PART_BODY / PART_GLASS / PART_TYRE)."""
    L, W, H = (float(s) for s in size)
    hl, hw, top = L / 2 - INSET, W / 2 - INSET, H - INSET / 2
    parts: List[Tuple[Mesh, int]] = []
    if cls in ("Car", "Van"):
        clear, belt = 0.28, (0.55 if cls == "Car" else 0.5) * H
        r = 0.32 if cls == "Car" else 0.35
        nose = 0.35 if cls == "Car" else 0.25
        body = np.array([[-hl, s * hw, z] for s in (-1, 1) for z in (clear, belt)]
                        + [[hl, s * hw, z] for s in (-1, 1) for z in (clear, belt - 0.12)]
                        + [[hl - nose, s * hw, belt] for s in (-1, 1)], float)
        parts.append((hull(body), PART_BODY))
        if cls == "Car":
            cab = np.array([[x, s * (hw - 0.08), belt] for x in (-hl + 0.35, hl - 1.25) for s in (-1, 1)]
                           + [[x, s * (hw - 0.22), top - 0.05] for x in (-hl + 0.95, hl - 2.05) for s in (-1, 1)])
            parts.append((hull(cab), PART_GLASS))
            roof = _prism_x(-hl + 1.0, hl - 2.1, hw - 0.24, top - 0.06, top)
            parts.append((hull(roof), PART_BODY))
        else:
            back = _prism_x(-hl, hl - 1.1, hw, belt - 0.01, top)
            parts.append((hull(back), PART_BODY))
            wind = np.array([[hl - 1.1, s * (hw - 0.05), z] for s in (-1, 1) for z in (belt, top - 0.02)]
                            + [[hl - 0.3, s * (hw - 0.05), belt] for s in (-1, 1)]
                            + [[hl - 1.05, s * (hw - 0.1), top - 0.02] for s in (-1, 1)], float)
            parts.append((hull(wind), PART_GLASS))
        parts.append((_wheels(hl, hw, (hl - 0.85, -hl + 0.8), r), PART_TYRE))
    elif cls == "Truck":
        cab_len = 2.3
        parts.append((box([hl - cab_len / 2, 0, (0.45 + top * 0.85) / 2], [cab_len, 2 * hw, top * 0.85 - 0.45]),
                      PART_BODY))
        parts.append((box([hl - 0.05, 0, top * 0.62], [0.12, 2 * hw - 0.3, top * 0.3]), PART_GLASS))
        cargo_x1 = hl - cab_len - 0.25
        parts.append((box([(cargo_x1 - hl) / 2, 0, (0.9 + top) / 2], [cargo_x1 + hl, 2 * hw, top - 0.9]),
                      PART_BODY))
        parts.append((box([(cargo_x1 - hl) / 2 + 0.2, 0, 0.7], [cargo_x1 + hl, 1.0, 0.4]), PART_BODY))
        parts.append((_wheels(hl, hw, (hl - 1.2, -hl + 1.5, -hl + 2.6), 0.48), PART_TYRE))
    elif cls == "Bus":
        parts.append((box([0, 0, (0.35 + top) / 2], [2 * hl, 2 * hw - 0.06, top - 0.35]), PART_BODY))
        for s in (-1, 1):
            parts.append((box([0.2, s * (hw - 0.02), top * 0.68], [2 * hl - 1.2, 0.04, top * 0.3]), PART_GLASS))
        parts.append((box([hl - 0.02, 0, top * 0.6], [0.04, 2 * hw - 0.3, top * 0.45]), PART_GLASS))
        parts.append((_wheels(hl, hw, (hl - 2.4, -hl + 2.8), 0.5), PART_TYRE))
    else:
        raise ValueError(f"unknown vehicle class {cls!r}; expected one of {sorted(BY_NAME)}")
    v, t = merge([m for m, _ in parts])
    code = np.concatenate([np.full(len(m[1]), c, np.int8) for m, c in parts])
    return v, t, code
