#!/usr/bin/env python
"""``python tools/bench.py ...`` from a checkout runs ``gencomm-bench`` (see :mod:`experiments.bench.cli`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.bench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
