#!/usr/bin/env python
"""``python tools/onboard.py ...`` from a checkout runs ``gencomm-onboard`` (:mod:`gencomm.cli.onboard`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gencomm.cli.onboard import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
