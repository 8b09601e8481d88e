"""Scene bootstrap of AP (opencood_ext.eval.bootstrap; the records in opencood_ext.eval.records):
closed-form binomial cases, exact enumeration of every resample of a tiny case against re-matching
from scratch, identity resample, paired differences, scene-level resampling, seeds, the records file."""
import itertools
import math

import numpy as np
import pytest

from opencood_ext.eval.ap import APAccumulator
from opencood_ext.eval.bootstrap import bootstrap_ap, paired_difference, resample_frames, scene_draws
from opencood_ext.eval.records import FrameRecords


def _box(x, y, yaw=0.0):
    return [x, y, 0.0, 4.0, 1.8, 1.5, yaw]


def _hit_miss_records(hits, scenes=10, frames_per_scene=2):
    """Every frame has one GT car; in a hit scene every frame detects it exactly (score 0.9), in a miss
    scene no frame detects anything. Both AP orders then equal (hit scenes drawn) / (scenes drawn)."""
    out = []
    for s in range(scenes):
        for f in range(frames_per_scene):
            gt = np.array([_box(5.0 * f, 3.0)])
            pred, score = (gt, np.array([0.9])) if s in hits else (np.zeros((0, 7)), np.zeros(0))
            out.append((pred, score, gt, f"scene{s}", f"scene{s}/{f:06d}"))
    return FrameRecords.from_detections(out)


def _binomial_quantiles(n, p, level=0.95):
    """Lower / upper (1 - level) / 2 quantiles of Binomial(n, p) / n, and the distance of each tail
    probability from the CDF steps around it (so a test can check the quantile is well inside an atom)."""
    cdf = np.cumsum([math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(n + 1)])
    tail = (1 - level) / 2
    lo, hi = int(np.searchsorted(cdf, tail)), int(np.searchsorted(cdf, 1 - tail))
    margin = min(cdf[lo] - tail, tail - (cdf[lo - 1] if lo else 0.0), cdf[hi] - (1 - tail), (1 - tail) - cdf[hi - 1])
    return lo / n, hi / n, margin


def test_closed_form_binomial_interval_over_scenes_not_frames():
    rec = _hit_miss_records(hits=set(range(6)))
    boot = bootstrap_ap(rec, resamples=4000, seed=1)
    lo, hi, margin = _binomial_quantiles(10, 0.6)  # AP* = Binomial(10 scenes, 0.6) / 10
    assert margin > 0.01  # the 2.5 % / 97.5 % points sit well inside an atom of the distribution
    for order in ("global", "per_frame"):
        np.testing.assert_array_equal(boot.ap[order], [0.6, 0.6, 0.6])
        np.testing.assert_allclose(boot.lo[order], lo)
        np.testing.assert_allclose(boot.hi[order], hi)
        # the bootstrap distribution itself: mean 0.6, variance p (1 - p) / n
        assert boot.samples[order][:, 1].mean() == pytest.approx(0.6, abs=0.01)
        assert boot.samples[order][:, 1].var() == pytest.approx(0.024, rel=0.1)
    assert (lo, hi) == (0.3, 0.9)
    # resampling the 20 frames independently would give Binomial(20, 0.6) / 20: a narrower interval
    f_lo, f_hi, _ = _binomial_quantiles(20, 0.6)
    assert f_lo > lo and f_hi < hi
    assert boot.num_scenes == 10 and boot.resamples == 4000
    assert boot.ci_json()["global"] == {"0.3": [0.3, 0.9], "0.5": [0.3, 0.9], "0.7": [0.3, 0.9]}


def test_closed_form_paired_difference():
    a = _hit_miss_records(hits=set(range(9)))       # 9 of 10 scenes
    b = _hit_miss_records(hits={0, 1, 2})            # a subset: the difference counts scenes 3..8
    d = paired_difference(a, b, resamples=4000, seed=2)
    lo, hi, margin = _binomial_quantiles(10, 0.6)    # AP(a) - AP(b) = Binomial(10, 0.6) / 10
    assert margin > 0.01
    np.testing.assert_allclose(d.diff["global"], 0.6)
    np.testing.assert_allclose(d.lo["global"], lo)
    np.testing.assert_allclose(d.hi["global"], hi)
    assert d.significant("global").all()
    flipped = paired_difference(b, a, resamples=4000, seed=2)
    np.testing.assert_allclose(flipped.lo["global"], -d.hi["global"])
    assert d.to_json()["global"]["0.5"] == {"diff": pytest.approx(0.6), "ci": [pytest.approx(lo), pytest.approx(hi)],
                                            "significant": True}


