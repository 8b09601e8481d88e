"""Per-agent OPV2V yaml and PNG files: parsing (with file/key errors) and encoding.

Camera convention, checked on the real V2XSet frame in ``shared/fixtures``:
the yaml ``extrinsic`` maps LiDAR-frame points into the camera frame, i.e. it is
``T_camera_from_lidar = inv(T_world_from_camera(cords)) @ T_world_from_lidar``
to 1e-13, so ``CameraObs.T_lidar_from_camera = inv(extrinsic)``. The camera
frame is CARLA's actor frame (x forward, y right, z up), not an optical frame.

Depth PNG encoding, OPV2V-H's: 8-bit grayscale, one unit = one metre of planar
depth (along the camera's optical axis), ``pixel = round(depth)`` clipped to
0..255 (sky and anything beyond 255 m -> 255; NaN -> 0, "no value"). HEAL
decodes it as ``ToTensor(PIL image) * 255``, i.e. the raw pixel value in metres
(``opencood/data_utils/datasets/intermediate_heter_fusion_dataset.py``); the
reader returns the same (for a multi-channel PNG, channel 0). Older datasets of
this project stored 16-bit ``round(depth * 256)`` with a PNG text chunk
``depth_scale = 256``; the reader still divides those by ``depth_scale``, and
refuses a 16-bit PNG without the chunk (an unknown encoding, which HEAL would
misread).
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import yaml

from ..errors import DataFormatError, not_utf8
from ..frame import ObjectLabel
from .decode_cache import Arrays, DecodeCache
from .yaml_memo import ParsedMemo

log = logging.getLogger(__name__)

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
CAMERA_KEY = re.compile(r"^camera(\d+)$")
DEPTH_MAX_M = 255  # the 8-bit encoding's largest depth (sky, far)
_DEPTH_TEXT_KEY = "depth_scale"  # only in the older 16-bit files
PNG_LEVEL = 3  # zlib level: 4x faster than the default 6 on 800x600 frames, ~8% larger
AGENT_YAMLS = ParsedMemo()  # agent yamls parsed in this process (read without a DecodeCache)


# ----------------------------------------------------------------------------- yaml

def load_yaml(path) -> dict:
    """Load a yaml mapping; unreadable, invalid or non-mapping files -> DataFormatError."""
    path = Path(path)
    try:
        with open(path, "r", encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=_YAML_LOADER)
    except OSError as exc:
        raise DataFormatError(path, f"cannot read yaml: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise not_utf8(path, exc) from None
    except yaml.YAMLError as exc:
        raise DataFormatError(path, f"not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise DataFormatError(path, f"expected a mapping at the top level, got {type(data).__name__}")
    return data


def dump_yaml(path, data: dict) -> None:
    """Deterministic yaml (sorted keys, block style, exact float repr)."""
    text = yaml.dump(data, Dumper=_YAML_DUMPER, sort_keys=True, default_flow_style=False)
    Path(path).write_text(text, encoding="utf-8")


def require(d: dict, key: str, path, prefix: str = ""):
    if not isinstance(d, dict) or key not in d:
        raise DataFormatError(path, "missing key", key=prefix + key)
    return d[key]


def as_array(value, shape: Tuple[int, ...], path, key: str) -> np.ndarray:
    """``value`` as a float64 array of ``shape`` or a DataFormatError naming ``key``."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataFormatError(path, f"expected numbers of shape {shape}, got {value!r:.80}", key=key) from None
    if arr.shape != shape:
        raise DataFormatError(path, f"expected shape {shape}, got {arr.shape}", key=key)
    if not np.isfinite(arr).all():
        raise DataFormatError(path, "contains NaN or infinite values", key=key)
    return arr


