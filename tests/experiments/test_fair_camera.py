"""The fair benchmark's camera question (experiments.fair_results, issue 31 item 3): seed archives keep
every scored onboarding epoch's alliances, and results.json / REPORT.md give what the camera adds to
each method, per seed and pooled, with the selected weights and at every scored epoch.

Closed-form records (tests/experiments/test_seeds.py): AP = hit scenes / scenes, so every difference is known."""
import json

import pytest

from experiments.archives import archive_seed, load_archive
from experiments.evaluation import Alliance, Evaluation
from experiments.fair import write_fair_benchmark
from experiments.method_ids import legacy_method_id
from experiments.results import ResultRow
from opencood_ext.run_folder import RunFolder, dynamic_label, epoch_checkpoint, evaluation_label
from test_seeds import SCENES, _records

TYPES = (["m1"], ["m1", "m2"])  # m2: the camera type joining
# method -> hit scenes per alliance with the selected weights, and per scored epoch
SELECTED = {"GenComm (m2 onboarded)": (5, 7), "BackAlign (m2 onboarded)": (2, 7), "No fusion (m1 stage-1 model)": (4, 4)}
GENCOMM_EPOCHS = {1: (5, 5), 2: (5, 7), 3: (5, 6)}  # the camera adds 0, 2 and 1 scenes
BEST_EPOCH = 2


def _ap(h):
    ap = {t: h / SCENES for t in ("0.3", "0.5", "0.7")}
    return {"global": ap, "per_frame": ap}


def _table(run, hits, checkpoint=None):
    """One growing-alliance table in ``run`` as gencomm-infer --dynamic writes it."""
    folder = RunFolder(run)
    entries = []
    for types, h in zip(TYPES, hits):
        _records(set(range(h))).save(folder.frames(evaluation_label(alliance=types, checkpoint=checkpoint)))
        entries.append({"types": types, "ap": _ap(h)})
    folder.evaluation(dynamic_label(checkpoint)).write_text(json.dumps(entries))
    return entries


def _rows(tmp, seed):
    on = _records(set(range(4))).save(tmp / f"main{seed}.npz")
    rows = [ResultRow("no_fusion", "No fusion", Evaluation(_ap(4), records=str(on)),
                      ego_only=Evaluation(_ap(4), records=str(on)), train_wall_s=10.0, trainable_params=100,
                      protocol="equalized", training_seed=seed, optimizer_steps=576)]
    for m, hits in SELECTED.items():
        run = tmp / f"seed{seed}_{m.split()[0]}"
        run.mkdir()
        dynamic = [Alliance.from_run_json(e) for e in _table(run, hits)]
        onboard = None if m.startswith("No fusion") else m.split()[0].lower()
        if onboard == "gencomm":  # the job scored this onboarding's every kept epoch
            for n, epoch_hits in GENCOMM_EPOCHS.items():
                _table(run, epoch_hits, epoch_checkpoint(n))
            RunFolder(run).onboarding_report.write_text(json.dumps({"best_epoch": BEST_EPOCH}))
        rows.append(ResultRow(legacy_method_id(m, "heterogeneous", onboard), m, dynamic[-1].eval, table="heterogeneous",
                              run=str(run), alliances=dynamic, train_wall_s=5.0, trainable_params=10,
                              protocol="equalized", training_seed=seed, optimizer_steps=0 if onboard is None else 288,
                              onboard_method=onboard))
    return rows


def _archives(tmp):
    meta = {"profile": "default", "data_seed": 0, "commit": "abc1234", "command": "gencomm-reproduce"}
    return [archive_seed(_rows(tmp, s), s, tmp / "seeds", meta) for s in (0, 1)]


def test_archive_keeps_scored_epochs(tmp_path):
    folder = _archives(tmp_path)[0]
    a = load_archive(folder)
    gen, back = a.bench_row("gencomm"), a.bench_row("backalign")
    assert sorted(gen.epochs) == [1, 2, 3] and gen.best_epoch == BEST_EPOCH
    assert back.epochs == {} and back.best_epoch is None  # not scored: nothing claimed
    for n, hits in GENCOMM_EPOCHS.items():
        for types, h in zip(TYPES, hits):
            ev = gen.alliance(types, n).eval
            assert ev.ap["global"]["0.5"] == pytest.approx(h / SCENES)
            assert a.load(ev).scene_ids is not None and (folder / ev.records).is_file()
    assert gen.alliance(["m1", "m2"], 4) is None
    # the records of epoch 3's {m1, m2} are epoch 3's, not the selected weights'
    assert a.load(gen.alliance(["m1", "m2"], 3).eval).tp[0].sum() == 6 * 2


def test_camera_rows_and_report(tmp_path):
    dest = tmp_path / "fair"
    report = write_fair_benchmark(_archives(tmp_path), dest, resamples=200).read_text()
    camera = json.loads((dest / "results.json").read_text())["camera"]
    by = {(c["method"], c["step"], c["weights"]): c for c in camera}
    assert not any(m.startswith("No fusion") for m, _, _ in by)  # its alliances are all the ego alone
    assert set(by) == {("BackAlign (m2 onboarded)", "+m2", "selected"), ("GenComm (m2 onboarded)", "+m2", "selected"),
                       *{("GenComm (m2 onboarded)", "+m2", f"epoch_{n}") for n in GENCOMM_EPOCHS}}
    back = by[("BackAlign (m2 onboarded)", "+m2", "selected")]
    assert back["pooled"]["diff"] == pytest.approx(0.5) and back["significant_every_seed"]
    assert list(back["per_seed"]) == ["0", "1"]
    for n, (before, after) in GENCOMM_EPOCHS.items():
        c = by[("GenComm (m2 onboarded)", "+m2", f"epoch_{n}")]
        assert c["pooled"]["diff"] == pytest.approx((after - before) / SCENES)
    assert not by[("GenComm (m2 onboarded)", "+m2", "epoch_1")]["significant_every_seed"]  # adds nothing
    # the report: the selected weights' table, the verdict, GenComm's epochs with the selected epoch named
    assert "### What the camera adds (equalized)" in report
    assert "| BackAlign (m2 onboarded) | **+0.500 [" in report
    assert "Significant in every seed: +m2 adds to BackAlign (m2 onboarded)" in report
    assert "#### GenComm (m2 onboarded) at every scored onboarding epoch (equalized)" in report
    assert "The selected weights are from epoch seed 0: 2, seed 1: 2." in report
    line = next(ln for ln in report.splitlines() if ln.startswith("| 1 | "))
    assert line.startswith("| 1 | 0.500 ± 0.000 | +0.000 [+0.00, +0.00]; +0.000, +0.000 |")
    assert next(ln for ln in report.splitlines() if ln.startswith("| 3 | ")).startswith("| 3 | 0.600 ± 0.000 | ")


def test_bad_epochs_field_names_the_file(tmp_path):
    folder = _archives(tmp_path)[0]
    doc = json.loads((folder / "rows.json").read_text())
    gen = next(b for b in doc["benchmark"] if b["method"].startswith("GenComm"))
    gen["epochs"]["last"] = gen["epochs"].pop("2")
    (folder / "rows.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"seed0/rows.json: key 'benchmark\.\d\.epochs': has key 'last'"):
        load_archive(folder)
    gen["epochs"] = {"2": []}
    (folder / "rows.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"rows.json: key 'benchmark\.\d\.epochs\.2': is empty"):
        load_archive(folder)