def _random_frames(rng, scenes, n_frames, ties=False):
    """Frames with noisy detections of GT cars plus false positives; scenes interleaved (frame k belongs
    to scenes[k % len(scenes)]), so scene frames are not contiguous."""
    out = []
    for k in range(n_frames):
        g = int(rng.integers(0, 5))
        gt = np.array([_box(rng.uniform(-30, 30), rng.uniform(-30, 30), rng.uniform(-3, 3)) for _ in range(g)])
        gt = gt.reshape(-1, 7)
        pred = gt[rng.random(g) < 0.8].copy()
        pred[:, :2] += rng.normal(0, 0.6, (len(pred), 2))
        fp = np.array([_box(rng.uniform(-30, 30), rng.uniform(-30, 30)) for _ in range(int(rng.integers(0, 3)))])
        pred = np.concatenate([pred, fp.reshape(-1, 7)])
        scores = rng.choice([0.2, 0.5, 0.8], len(pred)) if ties else rng.random(len(pred))
        s = scenes[k % len(scenes)]
        out.append((pred, scores, gt, s, f"{s}/{k:06d}"))
    return out


def test_every_resample_of_three_scenes_matches_rematching_from_scratch():
    rng = np.random.default_rng(0)
    frames = _random_frames(rng, ["a", "b", "c"], 7, ties=True)
    rec = FrameRecords.from_detections(frames)
    assert rec.scene_ids == ["a", "b", "c"]
    draws = np.array([np.bincount(d, minlength=3) for d in itertools.product(range(3), repeat=3)])
    assert len(draws) == 27
    boot = bootstrap_ap(rec, resamples=27, draws=draws)
    brute = {"global": [], "per_frame": []}
    for counts in draws:
        acc = APAccumulator()
        for pred, scores, gt, scene, _ in frames:  # every frame in order, repeated as often as its scene
            for _ in range(counts[rec.scene_ids.index(scene)]):
                acc.add(pred, scores, gt)
        res = acc.results()
        for order in brute:
            brute[order].append([res[order].ap[t] for t in (0.3, 0.5, 0.7)])
    for order in brute:
        exact = np.array(brute[order])
        np.testing.assert_array_equal(boot.samples[order], exact)
        np.testing.assert_allclose(boot.lo[order], np.percentile(exact, 2.5, axis=0), rtol=1e-12)
        np.testing.assert_allclose(boot.hi[order], np.percentile(exact, 97.5, axis=0), rtol=1e-12)
    assert not np.allclose(boot.samples["global"], boot.samples["global"][0])  # the draws do differ


def test_identity_resample_is_the_plain_ap_exactly():
    rng = np.random.default_rng(3)
    frames = _random_frames(rng, ["s1", "s0", "s2", "s3"], 23, ties=True)
    acc = APAccumulator()
    for pred, scores, gt, *_ in frames:
        acc.add(pred, scores, gt)
    plain = acc.results()
    rec = FrameRecords.from_detections(frames)
    boot = bootstrap_ap(rec, resamples=1, draws=np.ones((1, rec.num_scenes), dtype=np.int64))
    for order in ("global", "per_frame"):
        expected = [plain[order].ap[t] for t in (0.3, 0.5, 0.7)]
        np.testing.assert_array_equal(boot.ap[order], expected)      # the point estimate
        np.testing.assert_array_equal(boot.samples[order][0], expected)  # the identity resample
        np.testing.assert_array_equal(boot.lo[order], expected)
    assert plain["global"].ap[0.5] != plain["per_frame"].ap[0.5]  # the two orders are really exercised


def test_a_method_against_itself_differs_by_exactly_zero():
    rec = FrameRecords.from_detections(_random_frames(np.random.default_rng(4), list("pqrst"), 20))
    d = paired_difference(rec, rec, resamples=300, seed=5)
    for order in ("global", "per_frame"):
        assert (d.diff[order] == 0).all() and (d.lo[order] == 0).all() and (d.hi[order] == 0).all()
        assert not d.significant(order).any()
    # and against a copy stored in another frame order: pairing is by frame key, not position
    perm = np.random.default_rng(6).permutation(rec.num_frames)
    frames = _random_frames(np.random.default_rng(4), list("pqrst"), 20)
    shuffled = FrameRecords.from_detections([frames[k] for k in perm])
    d2 = paired_difference(rec, shuffled, resamples=300, seed=5)
    assert (d2.lo["global"] == 0).all() and (d2.hi["global"] == 0).all()


def test_resampling_moves_the_frames_of_a_scene_together():
    rec = FrameRecords.from_detections(_random_frames(np.random.default_rng(7), ["x", "y", "z", "w"], 13))
    draws = scene_draws(rec.num_scenes, 200, seed=0)
    assert draws.shape == (200, 4) and (draws.sum(axis=1) == 4).all()
    for counts in draws:
        taken = np.bincount(resample_frames(rec, counts), minlength=rec.num_frames)
        for k, scene in enumerate(rec.scene_ids):
            np.testing.assert_array_equal(taken[rec.scenes == scene], counts[k])
    # the draws really vary scene multiplicities (some scene drawn twice, some not at all)
    assert (draws == 0).any() and (draws >= 2).any()


