#!/usr/bin/env python
"""Training seeds of the main table, kept across invocations (gencomm.seeds):

    python tools/seed_report.py archive results/results.json -o archive/main_table
    python tools/seed_report.py report archive/main_table/seed* [-o spread.md] [--json spread.json]

``archive`` stores one seed's main-table rows and per-frame records (the main job already does it,
into ``<out>/seeds``); ``report`` prints every row's AP per seed with mean and standard deviation,
the paired differences against GenComm per seed and pooled, what cooperation adds, and which
claims hold in every seed.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gencomm.seeds import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
