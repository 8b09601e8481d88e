"""The per-frame records of one evaluation (``eval_<label>_frames.npz``): every frame's detections,
matched once at each IoU threshold (:meth:`~opencood_ext.eval.ap.APAccumulator.frame_decisions`, the
project's matching), its GT count, its scene and its key. All the scene bootstrap
(:mod:`opencood_ext.eval.bootstrap`) needs, written by :func:`~opencood_ext.eval.evaluate.evaluate`
beside ``eval_<label>.json`` and kept in the seed archives; :meth:`FrameRecords.aligned_to` pairs two
evaluations of the same frames, :meth:`FrameRecords.subset` keeps some scenes (one scene family's).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .ap import APAccumulator


@dataclass(frozen=True)
class FrameRecords:
    """Per-frame matched detections of one evaluation: all the bootstrap needs.

    thresholds: (T,) IoU thresholds.
    scores: (D,) float64, the detections of all frames, frame after frame, each frame's sorted
        high first (the matching order).
    tp: (T, D) bool, TP at ``thresholds[t]``.
    offsets: (F + 1,) int64, frame f's detections are ``[offsets[f], offsets[f + 1])``.
    num_gt: (F,) int64 GT boxes per frame.
    scenes: (F,) str, the scene (scenario id) of each frame: the resampling unit.
    frames: (F,) str, a unique key per frame (``scene/timestamp``) to pair two evaluations.
    """

    thresholds: Tuple[float, ...]
    scores: np.ndarray
    tp: np.ndarray
    offsets: np.ndarray
    num_gt: np.ndarray
    scenes: np.ndarray
    frames: np.ndarray

    def __post_init__(self):
        F, T = len(self.num_gt), len(self.thresholds)
        if (len(self.scenes) != F or len(self.frames) != F or len(self.offsets) != F + 1
                or self.tp.shape != (T, len(self.scores)) or self.offsets[-1] != len(self.scores)):
            raise ValueError(f"FrameRecords: inconsistent shapes: {F} frames, {len(self.scenes)} scenes, "
                             f"{len(self.frames)} keys, offsets {len(self.offsets)}, scores {self.scores.shape}, "
                             f"tp {self.tp.shape}, {T} thresholds")
        if len(set(self.frames.tolist())) != F:
            raise ValueError("FrameRecords: frame keys must be unique")

    @property
    def num_frames(self) -> int:
        return len(self.num_gt)

    @property
    def scene_ids(self) -> List[str]:
        """The distinct scenes in order of first appearance."""
        return list(dict.fromkeys(self.scenes.tolist()))

    @property
    def num_scenes(self) -> int:
        return len(self.scene_ids)

    @classmethod
    def from_accumulator(cls, acc: APAccumulator, scenes: Sequence[str],
                         frames: Optional[Sequence[str]] = None) -> "FrameRecords":
        """From an accumulator that has seen every frame; ``scenes[f]`` is frame f's scene id,
        ``frames[f]`` its key (default ``scene/index``); keys that repeat get ``#k`` appended."""
        scores, tps, num_gt = acc.frame_decisions()
        if len(scenes) != len(num_gt) or (frames is not None and len(frames) != len(num_gt)):
            raise ValueError(f"FrameRecords: {len(num_gt)} frames evaluated but {len(scenes)} scene ids"
                             + ("" if frames is None else f" and {len(frames)} frame keys"))
        keys = [f"{s}/{i}" for i, s in enumerate(scenes)] if frames is None else [str(k) for k in frames]
        seen: Dict[str, int] = {}
        for i, k in enumerate(keys):
            seen[k] = seen.get(k, 0) + 1
            if seen[k] > 1:
                keys[i] = f"{k}#{seen[k] - 1}"
        T = len(acc.iou_thresholds)
        lengths = np.array([len(s) for s in scores], dtype=np.int64)
        return cls(thresholds=tuple(acc.iou_thresholds),
                   scores=np.concatenate(scores) if scores else np.zeros(0),
                   tp=np.concatenate(tps, axis=1) if tps else np.zeros((T, 0), dtype=bool),
                   offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), num_gt=num_gt,
                   scenes=np.array([str(s) for s in scenes], dtype=str), frames=np.array(keys, dtype=str))

    @classmethod
    def from_detections(cls, frames: Iterable[tuple], thresholds: Sequence[float] = (0.3, 0.5, 0.7)
                        ) -> "FrameRecords":
        """From ``(pred_boxes (P, 7|5), scores (P,), gt_boxes (G, 7|5), scene[, frame key])`` per frame."""
        acc, scenes, keys = APAccumulator(thresholds), [], []
        for k, item in enumerate(frames):
            if len(item) not in (4, 5):
                raise ValueError(f"FrameRecords.from_detections: frame {k} must be (pred, scores, gt, scene"
                                 f"[, key]), got {len(item)} items")
            acc.add(*item[:3])
            scenes.append(str(item[3]))
            keys.append(str(item[4]) if len(item) == 5 else f"{item[3]}/{k}")
        return cls.from_accumulator(acc, scenes, keys)

    def save(self, path) -> Path:
        """Write an ``.npz`` atomically (temporary file, then rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, thresholds=np.asarray(self.thresholds, dtype=np.float64), scores=self.scores,
                     tp=self.tp, offsets=self.offsets, num_gt=self.num_gt, scenes=self.scenes,
                     frames=self.frames)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path) -> "FrameRecords":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no per-frame evaluation records (written by evaluate() "
                                    f"next to eval_<label>.json)")
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in ("thresholds", "scores", "tp", "offsets", "num_gt", "scenes", "frames")
                       if k not in z.files]
            if missing:
                raise ValueError(f"{path}: missing field(s) {missing}")
            try:
                return cls(thresholds=tuple(float(t) for t in z["thresholds"]), scores=z["scores"],
                           tp=z["tp"].astype(bool), offsets=z["offsets"].astype(np.int64),
                           num_gt=z["num_gt"].astype(np.int64), scenes=z["scenes"].astype(str),
                           frames=z["frames"].astype(str))
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from exc

    def aligned_to(self, other: "FrameRecords") -> "FrameRecords":
        """These records reordered to ``other``'s frame order, for pairing; raises unless both hold
        exactly the same frames (keys), of the same scenes, at the same thresholds."""
        if self.thresholds != other.thresholds:
            raise ValueError(f"cannot pair evaluations at thresholds {self.thresholds} and {other.thresholds}")
        pos = {k: i for i, k in enumerate(self.frames.tolist())}
        missing = [k for k in other.frames.tolist() if k not in pos]
        if missing or len(pos) != other.num_frames:
            raise ValueError(f"cannot pair evaluations on different frames ({self.num_frames} vs "
                             f"{other.num_frames} frames; e.g. {missing[:3] or sorted(set(pos) - set(other.frames))[:3]})")
        order = np.array([pos[k] for k in other.frames.tolist()], dtype=np.int64)
        if (self.scenes[order] != other.scenes).any():
            raise ValueError("cannot pair evaluations: the same frame keys belong to different scenes")
        return self._take(order)

    def subset(self, scenes: Iterable[str]) -> "FrameRecords":
        """The records of the frames of ``scenes`` only (e.g. one scene family's), in evaluation order,
        at the same thresholds, offsets rebuilt; a scene these records do not hold raises."""
        wanted = list(dict.fromkeys(str(s) for s in scenes))
        unknown = sorted(set(wanted) - set(self.scene_ids))
        if unknown:
            raise ValueError(f"FrameRecords.subset: {len(unknown)} scene(s) not in these records of "
                             f"{self.num_scenes} scenes, e.g. {unknown[:3]}")
        return self._take(np.flatnonzero(np.isin(self.scenes, wanted)))

    def _take(self, frames: np.ndarray) -> "FrameRecords":
        """The records of frames ``frames`` (indices, each at most once) in that order."""
        lengths = np.diff(self.offsets)[frames]
        idx = concat_ranges(self.offsets[frames], lengths)
        return FrameRecords(self.thresholds, self.scores[idx], self.tp[:, idx],
                            np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), self.num_gt[frames],
                            self.scenes[frames], self.frames[frames])


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each start and length."""
    total = int(lengths.sum())
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return shift + np.arange(total, dtype=np.int64)
