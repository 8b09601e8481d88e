#!/usr/bin/env python
"""``python tools/learning_curves.py ...`` from a checkout runs ``gencomm-curves`` (see :mod:`experiments.curves`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.curves_run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
