#!/usr/bin/env python
"""``python tools/robustness.py ...``: the robustness sweep (:mod:`opencood_ext.cli.robustness`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gencomm  # noqa: E402,F401  (registers the GenComm link, so GenComm runs load)
from opencood_ext.cli.robustness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
