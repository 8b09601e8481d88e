#!/usr/bin/env python
"""``python tools/results_doc.py [--archive archive] [-o docs/results.md]`` from a checkout runs
:mod:`experiments.results_doc`: docs/results.md regenerated from the committed archives alone."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.results_doc import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