def parse_objects(d: dict, path, key: str = "vehicles",
                  default_type: str = "Car") -> Dict[int, ObjectLabel]:
    """The yaml ``vehicles`` mapping -> ``{object_id: ObjectLabel}``.

    ``location``, ``center``, ``angle``, ``extent`` are required per object,
    ``speed`` (default 0) and ``obj_type`` (default ``default_type``) optional.
    """
    raw = require(d, key, path)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DataFormatError(path, f"expected a mapping of object id -> object, got {type(raw).__name__}",
                              key=key)
    out: Dict[int, ObjectLabel] = {}
    for oid, obj in raw.items():
        k = f"{key}.{oid}"
        try:
            obj_id = int(oid)
        except (TypeError, ValueError):
            raise DataFormatError(path, "object id is not an integer", key=k) from None
        fields = {f: as_array(require(obj, f, path, prefix=k + "."), (3,), path, f"{k}.{f}")
                  for f in ("location", "center", "angle", "extent")}
        speed = obj.get("speed", 0.0)
        try:
            speed = float(speed if speed is not None else 0.0)
        except (TypeError, ValueError):
            raise DataFormatError(path, f"speed is not a number: {speed!r}", key=f"{k}.speed") from None
        out[obj_id] = ObjectLabel(object_id=obj_id, obj_type=str(obj.get("obj_type", default_type)),
                                  speed=speed, **fields)
    return out


class _NotPlain(TypeError):
    """A yaml value the cache's JSON encoding cannot carry exactly (dates, bytes, ...)."""


def _tag(value):
    """Plain yaml data -> JSON that keeps key types: dicts and lists become tagged pairs."""
    if isinstance(value, dict):
        return {"m": [[_tag(k), _tag(v)] for k, v in value.items()]}
    if isinstance(value, list):
        return {"l": [_tag(v) for v in value]}
    if value is None or type(value) in (str, int, float, bool):
        return value
    raise _NotPlain(type(value).__name__)


def _untag(value):
    if isinstance(value, dict):
        return {_untag(k): _untag(v) for k, v in value["m"]} if "m" in value else [_untag(v) for v in value["l"]]
    return value


_OBJ_VECTORS = ("location", "center", "angle", "extent")


def agent_yaml_record(d: dict, objects: Dict[int, ObjectLabel]) -> Optional[Arrays]:
    """A parsed agent yaml as arrays: the labels (``objects``, from :func:`parse_objects`)
    as a table, every other key as tagged JSON bytes; None if a value is not plain data."""
    try:
        rest = json.dumps(_tag({k: v for k, v in d.items() if k != "vehicles"}), allow_nan=True)
    except _NotPlain:
        return None
    objs = list(objects.values())
    rec = {"rest": np.frombuffer(rest.encode("utf-8"), np.uint8),
           "obj_id": np.array([o.object_id for o in objs], np.int64),
           "obj_type": np.array([o.obj_type for o in objs], dtype=str),
           "obj_speed": np.array([o.speed for o in objs], np.float64)}
    for name in _OBJ_VECTORS:
        rec[f"obj_{name}"] = np.array([getattr(o, name) for o in objs], np.float64).reshape(-1, 3)
    return rec


def agent_yaml_from_record(rec: Arrays) -> dict:
    """Inverse of :func:`agent_yaml_record` (``vehicles`` rebuilt from the table)."""
    d = _untag(json.loads(rec["rest"].tobytes().decode("utf-8")))
    d["vehicles"] = {int(oid): {"obj_type": str(rec["obj_type"][k]), "speed": float(rec["obj_speed"][k]),
                                **{n: rec[f"obj_{n}"][k].tolist() for n in _OBJ_VECTORS}}
                     for k, oid in enumerate(rec["obj_id"].tolist())}
    return d


def load_agent_yaml(path, cache: Optional[DecodeCache] = None) -> dict:
    """:func:`load_yaml` of an agent's ``<timestamp>.yaml``, through ``cache`` when given, else
    through the process's memo :data:`AGENT_YAMLS` (:mod:`.yaml_memo`). Either way the caller gets
    its own new dict."""
    if cache is None:
        return AGENT_YAMLS.load(path, load_yaml)
    entry = cache.entry(path, "agent-yaml")
    rec = entry.load() if entry is not None else None
    if rec is not None:
        try:
            return agent_yaml_from_record(rec)
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            log.warning("cache entry %s (of %s) is malformed (%s); decoding the source again",
                        entry.path, path, exc)
    d = load_yaml(path)
    if entry is not None:
        try:
            objects = parse_objects(d, path)
        except DataFormatError:
            return d  # the reader raises its own error, in its own order
        rec = agent_yaml_record(d, objects)
        if rec is not None:
            entry.store(rec)
    return d


