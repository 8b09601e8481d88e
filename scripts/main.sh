#!/usr/bin/env bash
# The README's main job: set-up when missing, then the whole story on the
# embedded default (simulate, train, onboard, evaluate, results/REPORT.md).
# Extra arguments go to tools/reproduce.py (e.g. --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python tools/reproduce.py "$@"
