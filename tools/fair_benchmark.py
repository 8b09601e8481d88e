#!/usr/bin/env python
"""``python tools/fair_benchmark.py ...`` from a checkout runs ``gencomm-fair-benchmark`` (:mod:`experiments.fair`):

    python tools/fair_benchmark.py results/seeds/seed0 results/seeds/seed1 results/seeds/seed2 \
        results_reference/seeds/seed0 -o archive/fair_benchmark
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.fair import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
