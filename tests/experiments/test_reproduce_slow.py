"""The main job's --quick profile end to end (slow: simulates, trains the main table's models and the four
stage-1 types, onboards m2, m3, m4 by every method, evaluates; about 10 min)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(2700)  # three invocations: about 13 min on an idle 2-core CPU, over the suite's 900 s when busy
def test_quick_reproduction_end_to_end(tmp_path):
    out, data = tmp_path / "results", tmp_path / "data"
    proc = subprocess.run([sys.executable, "tools/reproduce.py", "--quick", "--out", str(out), "--data", str(data)],
                          cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = (out / "REPORT.md").read_text()
    for method in ("No fusion", "Late fusion", "Early fusion", "Intermediate (full feature)", "GenComm"):
        assert method in report
    assert (out / "ap_vs_bytes.png").stat().st_size > 0
    results = json.loads((out / "results.json").read_text())
    rows = {r["method_id"]: r for r in results["rows"] if r["table"] == "main"}  # every row states its id
    hetero = {r["method_id"]: r for r in results["rows"] if r["table"] == "heterogeneous"}
    assert list(rows) == ["no_fusion", "late", "early", "intermediate", "gencomm"]
    assert set(hetero) == {"gencomm", "backalign", "stamp", "mpda", "mpda_fusion_head", "codefilling",
                           "none_of_stage1", "late_of_stage1"}
    for name, r in hetero.items():
        assert [d["types"] for d in r["dynamic"]] == [["m1"], ["m1", "m2"], ["m1", "m2", "m3"], ["m1", "m2", "m3", "m4"]]
        assert r["eval"]["ap_ci"]["global"].keys() == r["eval"]["ap"]["global"].keys(), name
        assert isinstance(r["trainable_params"], int)
    assert hetero["gencomm"]["trainable_params"] == 3 * 103156  # one message extractor per new type
    assert hetero["backalign"]["trainable_params"] > hetero["stamp"]["trainable_params"] > hetero["gencomm"][
        "trainable_params"]
    assert 0 < hetero["codefilling"]["eval"]["bytes_per_message"] < hetero["stamp"]["eval"]["bytes_per_message"]
    assert "## Heterogeneous benchmark" in report and (out / "hetero_costs.png").stat().st_size > 0
    assert [st["step"] for st in results["steps"]][:2] == ["simulate", "simulate the test set"]
    # every table evaluates on the separate test set (the quick profile's 2 one-frame scenes), not data/test
    test_root = Path(results["test_data"])
    assert test_root == data.with_name(data.name + "_test") and sorted(p.name for p in test_root.iterdir()
                                                                      if p.is_dir()) == [".gencomm_sim", "test"]
    for r in [*rows.values(), *hetero.values()]:
        assert (r["eval"]["num_scenes"], r["eval"]["frames"]) == (2, 2), r["method"]
    assert rows["no_fusion"]["eval"]["bytes_per_message"] == 0
    gen = rows["gencomm"]
    full = rows["intermediate"]
    assert 0 < gen["eval"]["bytes_per_message"] * 64 <= full["eval"]["bytes_per_message"] * 1.01
    assert results["onboarding"]["trainable_params_per_new_type"]["m3"] == gen["trainable_params"]
    assert gen["ego_only"]["bytes_per_message"] == 0 and gen["ego_only"]["fusion"] == "none"
    # the robustness step: every method row at no channel effect and at the largest level of each
    rob = json.loads((out / "robustness" / "robustness.json").read_text())
    assert [r["label"] for r in rob["runs"]] == [r["method"] for r in rows.values()]
    assert {k: e["levels"] for k, e in rob["effects"].items()} == {"noise": [0, 0.6], "latency": [0, 3], "drop": [0, 1]}
    assert all(p["reused"] for e in rob["effects"].values() for ps in e["results"].values() for p in ps[:1])
    assert "## Robustness: pose noise, latency and message loss" in report
    assert (out / "robustness" / "robustness.png").stat().st_size > 0
    # a second run finds everything done and only re-evaluates
    again = subprocess.run([sys.executable, "tools/reproduce.py", "--quick", "--out", str(out), "--data", str(data)],
                           cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert again.returncode == 0, again.stderr[-4000:]
    # every seed leaves an archive; a seed added by a later invocation joins the report's spread
    assert results["seed_archives"] == [str(out / "seeds" / "seed0")]
    assert "Run-to-run spread" not in report  # one seed has no spread
    more = subprocess.run([sys.executable, "tools/reproduce.py", "--quick", "--out", str(out), "--data", str(data),
                           "--seeds", "1", "--no_benchmark", "--no_robustness"],
                          cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert more.returncode == 0, more.stderr[-4000:]
    assert (out / "runs" / "seed1" / "m1_none" / "config.yaml").is_file()  # not seed 0's runs resumed
    results = json.loads((out / "results.json").read_text())
    assert results["seed_archives"] == [str(out / "seeds" / "seed0"), str(out / "seeds" / "seed1")]
    assert [e["method"] for e in results["seed_spread"]] == [r["method"] for r in rows.values()]
    report = (out / "REPORT.md").read_text()
    assert "## Run-to-run spread over training seeds" in report and "Training seeds 0, 1" in report
    assert "This sweep comes from an earlier invocation" in report  # seed 0's sweep, seed 1's table
