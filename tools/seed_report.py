#!/usr/bin/env python
"""``python tools/seed_report.py ...`` from a checkout runs ``gencomm-seed-report`` (:mod:`experiments.seeds`):

    python tools/seed_report.py archive results/results.json -o archive/main_table
    python tools/seed_report.py report archive/main_table/seed* [-o spread.md] [--json spread.json]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.seeds import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
