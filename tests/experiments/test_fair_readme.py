"""The README's fair-benchmark tables (experiments/fair_readme.py): rendered from a combined archive's
results.json alone, spliced between the README's markers only, and the committed README's block is
what the committed archive gives (so no README figure of the fair benchmark is copied by hand)."""
import json
from pathlib import Path

import pytest

from experiments.fair import write_fair_benchmark
from experiments.fair_readme import BEGIN, END, FairReadmeError, main, render, splice
from test_fair_benchmark import _archives

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def combined(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fair_readme")
    dest = tmp / "fair"
    write_fair_benchmark(_archives(tmp), dest, resamples=100)
    return dest


def _line(text, start):
    return next(ln for ln in text.splitlines() if ln.startswith(start))


def test_tables_show_spread_differences_and_budgets(combined):
    doc = json.loads((combined / "results.json").read_text())
    for r in doc["rows"]:  # the synthetic rows measured no bytes ("-"); give late fusion's seeds some
        if r["method"] == "Late fusion":
            r["eval"]["bytes_per_message"] = 405.0 + r["training_seed"]
    text = render(doc)
    cut = text.index("Main table, the LiDAR pair (`reference`")
    equalized, reference = text[:cut], text[cut:]
    # main table, seeds 0-2: late fusion 8 of 10 scenes every seed (the best), GenComm 5, 6, 7
    assert "Main table, the LiDAR pair (`equalized`, mean ± std over training seeds 0, 1, 2):" in equalized
    late = _line(equalized, "| Late fusion |")
    assert late.startswith("| Late fusion | **0.800** ± 0.000 | **0.800** ± 0.000 | **+0.200 [")
    assert late.endswith("| 576 | 10 | 100 | 406 |")  # bytes: the mean over seeds
    assert _line(equalized, "| GenComm (m3 onboarded) |").startswith("| GenComm (m3 onboarded) | 0.600 ± 0.100 | "
                                                                      "0.600 ± 0.100 | - |")
    # the benchmark: {m1} and the full alliance; GenComm's full alliance (6, 7, 8 hits) is the best
    assert "| method | {m1} AP@0.5 | {m1, m3} AP@0.5 | {m1, m3} AP@0.7 | AP@0.5 minus GenComm (m3 onboarded) |" in equalized
    back = _line(equalized, "| BackAlign (m3 onboarded) |")
    assert back.startswith("| BackAlign (m3 onboarded) | 0.100 ± 0.000 | 0.500 ± 0.000 | 0.500 ± 0.000 | **-0.200 [")
    assert back.endswith("| 288 | 5 | 10 | - |")
    assert "| GenComm (m3 onboarded) | **0.600** ± 0.100 | **0.700** ± 0.100 |" in equalized
    assert "(`equalized`, mean ± std over training seeds 0, 1, 2): m3 joins m1's alliance;" in equalized
    # BackAlign is 0.1, 0.2, 0.3 below GenComm; whether each seed's interval over 10 scenes excludes 0 is
    # results.json's to say, and the verdict line follows it
    entry = next(e for e in doc["against_gencomm"] if e["protocol"] == "equalized" and e["table"] == "heterogeneous"
                 and e["method"].startswith("BackAlign"))
    assert [v["diff"] for v in entry["diff"]["0.5"]["per_seed"].values()] == pytest.approx([-0.1, -0.2, -0.3])
    verdict = _line(equalized.split("Heterogeneous benchmark")[1], "AP@0.5 minus GenComm")
    assert 'significant in every seed on its own (each name without "(m3 onboarded)"): ' in verdict
    listed = verdict.split("): ")[1].split(". Not in every seed")[0].split("; ")
    assert ("BackAlign" in listed) == entry["diff"]["0.5"]["significant_every_seed"]
    assert "No fusion (m1 stage-1 model)" in listed or verdict.endswith("No fusion (m1 stage-1 model).")
    # one seed: values without a spread, and the verdict says no spread was measured
    assert "Main table, the LiDAR pair (`reference`, training seed 0):" in reference
    assert _line(reference, "| No fusion |").startswith("| No fusion | 0.400 | 0.400 | ")
    assert "± " not in reference and "one training seed: no run-to-run spread is measured" in reference
    # the same document renders the same bytes
    assert render(doc) == text


def test_splice_rewrites_only_the_block_and_names_the_file():
    text = f"intro\n{BEGIN}\nold table\n{END}\noutro\n"
    assert splice(text, "\nnew\n") == f"intro\n{BEGIN}\n\nnew\n\n{END}\noutro\n"
    for bad in ("no markers\n", f"{END}\n{BEGIN}\n", f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n"):
        with pytest.raises(FairReadmeError, match="README.md: needs exactly one line"):
            splice(bad, "x", "README.md")


def test_cli_writes_checks_and_rejects_bad_input(combined, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n{BEGIN}\nhand-copied numbers\n{END}\nprose\n")
    args = ["--archive", str(combined), "--readme", str(readme)]
    assert main(args + ["--check"]) == 1 and "hand-copied" in readme.read_text()  # --check writes nothing
    assert main(args) == 0
    written = readme.read_text()
    assert "hand-copied" not in written and written.endswith(f"{END}\nprose\n") and "| Late fusion |" in written
    assert main(args + ["--check"]) == 0
    # a results.json from before the field existed: one line naming the file and the field, README untouched
    old = tmp_path / "old"
    old.mkdir()
    doc = json.loads((combined / "results.json").read_text())
    del doc["against_gencomm"]
    (old / "results.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["--archive", str(old), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err
    assert str(old / "results.json") in err and "against_gencomm" in err and readme.read_text() == written
    assert main(["--archive", str(tmp_path / "missing"), "--readme", str(readme)]) == 2


def test_the_readme_shows_the_committed_fair_archive():
    doc = json.loads((ROOT / "archive" / "fair_benchmark" / "results.json").read_text())
    readme = (ROOT / "README.md").read_text()
    assert splice(readme, render(doc)) == readme, "README's fair tables are stale: run python tools/fair_readme.py"
