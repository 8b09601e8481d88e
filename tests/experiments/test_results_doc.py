"""docs/results.md is generated from the committed archives (experiments/results_doc.py): the committed
file equals a fresh generation, bad archives are one-line errors with exit 2, and a small archive renders
with its links pointed into the archive. Also: every relative link in README.md, docs/*.md and
archive/**/README.md resolves."""
import json
import re
import shutil
from pathlib import Path

import pytest

from experiments.results_doc import BANNER, main, render

REPO = Path(__file__).resolve().parents[2]
SEED_ARCHIVE = REPO / "archive" / "main_table" / "seed1"


def test_committed_results_doc_is_fresh():
    """Nobody edits docs/results.md by hand and forgets to regenerate it (rendered in memory for the
    committed path, since links are relative to it)."""
    committed_path = REPO / "docs" / "results.md"
    fresh = render(REPO / "archive", committed_path)
    committed = committed_path.read_text(encoding="utf-8")
    assert fresh.startswith(BANNER + "\n")
    assert committed == fresh, "docs/results.md is stale: run python tools/results_doc.py"


def _fake_archive(root: Path) -> Path:
    """archive/run_a: a README, a REPORT with a kept image, a missing image and a missing link."""
    folder = root / "archive" / "run_a"
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("# Run A on tiny data\n\nMade by `cmd`. See [the report](REPORT.md).\n\n"
                                      "## What it shows\n\nLate fusion wins.\n\n```bash\n# a comment, not a heading "
                                      "[x](nowhere.png)\n```\n")
    (folder / "REPORT.md").write_text("# Report\n\n| method | AP |\n|---|---|\n| a | 0.5 [0.4, 0.6] |\n\n"
                                      "![kept](plot.png) ![gone](missing.png) [row](runs/x/pr.png) "
                                      "[web](https://example.org/a)\n")
    (folder / "plot.png").write_bytes(b"\x89PNG")
    return root / "archive"


def test_small_archive_renders(tmp_path):
    root = _fake_archive(tmp_path)
    out = tmp_path / "docs" / "results.md"
    assert main(["--archive", str(root), "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith(BANNER + "\n")
    assert "## Run A on tiny data" in text and "### What it shows" in text
    assert "#### Report" in text and "| a | 0.5 [0.4, 0.6] |" in text
    assert "![kept](../archive/run_a/plot.png)" in text
    assert "(gone: figure not kept in the archive)" in text and "missing.png" not in text
    assert " row " in text and "runs/x/pr.png" not in text
    assert "[web](https://example.org/a)" in text
    assert "[the report](../archive/run_a/REPORT.md)" in text
    assert "# a comment, not a heading [x](nowhere.png)" in text  # code blocks are left alone
    assert render(root, out) == text  # deterministic


def test_seed_archives_get_the_spread_section(tmp_path):
    root = tmp_path / "archive"
    (root / "seeds_run").mkdir(parents=True)
    (root / "seeds_run" / "README.md").write_text("# Two seeds\n")
    for s in (1, 2):
        dest = root / "seeds_run" / f"seed{s}"
        shutil.copytree(SEED_ARCHIVE, dest)
        doc = json.loads((dest / "rows.json").read_text())
        doc["seed"] = s
        (dest / "rows.json").write_text(json.dumps(doc))
    text = render(root, tmp_path / "results.md", resamples=20)
    assert "### Spread over training seeds (seed1, seed2), recomputed from `archive/seeds_run/seed*`" in text
    assert "`archive/seeds_run/seed1`" in text and str(tmp_path) not in text


def test_missing_readme_is_a_one_line_error(tmp_path, capsys):
    root = _fake_archive(tmp_path)
    (root / "run_b").mkdir()
    assert main(["--archive", str(root), "-o", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "run_b" in err and "README.md" in err
    assert not (tmp_path / "r.md").exists()


def test_missing_archive_root_exits_2(tmp_path, capsys):
    assert main(["--archive", str(tmp_path / "nope"), "-o", str(tmp_path / "r.md")]) == 2
    assert "nope" in capsys.readouterr().err


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", ["README.md"] + sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))
                         + sorted(p.relative_to(REPO).as_posix() for p in (REPO / "archive").glob("**/README.md")))
def test_relative_links_resolve(doc):
    """Every relative link of README.md, docs/*.md and the archive folders' READMEs (outside code blocks)
    names an existing file (the README's moved sections link into docs/ and archive/)."""
    path = REPO / doc
    broken, code = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            code = not code
            continue
        for target in ([] if code else _LINK.findall(line)):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            if not (path.parent / target.split("#")[0]).exists():
                broken.append(f"{doc}:{n}: {target}")
    assert not broken, broken
