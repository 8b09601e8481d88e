"""95% bootstrap intervals over test SCENES for AP, and paired differences between two methods.

Frames of one scene (scenario) share the traffic, the buildings and the agents, so their
errors are correlated: treating ~50 frames of 8 scenes as 50 independent draws would make the
intervals far too narrow. The resampling unit is therefore the scene (DESIGN.md section 5): a
resample draws ``S`` scenes with replacement out of the ``S`` test scenes and takes ALL frames
of every drawn scene, as many times as the scene was drawn.

The interval is the **percentile bootstrap** interval: the 2.5 % and 97.5 % percentiles
(``numpy.nanpercentile``, linear interpolation) of the statistic over ``B`` resamples (default
1000, seeded). Why this one: AP is a non-linear statistic of the whole PR curve with no usable
variance formula; the percentile interval needs none, follows any monotone transform of AP and
never leaves AP's range [0, 1]; BCa would need a jackknife acceleration estimated from only a
handful of scenes, itself too noisy to correct anything. Its known weakness: with few scenes it
under-covers (it cannot be wider than the scenes' spread), so the number of scenes is reported
next to every interval.

A comparison of two methods is a PAIRED bootstrap: both are evaluated on the same frames, every
resample uses the same scene draw for both, and the statistic is ``AP(A) - AP(B)`` on that
draw; the difference is significant at 95 % when its interval excludes 0. A method compared with
itself gives exactly 0 on every resample (a zero-width interval).

Speed: the IoU matching is done once per frame (:meth:`APAccumulator.frame_decisions`, the
project's matching), so a resample only gathers per-frame arrays and computes the VOC area with
:func:`~opencood_ext.eval.ap.voc_ap`. Resample order: frames keep their evaluation order, each
repeated as often as its scene was drawn, so the identity resample (every scene once) reproduces
the evaluation's frame order and both of its AP values exactly.

The records it resamples are :class:`~opencood_ext.eval.records.FrameRecords`; reading a run
folder's records and comparing two runs is :mod:`opencood_ext.eval.run_records`.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .ap import ORDER_GLOBAL, ORDER_PER_FRAME, voc_ap
from .records import FrameRecords, concat_ranges

ORDERS = (ORDER_GLOBAL, ORDER_PER_FRAME)
LEVEL = 0.95


def scene_draws(num_scenes: int, resamples: int, seed: int) -> np.ndarray:
    """(B, S) int64: how often each scene is drawn in each of ``resamples`` draws of ``num_scenes``
    scenes with replacement (``numpy.random.default_rng(seed)``); each row sums to S."""
    if num_scenes < 1 or resamples < 1:
        raise ValueError(f"scene_draws: need >= 1 scene and >= 1 resample, got {num_scenes}, {resamples}")
    idx = np.random.default_rng(seed).integers(0, num_scenes, size=(resamples, num_scenes))
    flat = idx + num_scenes * np.arange(resamples)[:, None]
    return np.bincount(flat.ravel(), minlength=resamples * num_scenes).reshape(resamples, num_scenes)


def resample_frames(records: FrameRecords, scene_counts: np.ndarray) -> np.ndarray:
    """Frame indices of one resample: every frame in evaluation order, repeated as often as its scene
    is drawn (``scene_counts[s]`` for the s-th of :attr:`FrameRecords.scene_ids`)."""
    return np.repeat(np.arange(records.num_frames), np.asarray(scene_counts)[_scene_of(records)])


def _scene_of(records: FrameRecords) -> np.ndarray:
    """(F,) int64: each frame's position in :attr:`FrameRecords.scene_ids`."""
    index = {s: k for k, s in enumerate(records.scene_ids)}
    return np.array([index[s] for s in records.scenes.tolist()], dtype=np.int64)


def _ap_of(records: FrameRecords, frames: np.ndarray) -> Dict[str, np.ndarray]:
    """AP (T,) in both orders of the frames ``frames`` (indices, repeats allowed), exactly as
    :class:`APAccumulator` computes it for those frames added in that order."""
    starts = records.offsets[frames]
    idx = concat_ranges(starts, records.offsets[frames + 1] - starts)
    scores, tp = records.scores[idx], records.tp[:, idx]
    num_gt = int(records.num_gt[frames].sum())
    out = {}
    for order in ORDERS:
        flags = tp[:, np.argsort(-scores, kind="stable")] if order == ORDER_GLOBAL else tp
        ap = np.full(len(records.thresholds), np.nan)
        if num_gt > 0:
            if flags.shape[1] == 0:
                ap[:] = 0.0
            else:
                ctp = np.cumsum(flags, axis=1).astype(np.float64)
                precision = ctp / np.arange(1, flags.shape[1] + 1, dtype=np.float64)
                for t in range(len(ap)):
                    ap[t] = voc_ap(ctp[t] / num_gt, precision[t])
        out[order] = ap
    return out


