#!/usr/bin/env bash
# Finds a python3 that can import `websockets` 15 or later, for examples/python/replica_client.py
# and its test (tests/python_client.rs). The system's python3 when it can; otherwise a venv under
# <repo>/target/python-kit (or DIR) with `websockets` installed from PyPI by pip. Idempotent.
# Prints the interpreter's path on stdout; on failure says what is missing on stderr and exits 1.
#
# Usage: scripts/install-python-websockets.sh [DIR]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/target/python-kit}"
CHECK='import sys, websockets; sys.exit(int(websockets.version.version.split(".")[0]) < 15)'

if ! command -v python3 >/dev/null 2>&1; then
  echo "python3 is missing: install Python 3.9 or later (apt-get install python3 python3-venv)" >&2
  exit 1
fi
if python3 -c "$CHECK" 2>/dev/null; then
  command -v python3
  exit 0
fi
if [[ -x "$DIR/bin/python3" ]] && "$DIR/bin/python3" -c "$CHECK" 2>/dev/null; then
  echo "$DIR/bin/python3"
  exit 0
fi
echo "installing websockets into the venv $DIR" >&2
rm -rf "$DIR"
if ! python3 -m venv "$DIR" >&2; then
  echo "python3 cannot make a venv: install python3-venv (apt-get install python3-venv)" >&2
  exit 1
fi
if ! "$DIR/bin/python3" -m pip install --quiet --disable-pip-version-check "websockets>=15" >&2; then
  echo "pip could not install websockets>=15 from PyPI into $DIR (no network?)" >&2
  exit 1
fi
"$DIR/bin/python3" -c "$CHECK"
echo "$DIR/bin/python3"
