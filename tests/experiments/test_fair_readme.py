"""The fair benchmark's generated blocks (experiments/fair_readme.py): the full tables (into the
archive's README) and the top-level README's short headline, rendered from a combined archive's
results.json alone, spliced between their markers only, and the committed README's and archive README's
blocks are what the committed archive gives (so no figure of the fair benchmark is copied by hand)."""
import json
from pathlib import Path

import pytest

from experiments.fair import write_fair_benchmark
from experiments.fair_readme import (BEGIN, END, HEADLINE_BEGIN, HEADLINE_END, FairReadmeError, main, render,
                                     render_headline, splice)
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
    # the headline's markers are their own: the tables' markers do not stand in for them
    both = f"a\n{HEADLINE_BEGIN}\nold\n{HEADLINE_END}\n{BEGIN}\nkept\n{END}\n"
    assert (splice(both, "new", "R", HEADLINE_BEGIN, HEADLINE_END)
            == f"a\n{HEADLINE_BEGIN}\nnew\n{HEADLINE_END}\n{BEGIN}\nkept\n{END}\n")
    with pytest.raises(FairReadmeError, match="R: needs exactly one line '<!-- fair headline"):
        splice(text, "x", "R", HEADLINE_BEGIN, HEADLINE_END)


def test_headline_is_short_and_names_every_row(combined):
    doc = json.loads((combined / "results.json").read_text())
    text = render_headline(doc)
    assert len(text.splitlines()) <= 15  # a headline, not the tables
    # the protocol with the most seeds only, its main table, and a link to where the tables are
    assert "under `equalized` (mean ± std over training seeds 0, 1, 2;" in text and "`reference`" not in text
    assert "[archive/fair_benchmark](archive/fair_benchmark/README.md)" in text
    assert "| main table, the LiDAR pair | AP@0.5 | AP@0.7 | AP@0.5 minus GenComm (m3 onboarded) | bytes / message |" \
        in text
    late = _line(text, "| Late fusion |")
    assert late.startswith("| Late fusion | **0.800** ± 0.000 | **0.800** ± 0.000 | **+0.200 [")
    assert _line(text, "| GenComm (m3 onboarded) |").endswith("| - | - |")  # the synthetic rows measured no bytes
    # the benchmark in one paragraph: GenComm's full alliance, each row against it, the every-seed verdict
    bench = _line(text, "Heterogeneous benchmark (m3 joins m1's alliance), {m1, m3} AP@0.5")
    assert "GenComm 0.700 ± 0.100; BackAlign 0.500 ± 0.000, **-0.200 [" in bench
    assert "Significant in every seed on its own: " in bench
    assert render_headline(doc, "x/README.md").count("(x/README.md)") == 1
    assert render_headline(doc) == text


def test_cli_writes_checks_and_rejects_bad_input(combined, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n{HEADLINE_BEGIN}\nhand-copied headline\n{HEADLINE_END}\nprose\n")
    tables = tmp_path / "TABLES.md"
    tables.write_text(f"# Archive\n{BEGIN}\nhand-copied numbers\n{END}\nnotes\n")
    args = ["--archive", str(combined), "--readme", str(readme), "--archive_readme", str(tables)]
    assert main(args + ["--check"]) == 1 and "hand-copied" in readme.read_text()  # --check writes nothing
    assert "hand-copied" in tables.read_text()
    assert main(args) == 0
    written, written_tables = readme.read_text(), tables.read_text()
    assert "hand-copied" not in written and written.endswith(f"{HEADLINE_END}\nprose\n")
    assert "| Late fusion |" in written and "(TABLES.md)" in written  # the link: relative to the README
    assert "hand-copied" not in written_tables and written_tables.endswith(f"{END}\nnotes\n")
    assert "| BackAlign (m3 onboarded) |" in written_tables and "Main table, the LiDAR pair" in written_tables
    assert main(args + ["--check"]) == 0
    # one stale block is enough for --check to fail
    tables.write_text(written_tables.replace("| Late fusion |", "| Late fusion (edited) |"))
    assert main(args + ["--check"]) == 1
    tables.write_text(written_tables)
    # a README without the headline markers: one line naming it, and neither file written
    readme.write_text("# Title\nno markers\n")
    tables.write_text(f"{BEGIN}\nold\n{END}\n")
    capsys.readouterr()
    assert main(args) == 2
    assert str(readme) in capsys.readouterr().err and tables.read_text() == f"{BEGIN}\nold\n{END}\n"
    readme.write_text(written)
    tables.write_text(written_tables)
    # a results.json from before the field existed: one line naming the file and the field, README untouched
    old = tmp_path / "old"
    old.mkdir()
    doc = json.loads((combined / "results.json").read_text())
    del doc["against_gencomm"]
    (old / "results.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["--archive", str(old), "--readme", str(readme), "--archive_readme", str(tables)]) == 2
    err = capsys.readouterr().err
    assert str(old / "results.json") in err and "against_gencomm" in err and readme.read_text() == written
    assert main(["--archive", str(tmp_path / "missing"), "--readme", str(readme)]) == 2


def test_the_readme_shows_the_committed_fair_archive():
    """The committed README's headline and the archive README's tables are what the committed results.json
    gives: this fails when either is edited by hand or not regenerated after a new combination."""
    doc = json.loads((ROOT / "archive" / "fair_benchmark" / "results.json").read_text())
    readme = (ROOT / "README.md").read_text()
    assert splice(readme, render_headline(doc), "README.md", HEADLINE_BEGIN, HEADLINE_END) == readme, \
        "README's fair headline is stale: run python tools/fair_readme.py"
    archive_readme = (ROOT / "archive" / "fair_benchmark" / "README.md").read_text()
    assert splice(archive_readme, render(doc)) == archive_readme, \
        "archive/fair_benchmark/README.md's fair tables are stale: run python tools/fair_readme.py"
    assert BEGIN not in readme, "the full tables belong in the archive's README, not the top-level one"
