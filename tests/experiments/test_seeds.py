"""Seed archives of the main table (experiments.archives, experiments.seeds) and the pooled paired
difference behind them: a closed-form pooled interval, archive round trip, the spread and verdicts, and
errors that name the file and the field."""
import dataclasses
import json
import math
import re
import shutil

import numpy as np
import pytest

from experiments.archives import archive_seed, load_archive, load_archives
from experiments.results import ResultRow
from experiments.seeds import main, seed_section, spread_json
from opencood_ext.eval.bootstrap import paired_difference, pooled_paired_difference
from opencood_ext.eval.records import FrameRecords
from scene_records import hit_records

SCENES, FRAMES = 10, 2


def _records(hits):
    return hit_records(hits, SCENES, FRAMES)


def test_pooled_difference_closed_form():
    # seed A: 6 vs 4 hit scenes (the difference is scenes 4 and 5); seed B: 6 vs 6 (no difference).
    # Pooled over both seeds, a resample's difference is (draws of scenes 4, 5) / 10 / 2: Binomial(10, 0.2) / 20.
    a = _records(set(range(6)))
    pairs = [(a, _records(set(range(4)))), (a, _records(set(range(6))))]
    pooled = pooled_paired_difference(pairs, resamples=4000, seed=3)
    np.testing.assert_allclose(pooled.diff["global"], [0.1, 0.1, 0.1])
    cdf = np.cumsum([math.comb(10, k) * 0.2 ** k * 0.8 ** (10 - k) for k in range(11)])
    lo, hi = np.searchsorted(cdf, 0.025) / 20, np.searchsorted(cdf, 0.975) / 20
    assert (lo, hi) == (0.0, 0.25)
    np.testing.assert_allclose(pooled.lo["global"], lo)
    np.testing.assert_allclose(pooled.hi["global"], hi)
    assert not pooled.significant("global").any()  # scene draws with neither scene 4 nor 5 give 0
    # one pair pooled is exactly that pair's paired difference (same draws)
    one = pooled_paired_difference(pairs[:1], resamples=500, seed=2)
    ref = paired_difference(*pairs[0], resamples=500, seed=2)
    for o in ("global", "per_frame"):
        np.testing.assert_array_equal(one.diff[o], ref.diff[o])
        np.testing.assert_array_equal(one.lo[o], ref.lo[o])
        np.testing.assert_array_equal(one.hi[o], ref.hi[o])


def test_pooled_difference_pairs_frames_in_any_order():
    a, b = _records(set(range(7))), _records(set(range(3)))
    idx = np.random.default_rng(0).permutation(a.num_frames)
    reordered = FrameRecords(b.thresholds, *_reorder(b, idx))
    x = pooled_paired_difference([(a, b)], resamples=300, seed=1)
    y = pooled_paired_difference([(a, reordered)], resamples=300, seed=1)
    np.testing.assert_array_equal(x.lo["global"], y.lo["global"])
    with pytest.raises(ValueError, match="no pairs"):
        pooled_paired_difference([])


def _reorder(rec, idx):
    starts, lengths = rec.offsets[idx], np.diff(rec.offsets)[idx]
    take = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)]).astype(np.int64)
    return (rec.scores[take], rec.tp[:, take], np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            rec.num_gt[idx], rec.scenes[idx], rec.frames[idx])


def _rows(tmp, seed, hits):
    """Main-table rows as the main job produces them, each evaluation's frames file written to ``tmp``."""
    return [ResultRow.from_dict(d) for d in _row_dicts(tmp, seed, hits)]


