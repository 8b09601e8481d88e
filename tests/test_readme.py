"""README.md stays a newcomer's page (issue 51): at most 330 lines, the two commands that work on a
fresh machine and nothing else in that block, and the fair benchmark's full tables kept out of it (they
are generated into archive/fair_benchmark/README.md and docs/results.md; the generated headline's
freshness is tests/experiments/test_fair_readme.py's, every relative link's test_results_doc.py's)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES = 330


def test_readme_is_at_most_330_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, (f"README.md has {n} lines (at most {MAX_LINES}): move detail into docs/*.md or an "
                            "archive folder's README and link it")


def test_exactly_two_commands_work_on_a_fresh_machine():
    """The first code block under "## Two commands" holds the main job and the test suite, nothing else."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Two commands", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [ln.split("#")[0].strip() for ln in block.splitlines() if ln.split("#")[0].strip()]
    assert commands == ["bash scripts/main.sh", "bash scripts/test.sh"]
    for script in ("scripts/main.sh", "scripts/test.sh"):
        assert (REPO / script).is_file(), script


def test_full_fair_tables_are_not_in_the_readme():
    text = README.read_text(encoding="utf-8")
    assert "<!-- fair tables" not in text and "<!-- fair headline" in text
    assert "(`reference`, training seed 0)" not in text  # the reference protocol's tables live in the archive
