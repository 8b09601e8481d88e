#!/usr/bin/env bash
# Idempotent set-up: .venv with the pinned CPU stack, the package in editable
# mode, Debian's libusb (open3d needs it at import). Fast when already done:
# a stamp file records the hash of the requirement files it installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.setup-stamp
want=$(cat setup.py requirements.txt requirements-test.txt | sha256sum | cut -d' ' -f1)

if ! ldconfig -p 2>/dev/null | grep -q 'libusb-1.0.so'; then
  echo "[setup] installing Debian package libusb-1.0-0 (open3d needs it)"
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q libusb-1.0-0 >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q libusb-1.0-0 >/dev/null; })
  else
    sudo apt-get install -y -q libusb-1.0-0 >/dev/null
  fi
fi

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup] creating .venv and installing the pinned stack (first run only, a few minutes)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -r requirements.txt -r requirements-test.txt
.venv/bin/python -m pip install -q --no-deps -e .
echo "$want" > "$stamp"
echo "[setup] done"
