"""V2X-Real reader (docs/formats.md section 3).

Layout: ``<root>/<split>/<scenario>/<agent_id>/<timestamp>.{bin,yaml}`` (and
``_camera{i}.png``); negative agent ids are infrastructure. The yaml is
OPV2V-like (``lidar_pose``, ``vehicles`` with ``obj_type``), so the OPV2V reader
does the rest; ``ObjectLabel.obj_type`` keeps the fine class and
:func:`superclass` groups it.

LiDAR ``.bin``: raw little-endian float32 records ``(x, y, z, intensity)``, read
as the official V2X-Real loader reads them (ucla-mobility/V2X-Real,
``opencood/utils/pcd_utils.py`` ``load_lidar_bin``, called from
``opencood/data_utils/datasets/basedataset.py`` with ``zero_intensity=True``):

* rows whose x, y or z is NaN are dropped (we also drop infinite coordinates,
  which no voxel grid can hold); as in every reader they are a data fault
  (:func:`opencood_ext.data.faults.drop_nonfinite`): a DataFaultWarning and a
  logged WARNING naming the file and the count, or with ``strict`` a
  DataFaultError;
* ``intensity="zero"`` (the default, the official loader): every point's
  intensity is set to 0; the dataset's intensity is not used;
* ``intensity="raw"``: the stored value is kept as it is, never rescaled (the
  GenComm reference code, jeffreychou777/GenComm ``v2xreal_basedataset.py``,
  calls the same ``load_lidar_bin`` without ``zero_intensity``); rows whose
  intensity is NaN or infinite are dropped, since the feature would poison the
  encoder.

No scale is guessed from a file's values: a guess (divide by 255 when the
maximum exceeds 1, ...) would give two files of one sensor different units.

``mode`` decides which agents a frame holds and which one is the ego
(``agents[0]``):

* ``vc``: vehicle-centric, a vehicle ego with vehicle AND infrastructure
  collaborators (vehicles by id, then infrastructure);
* ``ic``: infrastructure-centric, an infrastructure ego (infrastructure by
  |id| first, then vehicles);
* ``v2v``: vehicles only;  ``i2i``: infrastructure only.

Timestamps without an agent of the ego's kind are left out of the index.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from ..errors import DataFormatError
from ..faults import drop_nonfinite
from .opv2v import OPV2VReader

log = logging.getLogger(__name__)

MODES = ("vc", "ic", "v2v", "i2i")

V2XREAL_SUPERCLASS: Dict[str, str] = {
    **{c: "vehicle" for c in ("Car", "PoliceCar", "LongVehicle")},
    **{c: "pedestrian" for c in ("Pedestrian", "Child", "RoadWorker", "Scooter", "ScooterRider",
                                 "Motorcycle", "MotorcyleRider", "MotorcycleRider", "BicycleRider")},
    **{c: "truck" for c in ("Truck", "Van", "Bus", "TrashCan", "ConcreteTruck")},
}
_BY_LOWER = {k.lower(): v for k, v in V2XREAL_SUPERCLASS.items()}
_RAISE = object()


def superclass(name: str, default=_RAISE) -> Optional[str]:
    """V2X-Real fine class -> ``"vehicle"`` / ``"pedestrian"`` / ``"truck"``
    (case-insensitive; ``MotorcyleRider`` is the dataset's own spelling, the
    correct one is accepted too). Unknown names raise ValueError unless a
    ``default`` is given."""
    sc = _BY_LOWER.get(str(name).lower())
    if sc is None:
        if default is _RAISE:
            raise ValueError(f"unknown V2X-Real class {name!r}; known: {sorted(V2XREAL_SUPERCLASS)}")
        return default
    return sc


INTENSITY_MODES = ("zero", "raw")


def read_bin(path, intensity: str = "zero", strict: bool = False) -> np.ndarray:
    """A V2X-Real ``.bin`` -> (N, 4) float32 x, y, z, intensity (see the module docstring).

    intensity: ``"zero"`` (the official loader: all intensities 0) or ``"raw"`` (kept unscaled).
    strict: refuse NaN/inf rows (DataFaultError) instead of dropping them with a warning.
    """
    if intensity not in INTENSITY_MODES:
        raise ValueError(f"V2X-Real intensity must be one of {INTENSITY_MODES}, got {intensity!r}")
    return finish_points(decode_bin(path), path, intensity, strict)


def finish_points(pts: np.ndarray, path, intensity: str = "zero", strict: bool = False) -> np.ndarray:
    """Decoded ``.bin`` rows -> the reader's points: NaN/inf rows dropped (x, y, z; and the
    intensity in ``"raw"`` mode) as a data fault, intensities zeroed in ``"zero"`` mode."""
    pts = drop_nonfinite(pts, path, 4 if intensity == "raw" else 3, strict=strict)
    if intensity == "zero":
        pts = pts.copy()
        pts[:, 3] = 0.0
    return pts


def decode_bin(path) -> np.ndarray:
    """A V2X-Real ``.bin`` -> its (N, 4) float32 records as stored (NaN/inf rows kept)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataFormatError(path, f"cannot read point cloud: {exc.strerror or exc}") from None
    if len(data) % 16:  # checked on the bytes: reading floats first would drop a partial one unseen
        raise DataFormatError(path, f"size {len(data)} bytes is not a whole number of 16-byte "
                              f"(x, y, z, intensity) float32 records ({len(data) // 16} records and "
                              f"{len(data) % 16} bytes over: a truncated or corrupt file)")
    return np.frombuffer(data, dtype="<f4").reshape(-1, 4).astype(np.float32)


