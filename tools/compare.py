#!/usr/bin/env python
"""``python tools/compare.py RUN_A[:LABEL] RUN_B[:LABEL] ...`` from a checkout runs
:mod:`opencood_ext.cli.compare` (AP with 95% scene-bootstrap intervals, paired differences)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from opencood_ext.cli.compare import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
