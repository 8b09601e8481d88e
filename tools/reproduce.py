#!/usr/bin/env python
"""``python tools/reproduce.py ...`` from a checkout runs ``gencomm-reproduce`` (:mod:`experiments.reproduce`):
the main job, from any working directory (--out and --data are relative to it)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.reproduce import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
