#!/usr/bin/env python
"""``python tools/onboard.py ...`` from a checkout runs ``gencomm-onboard``: :mod:`opencood_ext.cli.onboard`
with the GenComm method registered (see :mod:`gencomm.cli`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gencomm.cli import onboard as main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
