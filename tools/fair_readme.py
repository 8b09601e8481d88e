#!/usr/bin/env python
"""``python tools/fair_readme.py [--archive archive/fair_benchmark] [--readme README.md] [--check]`` from a
checkout runs :mod:`experiments.fair_readme`: the fair benchmark's tables (into the archive's README) and
the README's headline, regenerated from the combined archive's results.json (between each file's marker
lines only)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.fair_readme import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
