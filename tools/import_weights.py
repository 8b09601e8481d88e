#!/usr/bin/env python
"""``python tools/import_weights.py ...`` from a checkout runs ``gencomm-import-weights`` (see :mod:`gencomm.cli`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gencomm.cli import import_weights as main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