def _row_dicts(tmp, seed, hits):
    """The rows as results.json holds them."""
    rows = []
    for method, (on, off) in hits.items():
        entry = {"method": method, "table": "main", "trainable_params": 7, "train_wall_s": 1.0}
        for key, h in (("eval", on), ("ego_only", off)):
            rec = _records(set(range(h)))
            path = rec.save(tmp / f"s{seed}_{method[:4]}_{key}.npz")
            ap = {t: h / SCENES for t in ("0.3", "0.5", "0.7")}
            entry[key] = {"ap": {"global": ap, "per_frame": ap}, "frames_file": str(path), "bytes_per_message": 9,
                          "recall_by_visibility": {"collaborators_only": {"gt": 10, "recall": h / 10}}}
        if method == "No fusion":
            entry["ego_only"] = entry["eval"]  # as the main job records it: one evaluation
        rows.append(entry)
    return rows + [_bench_row_dict(tmp, seed, hits["GenComm (m3 onboarded)"][0])]


def _bench_row_dict(tmp, seed, hits):
    """A benchmark row as results.json holds it: its run folder holds the records of alliances {m1} and {m1, m3}
    (``hits - 2`` and ``hits`` hit scenes)."""
    from opencood_ext.run_folder import RunFolder, evaluation_label
    run = tmp / f"s{seed}_onboard_backalign_m3"
    run.mkdir(exist_ok=True)
    dynamic = []
    for types, h in ((["m1"], hits - 2), (["m1", "m3"], hits)):
        _records(set(range(h))).save(RunFolder(run).frames(evaluation_label(alliance=types)))
        ap = {t: h / SCENES for t in ("0.3", "0.5", "0.7")}
        dynamic.append({"types": types, "ap": {"global": ap, "per_frame": ap}, "bytes_per_message": 5.0})
    return {"method": "BackAlign (m3 onboarded)", "table": "heterogeneous", "eval": dynamic[-1], "run": str(run),
            "dynamic": dynamic, "train_wall_s": 3.0, "trainable_params": 11, "onboard_method": "backalign",
            "protocol": "equalized", "training_seed": seed, "optimizer_steps": 40}


HITS = {0: {"No fusion": (5, 5), "Late fusion": (10, 4), "GenComm (m3 onboarded)": (7, 5)},
        1: {"No fusion": (4, 4), "Late fusion": (10, 4), "GenComm (m3 onboarded)": (7, 3)},
        2: {"No fusion": (5, 5), "Late fusion": (9, 5), "GenComm (m3 onboarded)": (6, 5)}}


def _archives(tmp_path, seeds=(0, 1, 2), meta=None):
    for s in seeds:
        archive_seed(_rows(tmp_path, s, HITS[s]), s, tmp_path / "seeds",
                     meta or {"profile": "default", "data_seed": 0})
    return [tmp_path / "seeds" / f"seed{s}" for s in seeds]


def test_archive_round_trip_and_spread(tmp_path):
    folders = _archives(tmp_path)
    a = load_archive(folders[1])
    assert a.seed == 1 and [r.method for r in a.rows] == ["No fusion", "Late fusion", "GenComm (m3 onboarded)"]
    assert a.meta["profile"] == "default" and a.meta["data_seed"] == 0
    assert [r.method_id for r in a.rows] == ["no_fusion", "late", "gencomm"]  # from the names: no ids in the rows
    assert a.records(a.row("late")).num_frames == SCENES * FRAMES
    # the archive holds copies: deleting the run's files does not lose it
    for f in tmp_path.glob("s*_*.npz"):
        f.unlink()
    spread = {e["method"]: e for e in spread_json(load_archives(reversed(folders)))}
    late = spread["Late fusion"]
    assert list(late["seeds"]) == ["0", "1", "2"]
    assert late["0.5"]["mean"] == pytest.approx((1.0 + 1.0 + 0.9) / 3)
    assert late["0.5"]["std"] == pytest.approx(np.std([1.0, 1.0, 0.9], ddof=1))
    assert a.row("no_fusion").ego_only.records == "row0.npz"  # one evaluation, stored once
    # version 2: the benchmark row, every alliance with its own records, and what the row states about its run
    b = a.bench_row("backalign")
    assert [x.types for x in b.alliances] == [["m1"], ["m1", "m3"]]
    assert (b.protocol, b.training_seed, b.optimizer_steps, b.onboard_method) == ("equalized", 1, 40, "backalign")
    assert a.load(b.alliance(["m1", "m3"]).eval).num_frames == SCENES * FRAMES
    assert a.load(b.alliance(["m1"]).eval).num_scenes == SCENES
    assert b.alliance(["m1"]).eval.ap["global"]["0.5"] == pytest.approx(0.5)  # 7 - 2 of 10 scenes