def camera_indices(d: dict) -> List[int]:
    return sorted(int(m.group(1)) for m in (CAMERA_KEY.match(str(k)) for k in d) if m)


def parse_camera(d: dict, index: int, path) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``camera{index}`` -> (cords (6,), T_lidar_from_camera (4, 4), K (3, 3))."""
    key = f"camera{index}"
    cam = require(d, key, path)
    cords = as_array(require(cam, "cords", path, key + "."), (6,), path, f"{key}.cords")
    extrinsic = as_array(require(cam, "extrinsic", path, key + "."), (4, 4), path, f"{key}.extrinsic")
    K = as_array(require(cam, "intrinsic", path, key + "."), (3, 3), path, f"{key}.intrinsic")
    try:
        T_lidar_from_camera = np.linalg.inv(extrinsic)
    except np.linalg.LinAlgError:
        raise DataFormatError(path, "extrinsic is singular", key=f"{key}.extrinsic") from None
    return cords, T_lidar_from_camera, K


def plain(value):
    """numpy scalars / arrays (nested in lists and dicts) -> plain Python for yaml."""
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


# ----------------------------------------------------------------------------- images

def _open_image(path):
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(path)
        img.load()
    except FileNotFoundError:
        raise DataFormatError(path, "image file not found") from None
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise DataFormatError(path, f"cannot decode image: {exc}") from None
    return img


def read_rgb_png(path) -> np.ndarray:
    """(H, W, 3) uint8 RGB."""
    return np.asarray(_open_image(path).convert("RGB"), dtype=np.uint8)


def write_rgb_png(path, image: np.ndarray) -> None:
    from PIL import Image

    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"{path}: camera image must be (H, W, 3), got {arr.shape}")
    if arr.dtype != np.uint8:
        arr = np.clip(np.rint(arr.astype(np.float64) * (255.0 if arr.max() <= 1.0 else 1.0)), 0, 255)
    Image.fromarray(arr.astype(np.uint8)).save(path, format="PNG", compress_level=PNG_LEVEL)


def read_depth_png(path) -> np.ndarray:
    """(H, W) float32 depth in metres (see the module docstring for the encodings)."""
    img = _open_image(path)
    scale = img.info.get(_DEPTH_TEXT_KEY)
    arr = np.asarray(img)
    if arr.ndim == 3:
        arr = arr[..., 0]
    if arr.dtype == np.uint8:
        return arr.astype(np.float32)
    if scale is None:
        raise DataFormatError(path, f"{arr.dtype} depth PNG (mode {img.mode}) without a {_DEPTH_TEXT_KEY} text "
                              f"chunk: unknown encoding (OPV2V-H depth PNGs are 8-bit, one unit = 1 m)")
    try:
        return (arr.astype(np.float32) / np.float32(float(scale))).astype(np.float32)
    except ValueError:
        raise DataFormatError(path, f"text chunk {_DEPTH_TEXT_KEY}={scale!r} is not a number") from None


def write_depth_png(path, depth: np.ndarray) -> None:
    """(H, W) depth in metres -> 8-bit PNG in OPV2V-H's encoding (module docstring)."""
    from PIL import Image

    d = np.asarray(depth, dtype=np.float64)
    if d.ndim != 2:
        raise ValueError(f"{path}: depth must be (H, W), got {d.shape}")
    q = np.clip(np.rint(np.nan_to_num(d, nan=0.0, posinf=DEPTH_MAX_M, neginf=0.0)), 0, DEPTH_MAX_M)
    Image.fromarray(q.astype(np.uint8)).save(path, format="PNG", compress_level=PNG_LEVEL)


def existing(*candidates: Optional[Path]) -> Optional[Path]:
    """First candidate path that exists, else None."""
    for c in candidates:
        if c is not None and c.exists():
            return c
    return None
