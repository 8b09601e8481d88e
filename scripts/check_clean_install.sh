#!/usr/bin/env bash
# Packaging check (issue 33): a clean venv outside the checkout, `pip install .` without spconv, then
# with requirements.txt, then the main job's smoke profile from the installed wheel.
#   bash scripts/check_clean_install.sh [WORKDIR]      (default /tmp/gencomm_clean_install)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-/tmp/gencomm_clean_install}"
rm -rf "$WORK" && mkdir -p "$WORK/run"
cd "$WORK/run"
python3.11 -m venv "$WORK/venv"
BIN="$WORK/venv/bin"
"$BIN/pip" install -q torch==2.13.0            # the CPU wheel; a GPU machine installs its own build first
"$BIN/pip" install -q "$REPO"
echo "== without spconv"
"$BIN/gencomm-sim" --help | head -3
"$BIN/gencomm-train" -y opv2v_h/gencomm_stage1_m1 --dry_run
set +e; "$BIN/gencomm-train" -y opv2v_h/gencomm_stage1_m3 --dry_run; rc=$?; set -e
echo "SECOND dry run without spconv: exit $rc (2 expected)"; [ "$rc" -eq 2 ]
echo "== with requirements.txt"
"$BIN/pip" install -q -r "$REPO/requirements.txt"
"$BIN/gencomm-train" -y opv2v_h/gencomm_stage1_m3 --dry_run
start=$(date +%s)
"$BIN/gencomm-reproduce" --quick --out results --data data/sim > log.txt 2>&1
echo "gencomm-reproduce --quick: exit 0 in $(( $(date +%s) - start )) s; report: $WORK/run/results/REPORT.md"