def test_seeds_reproduce_and_differ():
    rec = FrameRecords.from_detections(_random_frames(np.random.default_rng(8), list("abcdef"), 18))
    one, two, other = (bootstrap_ap(rec, 200, seed=s) for s in (11, 11, 12))
    np.testing.assert_array_equal(one.samples["global"], two.samples["global"])
    assert one.ci_json() == two.ci_json()
    assert not np.array_equal(one.samples["global"], other.samples["global"])


def test_records_round_trip_and_clear_errors(tmp_path):
    rec = FrameRecords.from_detections(_random_frames(np.random.default_rng(9), ["u", "v"], 6))
    path = rec.save(tmp_path / "eval_x_frames.npz")
    back = FrameRecords.load(path)
    for name in ("scores", "tp", "offsets", "num_gt", "scenes", "frames"):
        np.testing.assert_array_equal(getattr(back, name), getattr(rec, name))
    assert back.thresholds == rec.thresholds and not list(tmp_path.glob("*.tmp"))
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        FrameRecords.load(tmp_path / "missing.npz")
    np.savez(tmp_path / "bad.npz", scores=np.zeros(0))
    with pytest.raises(ValueError, match=r"bad\.npz.*missing field"):
        FrameRecords.load(tmp_path / "bad.npz")
    fewer = FrameRecords.from_detections(_random_frames(np.random.default_rng(9), ["u", "v"], 5))
    with pytest.raises(ValueError, match="different frames"):
        paired_difference(rec, fewer)
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_ap(rec, resamples=0)


def test_subset_keeps_exactly_the_scenes_frames():
    """FrameRecords.subset (a scene family's frames): exactly the frames of the named scenes, in evaluation
    order, each with its own detections and GT; its AP is that of matching those frames from scratch."""
    frames = _random_frames(np.random.default_rng(11), ["j0", "r0", "j1", "r1", "j2"], 25)
    rec = FrameRecords.from_detections(frames)
    sub = rec.subset(["j2", "j0", "j1", "j0"])          # order and repeats of the names do not matter
    kept = [f for f in frames if f[3].startswith("j")]
    assert sub.frames.tolist() == [f[4] for f in kept] and sub.scene_ids == ["j0", "j1", "j2"]
    assert sub.thresholds == rec.thresholds and sub.num_gt.tolist() == [len(f[2]) for f in kept]
    own = FrameRecords.from_detections(kept)
    for name in ("scores", "tp", "offsets", "num_gt", "scenes"):
        np.testing.assert_array_equal(getattr(sub, name), getattr(own, name))
    acc = APAccumulator()
    for pred, scores, gt, *_ in kept:
        acc.add(pred, scores, gt)
    point = bootstrap_ap(sub, resamples=1, draws=np.ones((1, sub.num_scenes), dtype=np.int64)).ap["global"]
    np.testing.assert_array_equal(point, [acc.results()["global"].ap[t] for t in (0.3, 0.5, 0.7)])
    rest = rec.subset(["r0", "r1"])
    assert sub.num_frames + rest.num_frames == rec.num_frames and len(sub.scores) + len(rest.scores) == len(rec.scores)
    assert rec.subset([]).num_frames == 0
    with pytest.raises(ValueError, match=r"subset: 1 scene\(s\) not in these records.*'x9'"):
        rec.subset(["j0", "x9"])


def test_repeated_resampling_is_looked_up_and_never_confused():
    """A report pairs one evaluation with many others over the same draws, so the resampled APs are
    kept by the content of the records and draws: a repeat returns the same (read-only) arrays, while
    records that differ in one score, or other draws, are computed afresh."""
    from opencood_ext.eval import bootstrap as bs

    frames = _random_frames(np.random.default_rng(9), list("abcde"), 15)
    rec = FrameRecords.from_detections(frames)
    first, again = bootstrap_ap(rec, 50, seed=1), bootstrap_ap(FrameRecords.from_detections(frames), 50, seed=1)
    assert first.samples["global"] is again.samples["global"]  # equal content: looked up
    with pytest.raises(ValueError):
        first.samples["global"][0, 0] = 0.5
    k = next(i for i, f in enumerate(frames) if len(f[1]))
    changed = list(frames)
    changed[k] = (frames[k][0], frames[k][1] * 0.5 + 0.01, *frames[k][2:])
    other = FrameRecords.from_detections(changed)
    bs._SAMPLES_CACHE.clear()
    fresh = bootstrap_ap(other, 50, seed=1).samples["global"]
    assert not np.array_equal(fresh, first.samples["global"])  # the changed score does move AP
    np.testing.assert_array_equal(bootstrap_ap(rec, 50, seed=1).samples["global"], first.samples["global"])
    np.testing.assert_array_equal(bootstrap_ap(other, 50, seed=1).samples["global"], fresh)
    assert not np.array_equal(bootstrap_ap(rec, 50, seed=2).samples["global"], first.samples["global"])
    for s in range(bs._SAMPLES_CACHE_SIZE + 5):
        bootstrap_ap(rec, 2, seed=100 + s)
    assert len(bs._SAMPLES_CACHE) == bs._SAMPLES_CACHE_SIZE