def test_seed_section_verdicts(tmp_path):
    text = "\n".join(seed_section(load_archives(_archives(tmp_path)), resamples=300))
    assert "Training seeds 0, 1, 2" in text and "20 test frames of 10 scenes" in text
    assert "| Late fusion | 0.967 ± 0.058 | 0.967 ± 0.058 | 0.967 ± 0.058 | 1.000, 1.000, 0.900 |" in text
    # Late beats GenComm by 3 scenes in every seed; No fusion trails by 1-3 scenes, not significantly every time
    late = next(ln for ln in text.splitlines() if ln.startswith("| Late fusion | **+0.3"))
    assert late.count("+0.300*") == 9
    verdict = next(ln for ln in text.splitlines() if ln.startswith("Against GenComm, significant in every seed"))
    assert "Late fusion above GenComm at AP@0.5" in verdict
    assert "No fusion" not in verdict
    # what cooperation adds: GenComm with its collaborators off loses 2, 4, 1 scenes
    coop = next(ln for ln in text.splitlines() if ln.startswith("| GenComm (m3 onboarded) | **+0.233"))
    assert "+0.200, +0.400*, +0.100" in coop  # 2 of 10 scenes: 0.8**10 = 11% of draws miss both
    coop_table = text.split("What cooperation adds")[1].split("Recall@0.5 of the test objects")[0]
    assert "| No fusion |" not in coop_table  # no fusion has nothing to switch off
    assert "Not significant pooled: No fusion below GenComm at AP@0.3" in text
    assert "| GenComm (m3 onboarded) | 0.700 (7 of 10) | 0.700 (7 of 10) | 0.600 (6 of 10) |" in text


def test_a_row_level_with_the_reference_is_called_equal(tmp_path):
    hits = {"No fusion": (7, 7), "Late fusion": (10, 4), "GenComm (m3 onboarded)": (7, 5)}  # no fusion = GenComm
    for s in (0, 1):
        archive_seed(_rows(tmp_path, s, hits), s, tmp_path / "seeds", {"profile": "default", "data_seed": 0})
    text = "\n".join(seed_section(load_archives([tmp_path / "seeds" / f"seed{s}" for s in (0, 1)]), resamples=100))
    assert "No fusion equal to GenComm at AP@0.5" in text and "No fusion below GenComm" not in text


def test_archives_of_different_experiments_are_refused(tmp_path):
    folders = _archives(tmp_path, seeds=(0, 1))
    other = _archives(tmp_path / "x", seeds=(2,), meta={"profile": "default", "data_seed": 5})
    with pytest.raises(ValueError, match=r"seed2/rows.json: field 'data_seed' is 5"):
        load_archives([*folders, *other])
    twice = tmp_path / "copy"
    shutil.copytree(folders[1], twice)
    with pytest.raises(ValueError, match="seed 1 twice"):
        load_archives([*folders, twice])
    bad = folders[0] / "rows.json"
    doc = json.loads(bad.read_text())
    del doc["rows"][1]["ego_only"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"seed0/rows.json: key 'rows\.1\.ego_only': missing"):
        load_archive(folders[0])
    with pytest.raises(FileNotFoundError, match="no seed archive"):
        load_archive(tmp_path)


def test_archiving_a_row_without_records_fails_and_leaves_nothing(tmp_path):
    rows = _rows(tmp_path, 0, HITS[0])
    rows[1].ego_only.records = str(tmp_path / "gone.npz")
    with pytest.raises(FileNotFoundError, match="'Late fusion': ego_only.frames_file"):
        archive_seed(rows, 0, tmp_path / "seeds")
    assert not (tmp_path / "seeds" / "seed0").exists() and not (tmp_path / "seeds" / "seed0.tmp").exists()