# _samples' results by the content of its inputs: a report pairs one evaluation (GenComm's row, a
# seed's no fusion) with many others over the same draws, and pooling recomputes each seed's samples;
# the resampled APs are a pure function of the records and draws, so a repeat is a lookup. Bounded;
# the arrays are read-only so that no caller changes a cached result.
_SAMPLES_CACHE: "OrderedDict[bytes, Dict[str, np.ndarray]]" = OrderedDict()
_SAMPLES_CACHE_SIZE = 256


def _fingerprint(*arrays) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.digest()


def _samples(records: FrameRecords, draws: np.ndarray) -> Dict[str, np.ndarray]:
    """{order: (B, T)} AP on each resample (rows of ``draws``, scene counts); read-only arrays."""
    frames, scene_of = np.arange(records.num_frames), _scene_of(records)
    key = _fingerprint(records.offsets, records.scores, records.tp, records.num_gt, scene_of,
                       np.asarray(records.thresholds, dtype=np.float64), draws)
    if key in _SAMPLES_CACHE:
        _SAMPLES_CACHE.move_to_end(key)
        return _SAMPLES_CACHE[key]
    per = [_ap_of(records, np.repeat(frames, row[scene_of])) for row in draws]
    out = {o: np.stack([p[o] for p in per]) for o in ORDERS}
    for a in out.values():
        a.setflags(write=False)
    _SAMPLES_CACHE[key] = out
    if len(_SAMPLES_CACHE) > _SAMPLES_CACHE_SIZE:
        _SAMPLES_CACHE.popitem(last=False)
    return out


def _percentiles(samples: np.ndarray, level: float) -> np.ndarray:
    """(2, T): lower and upper percentile per column, nan where every resample is nan."""
    out = np.full((2, samples.shape[1]), np.nan)
    tail = 100 * (1 - level) / 2
    for t in range(samples.shape[1]):
        col = samples[:, t]
        if np.isfinite(col).any():
            out[:, t] = np.nanpercentile(col, [tail, 100 - tail])
    return out


def _keyed(thresholds, values) -> Dict[str, object]:
    return {str(t): v for t, v in zip(thresholds, values)}  # the keys of EvalResult.to_json()["ap"]


def _json_interval(lo: float, hi: float) -> Optional[List[float]]:
    return None if np.isnan(lo) or np.isnan(hi) else [float(lo), float(hi)]


@dataclass
class BootstrapAP:
    """AP of one evaluation with its percentile interval over scene resamples.

    ap / lo / hi: {order: (T,) array}; samples: {order: (B, T)}; thresholds: (T,).
    """

    thresholds: Tuple[float, ...]
    ap: Dict[str, np.ndarray]
    lo: Dict[str, np.ndarray]
    hi: Dict[str, np.ndarray]
    samples: Dict[str, np.ndarray] = field(repr=False)
    num_scenes: int
    resamples: int
    seed: int
    level: float = LEVEL

    def ci_json(self) -> Dict[str, Dict[str, Optional[List[float]]]]:
        """``{"global": {"0.3": [lo, hi], ...}, "per_frame": ...}`` (None where AP is undefined): the
        same keys as the evaluation's ``ap``."""
        return {o: _keyed(self.thresholds, [_json_interval(a, b) for a, b in zip(self.lo[o], self.hi[o])])
                for o in ORDERS}

    def method_json(self) -> Dict[str, object]:
        return {"interval": f"percentile bootstrap, {self.level:.0%}", "unit": "scene",
                "resamples": self.resamples, "seed": self.seed}


