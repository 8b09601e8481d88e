#!/usr/bin/env python
"""``python tools/formation.py ...`` from a checkout: the cooperative-path table (see :mod:`experiments.formation`)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.formation import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