class V2XRealReader(OPV2VReader):
    """Frames of one V2X-Real split; see the module docstring for ``mode``.

    ``load_cameras`` defaults to False because V2X-Real's camera yaml keys are
    unverified; when True, ``camera{i}`` entries must follow OPV2V's layout.
    ``intensity``: ``"zero"`` (the official loader) or ``"raw"``, see the module docstring.
    ``cache_dir``: as for :class:`OPV2VReader` (the ``.bin`` scans and yaml labels).
    ``strict``: as for :class:`OPV2VReader` (data faults raise instead of warning).
    """

    left_handed = False  # real-world LiDAR frames; plots do not flip y
    lidar_ext = "bin"

    def __init__(self, root, split: str, mode: str = "vc", skip_bad: bool = False,
                 load_cameras: bool = False, intensity: str = "zero", cache_dir=None, strict: bool = False):
        if mode not in MODES:
            raise ValueError(f"V2X-Real mode must be one of {MODES}, got {mode!r}")
        if intensity not in INTENSITY_MODES:
            raise ValueError(f"V2X-Real intensity must be one of {INTENSITY_MODES}, got {intensity!r}")
        super().__init__(root, split, modality=None, load_cameras=load_cameras, load_depth=False,
                         load_beams=False, skip_bad=skip_bad, cache_dir=cache_dir, strict=strict)
        self.hetero_root = None
        self.mode = mode
        self.intensity = intensity
        keys = []
        for scen, ts, ids in self._keys:
            veh = [a for a in ids if a >= 0]
            inf = [a for a in ids if a < 0]  # already ordered by |id|
            agents = {"vc": veh + inf if veh else [], "ic": inf + veh if inf else [],
                      "v2v": veh, "i2i": inf}[mode]
            if agents:
                keys.append((scen, ts, tuple(agents)))
        if not keys:
            raise DataFormatError(self._split_dir, f"no frame has an agent usable as ego in mode {mode!r}")
        self._keys = keys

    def _load_lidar(self, agent_dir: Path, ts: str) -> np.ndarray:
        path = agent_dir / f"{ts}.{self.lidar_ext}"
        return finish_points(self._read_points(path, decode_bin), path, self.intensity, self.strict)