@dataclass
class PairedDifference:
    """``AP(a) - AP(b)`` on the same frames: point estimate, percentile interval over the SAME scene
    draws for both, and whether the interval excludes 0. Fields are {order: (T,) array}."""

    thresholds: Tuple[float, ...]
    diff: Dict[str, np.ndarray]
    lo: Dict[str, np.ndarray]
    hi: Dict[str, np.ndarray]
    num_scenes: int
    resamples: int
    seed: int
    level: float = LEVEL

    def significant(self, order: str) -> np.ndarray:
        """(T,) bool: the interval excludes 0."""
        return (self.lo[order] > 0) | (self.hi[order] < 0)

    def to_json(self) -> Dict[str, Dict[str, dict]]:
        return {o: _keyed(self.thresholds, [
            {"diff": float(d), "ci": _json_interval(a, b), "significant": bool(s)}
            for d, a, b, s in zip(self.diff[o], self.lo[o], self.hi[o], self.significant(o))]) for o in ORDERS}


def _check(resamples: int, level: float) -> None:
    if resamples < 1:
        raise ValueError(f"bootstrap: resamples must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap: level must be in (0, 1), got {level}")


def bootstrap_ap(records: FrameRecords, resamples: int = 1000, seed: int = 0, level: float = LEVEL,
                 draws: Optional[np.ndarray] = None) -> BootstrapAP:
    """Point AP (every frame once, evaluation order) and its percentile interval over ``resamples``
    scene draws (or the given ``draws``, (B, S) scene counts)."""
    _check(resamples, level)
    if records.num_frames == 0:
        raise ValueError("bootstrap_ap: no frames")
    draws = scene_draws(records.num_scenes, resamples, seed) if draws is None else np.asarray(draws)
    point = _ap_of(records, np.arange(records.num_frames))
    samples = _samples(records, draws)
    q = {o: _percentiles(samples[o], level) for o in ORDERS}
    return BootstrapAP(records.thresholds, point, {o: q[o][0] for o in ORDERS}, {o: q[o][1] for o in ORDERS},
                       samples, records.num_scenes, len(draws), seed, level)


def paired_difference(a: FrameRecords, b: FrameRecords, resamples: int = 1000, seed: int = 0,
                      level: float = LEVEL, draws: Optional[np.ndarray] = None) -> PairedDifference:
    """``AP(a) - AP(b)`` with its paired percentile interval; ``b`` must hold the same frames."""
    _check(resamples, level)
    b = b.aligned_to(a)
    draws = scene_draws(a.num_scenes, resamples, seed) if draws is None else np.asarray(draws)
    pa, pb = _ap_of(a, np.arange(a.num_frames)), _ap_of(b, np.arange(b.num_frames))
    sa, sb = _samples(a, draws), _samples(b, draws)
    q = {o: _percentiles(sa[o] - sb[o], level) for o in ORDERS}
    return PairedDifference(a.thresholds, {o: pa[o] - pb[o] for o in ORDERS}, {o: q[o][0] for o in ORDERS},
                            {o: q[o][1] for o in ORDERS}, a.num_scenes, len(draws), seed, level)


def pooled_paired_difference(pairs: Sequence[Tuple[FrameRecords, FrameRecords]], resamples: int = 1000,
                             seed: int = 0, level: float = LEVEL) -> PairedDifference:
    """The mean over ``pairs`` (e.g. one per training seed) of ``AP(a) - AP(b)``, with its percentile
    interval over scene draws that are the SAME for every pair and both sides: the interval covers the
    test scenes' sampling of the seed-averaged difference, not the spread between seeds (report that
    separately). Every evaluation must hold the frames of the first pair's ``a``."""
    _check(resamples, level)
    if not pairs:
        raise ValueError("pooled_paired_difference: no pairs")
    first = pairs[0][0]
    draws = scene_draws(first.num_scenes, resamples, seed)
    point, samples = {o: 0.0 for o in ORDERS}, {o: 0.0 for o in ORDERS}
    for a, b in pairs:
        if a.thresholds != first.thresholds:
            raise ValueError(f"cannot pool evaluations at thresholds {a.thresholds} and {first.thresholds}")
        a, b = a.aligned_to(first), b.aligned_to(first)  # same scene order, so the draws mean the same
        pa, pb = _ap_of(a, np.arange(a.num_frames)), _ap_of(b, np.arange(b.num_frames))
        sa, sb = _samples(a, draws), _samples(b, draws)
        for o in ORDERS:
            point[o] = point[o] + (pa[o] - pb[o]) / len(pairs)
            samples[o] = samples[o] + (sa[o] - sb[o]) / len(pairs)
    q = {o: _percentiles(samples[o], level) for o in ORDERS}
    return PairedDifference(first.thresholds, point, {o: q[o][0] for o in ORDERS}, {o: q[o][1] for o in ORDERS},
                            first.num_scenes, len(draws), seed, level)