def test_cli_archive_then_report(tmp_path, capsys):
    for s in (0, 1):
        res = {"profile": "default", "seed": 0, "training_seeds": [s], "rows": _row_dicts(tmp_path, s, HITS[s]),
               "data": "d", "onboarding": {}, "stage1_wall_s": {}, "total_wall_s": 1.0}
        (tmp_path / f"results{s}.json").write_text(json.dumps(res))
        assert main(["archive", str(tmp_path / f"results{s}.json"), "-o", str(tmp_path / "arch")]) == 0
    assert main(["report", str(tmp_path / "arch" / "seed0"), str(tmp_path / "arch" / "seed1"),
                 "-o", str(tmp_path / "spread.md"), "--json", str(tmp_path / "spread.json"), "--resamples", "200"]) == 0
    assert "## Run-to-run spread over training seeds" in (tmp_path / "spread.md").read_text()
    assert load_archive(tmp_path / "arch" / "seed0").meta["commit"] is None  # results.json names none: not guessed
    res["commit"] = "abc1234"
    (tmp_path / "results1.json").write_text(json.dumps(res))
    main(["archive", str(tmp_path / "results1.json"), "-o", str(tmp_path / "arch")])
    assert load_archive(tmp_path / "arch" / "seed1").meta["commit"] == "abc1234"
    main(["archive", str(tmp_path / "results1.json"), "-o", str(tmp_path / "arch"), "--commit", "f1634c6"])
    assert load_archive(tmp_path / "arch" / "seed1").meta["commit"] == "f1634c6"
    assert json.loads((tmp_path / "spread.json").read_text())[0]["method"] == "No fusion"
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 2  # exit 2 and one line, as every other tool
    assert re.fullmatch(r"error: gencomm-seed-report: .*no seed archive here.*\n", capsys.readouterr().err)
    (tmp_path / "bad.json").write_text(json.dumps({"rows": []}))
    assert main(["archive", str(tmp_path / "bad.json"), "-o", str(tmp_path / "arch")]) == 2
    err = capsys.readouterr().err
    assert "bad.json: key '<top level>': missing required key(s) ['profile'" in err and err.count("\n") == 1
    (tmp_path / "bad.json").write_text(json.dumps({**res, "rows": [{"method": 3}]}))
    assert main(["archive", str(tmp_path / "bad.json"), "-o", str(tmp_path / "arch")]) == 2
    assert capsys.readouterr().err == "error: gencomm-seed-report: " + str(tmp_path / "bad.json") + \
        ": key 'rows.0.method': expected a string, got 3\n"
    bad = tmp_path / "arch" / "seed0" / "row1.npz"
    bad.write_bytes(bad.read_bytes()[:50])  # a truncated archive file: still one line and exit 2
    assert main(["report", str(tmp_path / "arch" / "seed0"), str(tmp_path / "arch" / "seed1")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: gencomm-seed-report: ") and err.count("\n") == 1
    (tmp_path / "cut.json").write_text('{"rows": [')
    assert main(["archive", str(tmp_path / "cut.json"), "-o", str(tmp_path / "arch")]) == 2
    err = capsys.readouterr().err
    assert "cut.json: not a results.json" in err and "Traceback" not in err and err.count("\n") == 1


def test_main_job_spread_covers_earlier_invocations_of_the_same_experiment(tmp_path):
    from experiments.reproduce import seed_archives
    _archives(tmp_path, seeds=(0, 2))
    archive_seed(_rows(tmp_path, 1, HITS[1]), 1, tmp_path / "seeds", {"profile": "quick", "data_seed": 0})
    assert [p.name for p in seed_archives(tmp_path, "default", 0)] == ["seed0", "seed2"]
    assert seed_archives(tmp_path, "default", 1) == []


def test_main_job_spread_leaves_out_archives_of_another_test_split(tmp_path):
    """A seed evaluated on an earlier test split (e.g. before the separate test set) stays out of the spread
    instead of failing the invocation at its end."""
    from experiments.reproduce import seed_archives
    _archives(tmp_path, seeds=(0, 2))
    rows = _rows(tmp_path, 1, HITS[1])
    for r in rows[:-1]:  # the same rows on a renamed test split
        for key in ("eval", "ego_only"):
            ev = getattr(r, key)
            rec = ev.load_records(r.run)
            rec = dataclasses.replace(rec, frames=np.array([f"other/{f}" for f in rec.frames]))
            ev.records = str(rec.save(tmp_path / f"other_{r.method[:4]}_{key}.npz"))
    archive_seed(rows, 1, tmp_path / "seeds", {"profile": "default", "data_seed": 0})
    seeds = tmp_path / "seeds"
    assert [p.name for p in seed_archives(tmp_path, "default", 0, like=seeds / "seed2")] == ["seed0", "seed2"]
    assert [p.name for p in seed_archives(tmp_path, "default", 0, like=seeds / "seed1")] == ["seed1"]
    with pytest.raises(ValueError, match="test frames differ"):
        load_archives(seed_archives(tmp_path, "default", 0))


def test_separate_test_set_is_simulated_from_scenes_the_dataset_never_draws(tmp_path, monkeypatch):
    from experiments import pipeline
    from experiments.profiles import PROFILES
    from opencood_ext.sim.recorder import scenario_seed
    ran = []
    monkeypatch.setattr(pipeline, "call", ran.append)
    lidar_pair = dataclasses.replace(PROFILES["default"], benchmark_types=("m1", "m3"))
    root = pipeline.simulate_test_set(tmp_path / "sim", lidar_pair, seed=3)
    assert root == tmp_path / "sim_test"
    cmd = ran[-1]
    arg = cmd.value
    assert cmd.program == "gencomm-sim"
    assert (arg("-o"), arg("--scenarios"), arg("--frames")) == (str(root), "230", "1")
    assert list(cmd.argv[cmd.argv.index("--split_ratio") + 1:][:3]) == ["0", "0", "1"] and "--no_cameras" in cmd
    test_seed = int(arg("--seed"))
    dataset = {scenario_seed(3, k) for k in range(lidar_pair.scenarios)}
    assert not dataset & {scenario_seed(test_seed, k) for k in range(230)}
    four_types = dataclasses.replace(PROFILES["default"], benchmark=True)  # --benchmark: four types, cameras
    pipeline.simulate_test_set(tmp_path / "sim", four_types, seed=3)
    assert "--no_cameras" not in ran[-1] and ran[-1].value("--camera_size") == "400x300"
    no_split = dataclasses.replace(lidar_pair, test_scenes=0)
    assert pipeline.simulate_test_set(tmp_path / "sim", no_split, seed=3) is None and len(ran) == 2


def _pd(diff, lo, hi):
    from opencood_ext.eval.bootstrap import PairedDifference
    a = lambda v: {"global": np.array([v])}  # noqa: E731
    return PairedDifference(thresholds=(0.5,), diff=a(diff), lo=a(lo), hi=a(hi), num_scenes=10, resamples=100, seed=0)


def test_holds_every_seed_needs_every_seed_significant_with_the_pooled_sign():
    """The one verdict rule the seed report and the fair benchmark share."""
    from experiments.comparisons import holds_every_seed
    up, down, unsure = _pd(0.1, 0.05, 0.15), _pd(-0.1, -0.15, -0.05), _pd(0.02, -0.01, 0.05)
    assert holds_every_seed([up, up, up], _pd(0.1, 0.07, 0.13), "0.5")
    assert holds_every_seed([down, down], _pd(-0.1, -0.12, -0.08), 0.5)
    assert not holds_every_seed([up, unsure, up], _pd(0.07, 0.03, 0.11), "0.5")  # one seed unsure
    assert not holds_every_seed([up, down], _pd(0.0, -0.05, 0.05), "0.5")  # signs disagree, pooled 0
    assert not holds_every_seed([up, up], _pd(-0.01, -0.02, -0.005), "0.5")  # against the pooled sign
    assert not holds_every_seed([], _pd(0.0, 0.0, 0.0), "0.5")
